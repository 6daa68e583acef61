"""The CUTLASS sm90a family's launch cache re-points its TMA descriptors right.

A library keeps, per thread, the launch parameters of its last few problems and, on a call
with new operands, re-points their TMA descriptors (and the direct epilogue's D pointer)
instead of encoding them again (templates/sm90_gemm.cu.j2). Here one library at a time is
called with 3 sets of fresh operands and 2 shapes in turn, every mix of old and new
addresses among A, B and C, each output NaN-poisoned first and checked against torch: a
stale descriptor reads the wrong operand or writes the wrong output, and fails. Then more
shapes than the cache holds, twice round, and the dispatcher's served path on fresh
tensors. Needs nvcc, CUTLASS headers, torch and an sm90 GPU; skips cleanly without them.

Run on a GPU machine: ``python -m pytest tests/gpu/test_launch_cache.py -v``.
"""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")

from l2gen.ir import BLayout  # noqa: E402
from l2gen.parse import parse  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="torch has no CUDA device"),
]

MAX_RELERR = 1e-3

# The paths of the cache: the epilogue's TMA store descriptor with a cluster launch and
# stream-K's workspace; the direct epilogue's D pointer with B stored N x K.
PROGRAMS = [
    """kernel cache_tma_streamk {
    arch      sm90a
    b         kn
    tile      128 x 128 x 64
    cluster   2 x 1 x 1
    mainloop  cooperative
    epilogue  tma
    scheduler stream_k
    splits    2
    decomposition split_k
}""",
    """kernel cache_direct_nk {
    arch      sm90a
    b         nk
    tile      64 x 128 x 64
    cluster   1 x 2 x 1
    mainloop  pingpong
    epilogue  direct
}""",
]
SHAPES = [(200, 256, 512), (64, 384, 1024)]
MORE_SHAPES = [(8, 64, 64), (96, 128, 256), (130, 256, 128), (256, 512, 64), (17, 136, 200), (64, 64, 4096)]


@pytest.fixture(scope="module")
def libraries(gpu):
    if gpu.sm < 90:
        pytest.skip("the sm90a family needs an sm90 GPU")
    from l2gen.build import build_many
    from l2gen.lower import build_program, lower
    from l2gen.runtime import Library

    programs = [parse(text) for text in PROGRAMS]
    sources = [lower(build_program(p), gpu) for p in programs]
    results = build_many(sources)
    failed = [f"{r.source.program.name}: {r.error}" for r in results if not r.ok]
    assert not failed, failed
    return [(p, Library.load(r.library, s.entry)) for p, s, r in zip(programs, sources, results)]


def operands(m, n, k, layout, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn((m, k), device="cuda", dtype=torch.float16, generator=g)
    shape_b = (n, k) if layout is BLayout.NK else (k, n)
    b = torch.randn(shape_b, device="cuda", dtype=torch.float16, generator=g) / k**0.5
    return a, b


def reference(a, b, layout):
    return a.float() @ (b.float().t() if layout is BLayout.NK else b.float())


def relerr(c, ref) -> float:
    return float((c.float() - ref).norm() / ref.norm().clamp_min(1e-30))


class Calls:
    """Launches of one library on torch's current stream, each output poisoned and checked."""

    def __init__(self, program, lib):
        self.program, self.lib = program, lib
        self.layout = program.b_layout
        self.knobs = program.knobs
        self.workspaces: dict = {}
        self.failures: list[str] = []
        self.count = 0

    def workspace(self, m, n, k):
        if (m, n, k) not in self.workspaces:
            nbytes = self.lib.workspace_size(m, n, k, self.knobs)
            buf = torch.zeros(max(nbytes, 16), dtype=torch.uint8, device="cuda") if nbytes else None
            self.workspaces[(m, n, k)] = (buf, nbytes)
        return self.workspaces[(m, n, k)]

    def check(self, a, b, c, what: str) -> None:
        m, k = a.shape
        n = c.shape[1]
        ldb = k if self.layout is BLayout.NK else n
        buf, nbytes = self.workspace(m, n, k)
        c.fill_(float("nan"))
        stream = torch.cuda.current_stream().cuda_stream
        status = self.lib.launch(a, b, c, m, n, k, k, ldb, n, self.knobs, buf, nbytes, stream, check=False)
        self.count += 1
        if status != 0:
            self.failures.append(f"{what}: status {status}")
            return
        err = relerr(c, reference(a, b, self.layout))
        if not err <= MAX_RELERR:  # NaN (an output never written) fails too
            self.failures.append(f"{what}: relative error {err:.2e}")


@pytest.mark.parametrize("index", range(len(PROGRAMS)), ids=["tma_streamk", "direct_nk"])
def test_fresh_operands_on_two_shapes_are_re_pointed_right(libraries, index):
    program, lib = libraries[index]
    calls = Calls(program, lib)
    sets = {}
    for s, (m, n, k) in enumerate(SHAPES):
        sets[s] = [(*operands(m, n, k, calls.layout, 10 * s + i), torch.empty((m, n), device="cuda", dtype=torch.float16))
                   for i in range(3)]
    # Every choice of A, B and C among the 3 sets, the two shapes in turn: one call after
    # another changes some of the addresses, all of them, or none.
    for ia, ib, ic in itertools.product(range(3), repeat=3):
        for s in sets:
            a, b, c = sets[s][ia][0], sets[s][ib][1], sets[s][ic][2]
            calls.check(a, b, c, f"shape {SHAPES[s]} A{ia} B{ib} C{ic}")
            calls.check(a, b, c, f"shape {SHAPES[s]} A{ia} B{ib} C{ic} again")
    assert calls.count == 27 * 2 * 2
    assert not calls.failures, f"{program.name}: {len(calls.failures)} wrong of {calls.count}: {calls.failures[:5]}"


@pytest.mark.parametrize("index", range(len(PROGRAMS)), ids=["tma_streamk", "direct_nk"])
def test_more_shapes_than_the_cache_holds(libraries, index):
    program, lib = libraries[index]
    calls = Calls(program, lib)
    for rnd in range(2):
        for m, n, k in MORE_SHAPES:
            a, b = operands(m, n, k, calls.layout, rnd * 100 + m + n + k)
            calls.check(a, b, torch.empty((m, n), device="cuda", dtype=torch.float16), f"round {rnd} {m}x{n}x{k}")
    assert not calls.failures, f"{program.name}: {calls.failures[:5]}"


def test_the_dispatcher_on_fresh_tensors_every_call(gpu, libraries, tmp_path):
    from l2gen.db import KernelDB
    from l2gen.dispatch import Dispatcher, TorchLauncher, own_toolchain
    from l2gen.problem import Measurement, Shape

    with KernelDB(tmp_path / "k.db") as db:
        for program, _ in libraries:
            for m, n, k in SHAPES:
                db.add(Measurement(Shape(m, n, k), program, "ok", time_us=1.0, baseline_us=2.0, relerr=0.0), gpu, "test", own_toolchain())
        for program, _ in libraries:
            layout = program.b_layout
            d = Dispatcher(db, gpu, launcher=TorchLauncher(), verify=False, b_layout=layout)
            failures = []
            for i in range(8):
                for m, n, k in SHAPES:
                    a, b = operands(m, n, k, layout, 1000 + 7 * i + m)
                    out = None if i % 2 else torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
                    c = d(a, b, out)
                    assert d.served_by(m, n, k) == program.name
                    err = relerr(c, reference(a, b, layout))
                    if not err <= MAX_RELERR:
                        failures.append(f"call {i} {m}x{n}x{k} (out={'given' if out is not None else 'new'}): {err:.2e}")
            assert not failures, f"{program.name}: {failures[:5]}"
