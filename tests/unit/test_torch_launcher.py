"""The real launcher's per-shape launch, on the CPU: what ``TorchLauncher.bind`` hands the
library's entry is what ``Library.launch`` hands it.

The entry is a ctypes callback with the entry's prototype (``runtime._ENTRY_ARGS``), so
every argument goes through ctypes' conversions as it does into a built library, and comes
back as the C values the library would see.
"""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from l2gen.dispatch import TorchLauncher  # noqa: E402
from l2gen.ir import Decomposition, Knobs, Raster  # noqa: E402
from l2gen.runtime import _ENTRY_ARGS, Library  # noqa: E402


class RecordingLibrary:
    """A Library whose entries (E and, with ``pdl``, E_pdl) are C-callable Python functions
    that record their arguments; ``entries`` says which entry took each call."""

    def __init__(self, pdl: bool = True):
        self.calls: list[tuple] = []
        self.entries: list[str] = []
        prototype = ctypes.CFUNCTYPE(ctypes.c_int, *_ENTRY_ARGS)
        self.callback = prototype(lambda *args: self._record("E", args))  # kept alive as long as the library
        self.callback_pdl = prototype(lambda *args: self._record("E_pdl", args))
        self.library = Library.__new__(Library)  # no shared object: the entries are the callbacks
        self.library.entry = "E"
        self.library._run = self.callback
        self.library._run_pdl = self.callback_pdl if pdl else None

    def _record(self, entry: str, args: tuple) -> int:
        self.entries.append(entry)
        self.calls.append(args)
        return 0


def tensors(m, n, k, nk):
    a = torch.empty((m, k), dtype=torch.float16)
    b = torch.empty((n, k) if nk else (k, n), dtype=torch.float16)
    return a, b, torch.empty((m, n), dtype=torch.float16)


@pytest.fixture(params=["helper", "direct"])
def call_path(request, monkeypatch):
    """Each bound launch twice: through the bound-call helper (``l2gen.bound``; skipped where
    it cannot be built) and through the entry itself, as where the helper is missing."""
    from l2gen import bound

    if request.param == "direct":
        monkeypatch.setattr(bound, "caller", lambda: None)
    elif bound.caller() is None:
        pytest.skip("the bound-call helper cannot be built here (no nvcc or host compiler)")
    return request.param


@pytest.mark.parametrize("nk", [False, True])
@pytest.mark.parametrize("with_workspace", [False, True])
def test_a_bound_launch_passes_the_entry_what_library_launch_passes(nk, with_workspace, monkeypatch, call_path):
    rec = RecordingLibrary()
    launcher = TorchLauncher()
    monkeypatch.setattr(launcher, "stream", lambda like: 0x7F00DEAD)
    m, n, k = 64, 256, 512
    ldb = k if nk else n
    knobs = Knobs(raster=Raster.ALONG_N, swizzle=2, splits=3, decomposition=Decomposition.SPLIT_K, grid=96)
    a, b, c = tensors(m, n, k, nk)
    buf = torch.zeros(4096, dtype=torch.uint8) if with_workspace else None
    workspace = (buf, 4096, buf.data_ptr()) if with_workspace else (None, 0, None)
    run = launcher.bind(rec.library, m, n, k, ldb, knobs)
    for _ in range(2):  # the constant arguments, converted once, serve every call
        assert run(a, b, c, workspace, 0x7F00DEAD) == 0
    rec.library.launch(a, b, c, m, n, k, k, ldb, n, knobs, buf, workspace[1], 0x7F00DEAD, check=False)
    assert launcher.launch(rec.library, a, b, c, m, n, k, ldb, knobs, workspace) == 0
    expected = (a.data_ptr(), b.data_ptr(), c.data_ptr(), m, n, k, k, ldb, n, 2, 2, 3, 2, 96,
                buf.data_ptr() if with_workspace else None, workspace[1], 0x7F00DEAD)
    assert rec.calls == [expected] * 4


def test_each_call_passes_its_own_addresses(call_path):
    rec = RecordingLibrary()
    run = TorchLauncher().bind(rec.library, 8, 8, 8, 8, Knobs())
    sets = [tensors(8, 8, 8, False) for _ in range(3)]
    for a, b, c in sets:
        run(a, b, c, (None, 0, None), 0)
    assert [call[:3] for call in rec.calls] == [(a.data_ptr(), b.data_ptr(), c.data_ptr()) for a, b, c in sets]


def test_each_call_passes_its_own_stream_and_workspace(call_path):
    """A bound launch serves every stream with that stream's workspace, and a call that
    brings another workspace on a stream (each call captured into a CUDA graph does) gets
    that one, not the one bound before."""
    rec = RecordingLibrary()
    run = TorchLauncher().bind(rec.library, 8, 8, 8, 8, Knobs(splits=2))
    a, b, c = tensors(8, 8, 8, False)
    bufs = [torch.zeros(64 * (i + 1), dtype=torch.uint8) for i in range(3)]
    spaces = [(buf, buf.numel(), buf.data_ptr()) for buf in bufs]
    calls = [(spaces[0], 0x1000), (spaces[1], 0x2000), (spaces[0], 0x1000), (spaces[2], 0x1000), (spaces[1], 0x2000)]
    for workspace, stream in calls:
        assert run(a, b, c, workspace, stream) == 0
    assert [call[14:] for call in rec.calls] == [(w[2], w[1], stream) for w, stream in calls]


def test_constant_args_are_ctypes_integers_in_abi_order():
    args = Library.constant_args(1, 2, 3, 4, 5, 6, Knobs(raster=Raster.ALONG_M, swizzle=1, splits=7, grid=64))
    assert all(type(x) is ctypes.c_int for x in args)
    assert [x.value for x in args] == [1, 2, 3, 4, 5, 6, 1, 1, 7, 0, 64]


def test_empty_is_like_its_model():
    like = torch.empty((3, 5), dtype=torch.float16)
    out = TorchLauncher().empty(like, 64, 24)
    assert out.shape == (64, 24) and out.dtype is torch.float16 and out.device == like.device
    assert out.is_contiguous() and not out.requires_grad
    like = torch.empty((2, 4, 5), dtype=torch.float16)  # A's leading dimensions are C's
    out = TorchLauncher().empty(like, 8, 24)
    assert out.shape == (2, 4, 24) and out.dtype is torch.float16 and out.is_contiguous()


def test_the_stream_comes_from_torchs_raw_accessor_where_there_is_one(monkeypatch):
    asked = []
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: asked.append(index) or 4242, raising=False)
    assert TorchLauncher().stream(torch.empty(1)) == 4242 and asked == [-1]


def test_without_the_raw_accessor_the_stream_comes_from_a_stream_object(monkeypatch):
    monkeypatch.delattr(torch._C, "_cuda_getCurrentRawStream", raising=False)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda index: SimpleNamespace(cuda_stream=1000 + index))
    assert TorchLauncher().stream(torch.empty(1)) == 999


def test_cpu_tensors_are_not_eligible():
    a, b, c = tensors(8, 8, 8, False)
    assert not TorchLauncher().eligible(a, b, c)


@pytest.mark.parametrize("pdl", [False, True])
def test_the_pdl_knob_picks_the_entry_and_passes_the_same_arguments(pdl, call_path):
    rec = RecordingLibrary()
    launcher = TorchLauncher()
    knobs = Knobs(splits=2, pdl=pdl)
    a, b, c = tensors(16, 64, 128, True)
    run = launcher.bind(rec.library, 16, 64, 128, 128, knobs)
    run(a, b, c, (None, 0, None), 0)
    rec.library.launch(a, b, c, 16, 64, 128, 128, 128, 64, knobs, None, 0, 0)
    assert rec.entries == ["E_pdl" if pdl else "E"] * 2
    assert rec.calls[0] == rec.calls[1]
    assert rec.calls[0][9:13] == (0, 0, 2, 0)  # the knobs' integers: pdl is not one of them


def test_the_bound_record_is_the_helpers():
    """The helper loaded (its record's size is the ctypes mirror's, which the loader
    compares), and a record takes exactly the ABI's integers."""
    from l2gen import bound

    if bound.caller() is None:
        pytest.skip("the bound-call helper cannot be built here (no nvcc or host compiler)")
    assert ctypes.sizeof(bound.Bound) == 80  # entry, 11 ints (+4 padding), workspace, bytes, stream
    with pytest.raises(ValueError, match="11 integer arguments"):
        bound.bind(RecordingLibrary().callback, (1, 2, 3), None, 0, 0)


def test_pdl_on_a_library_without_the_pdl_entry_is_a_knob_error():
    from l2gen.runtime import ERR_KNOB, LaunchError

    rec = RecordingLibrary(pdl=False)
    with pytest.raises(LaunchError) as err:
        TorchLauncher().bind(rec.library, 8, 8, 8, 8, Knobs(pdl=True))
    assert err.value.status == ERR_KNOB and "L2GEN_ERR_KNOB" in str(err.value)
    assert rec.calls == []
