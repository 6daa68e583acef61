"""The dispatcher on the CPU: numpy arrays, a fake launcher, a real kernel database."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import numpy as np
import pytest

from l2gen import dispatch
from l2gen.db import KernelDB
from l2gen.dispatch import Dispatcher, bucket, default_db_path
from l2gen.ir import BLayout, Family, Mainloop, SplitK
from l2gen.problem import Measurement, Shape
from l2gen.space import assemble
from l2gen.targets import GPUS

H200, A100 = GPUS["h200"], GPUS["a100"]


def numpy_matmul(a, b, out=None):
    # B made contiguous first: BLAS may sum a transposed operand in another order, and the
    # tests compare results bit for bit.
    c = (a.astype(np.float32) @ np.ascontiguousarray(b, dtype=np.float32)).astype(np.float16)
    if out is None:
        return c
    out[...] = c
    return out


STREAM = threading.local()


def numpy_matmul_nt(a, b, out=None):
    """The reference for B stored N x K."""
    return numpy_matmul(a, b.T, out)


class FakeLauncher:
    """Runs the GEMM with numpy, reading B as the loaded program's layout and the leading
    dimension it is given say; can fail to load, return an error code, or be wrong."""

    def __init__(self, *, fail_load=False, rc=0, wrong=False, raises=False):
        self.fail_load, self.rc, self.wrong, self.raises = fail_load, rc, wrong, raises
        self.loads: list = []
        self.launches: list = []
        self.workspaces: list = []

    def load(self, program, gpu):
        self.loads.append(program)
        if self.fail_load:
            raise RuntimeError("nvcc failed")
        return ("kernel", program.name, program.b_layout)

    def workspace(self, kernel, m, n, k, knobs, like):
        self.workspaces.append((m, n, k, knobs))
        return bytearray(16)

    def stream(self, like):
        return getattr(STREAM, "id", 0)  # a test thread sets STREAM.id to play a CUDA stream

    def eligible(self, a, b, out):
        ok = a.dtype == np.float16 and b.dtype == np.float16 and a.flags.c_contiguous and b.flags.c_contiguous
        return bool(ok and (out is None or (out.dtype == np.float16 and out.flags.c_contiguous)))

    def empty(self, like, m, n):
        return np.empty((*like.shape[:-1], n), dtype=like.dtype)

    def launch(self, kernel, a, b, out, m, n, k, ldb, knobs, workspace):
        self.launches.append((kernel, m, n, k, knobs, ldb))
        if self.raises:
            raise OSError("segfault-ish")
        if self.rc:
            return self.rc
        # What the library does with B: ldb elements per row, K rows for kn, N rows for nk.
        nk = kernel[2] is BLayout.NK
        rows = b.reshape(-1)[: (n if nk else k) * ldb].reshape(-1, ldb)
        out[...] = numpy_matmul(a, rows[:, :k].T if nk else rows[:, :n])
        if self.wrong:
            out[0, 0] += 1000
        return 0

    def capturing(self):
        return False

    def relerr(self, out, ref):
        ref = ref.astype(np.float64)
        return float(np.linalg.norm(out.astype(np.float64) - ref) / max(np.linalg.norm(ref), 1e-30))


def program(bm=128, bn=128, **choices):
    return assemble(Family.SM90, dict(bm=bm, bn=bn, bk=64, **choices))


@pytest.fixture
def db(tmp_path):
    d = KernelDB(tmp_path / "k.db")
    d.add(Measurement(Shape(64, 256, 512), program(128, 128), "ok", time_us=8.0, baseline_us=10.0), H200)
    d.add(Measurement(Shape(64, 256, 512), program(128, 256, swizzle=2), "ok", time_us=9.0, baseline_us=10.0), H200)
    d.add(Measurement(Shape(128, 128, 128), program(128, 64), "ok", time_us=12.0, baseline_us=10.0), H200)  # slower
    d.add(Measurement(Shape(1024, 1024, 1024), program(256, 128), "ok", time_us=8.0, baseline_us=10.0), H200)
    nk = assemble(Family.SM90, dict(bm=128, bn=128, bk=64), b_layout=BLayout.NK)
    d.add(Measurement(Shape(32, 32, 32), nk, "ok", time_us=5.0, baseline_us=10.0), H200)
    yield d
    d.close()


def arrays(m, n, k, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((m, k)).astype(np.float16), rng.standard_normal((k, n)).astype(np.float16)


def make(db, launcher, **kw):
    kw.setdefault("fallback", numpy_matmul_nt if kw.get("b_layout") is BLayout.NK else numpy_matmul)
    return Dispatcher(db, H200, launcher=launcher, toolchain={}, **kw)


def test_exact_shape_is_served_by_its_best_program(db):
    fake = FakeLauncher()
    d = make(db, fake)
    a, b = arrays(64, 256, 512)
    c = d(a, b)
    assert np.array_equal(c, numpy_matmul(a, b))
    assert d.served_by(64, 256, 512) == program(128, 128).name
    out = np.empty((64, 256), np.float16)
    assert d(a, b, out=out) is out and np.array_equal(out, c)
    assert len(fake.loads) == 1 and len(fake.launches) == 2 and len(fake.workspaces) == 1


def test_library_is_loaded_once_per_program(db, tmp_path):
    db.add(Measurement(Shape(64, 512, 512), program(128, 128, raster="along_n"), "ok", time_us=7.0, baseline_us=10.0), H200)
    fake = FakeLauncher()
    d = make(db, fake)
    for m, n, k in ((64, 256, 512), (64, 512, 512)):
        d(*arrays(m, n, k))
    assert len(fake.loads) == 1  # knob variants share one library
    assert [l[4].raster.value for l in fake.launches] == ["heuristic", "along_n"]


def test_nearby_shape_and_fallbacks(db):
    fake = FakeLauncher()
    d = make(db, fake)
    # 1000x1000x1000 shares the 1024^3 bucket
    assert bucket(Shape(1000, 1000, 1000)) == bucket(Shape(1024, 1024, 1024))
    plan = d.plan(1000, 1000, 1000)
    assert plan is not None and not plan.exact and plan.tuned_for == Shape(1024, 1024, 1024)
    a, b = arrays(1000, 1000, 1000)
    assert np.array_equal(d(a, b), numpy_matmul(a, b))
    assert d.served_by(1000, 1000, 1000) == program(256, 128).name
    # measured on the exact shape and cuBLAS won: the fallback
    assert d.plan(128, 128, 128) is None
    # nothing near; K not a multiple of 8; a program only for B stored N x K
    assert d.plan(4096, 16, 8) is None
    assert d.plan(64, 256, 500) is None
    assert d.plan(32, 32, 32) is None
    a, b = arrays(64, 256, 500)
    assert np.array_equal(d(a, b), numpy_matmul(a, b))
    assert d.served_by(64, 256, 500) == "fallback"
    assert len(fake.launches) == 1


class BindingLauncher(FakeLauncher):
    """A launcher with ``bind``: each shape's launch made once, then run per call. Counts
    binds, runs and stream look-ups; launch() itself must not be called."""

    def __init__(self, *, run_rc=0, run_raises=False):
        super().__init__()
        self.run_rc, self.run_raises = run_rc, run_raises
        self.binds: list = []
        self.runs: list = []
        self.streams = 0

    def stream(self, like):
        self.streams += 1
        return super().stream(like)

    def bind(self, kernel, m, n, k, ldb, knobs):
        self.binds.append((kernel[1], m, n, k, ldb, knobs))

        def run(a, b, out, workspace, stream):
            self.runs.append((m, n, k, id(workspace), stream))
            if self.run_raises:
                raise OSError("segfault-ish")
            if self.run_rc:
                return self.run_rc
            return FakeLauncher.launch(self, kernel, a, b, out, m, n, k, ldb, knobs, workspace)

        return run

    def launch(self, *args):
        raise AssertionError("a launcher with bind is run through what bind returned")


@pytest.mark.parametrize(
    "launcher, why",
    [
        (FakeLauncher(fail_load=True), "cannot use"),
        (FakeLauncher(rc=3), "status 3"),
        (FakeLauncher(raises=True), "launch raised"),
        (FakeLauncher(wrong=True), "disagrees"),
        (BindingLauncher(run_rc=3), "status 3"),  # a launch bound once per shape
        (BindingLauncher(run_raises=True), "launch raised"),
    ],
)
def test_failures_fall_back_and_log_once(db, launcher, why, caplog):
    d = make(db, launcher)
    a, b = arrays(64, 256, 512)
    with caplog.at_level(logging.WARNING, logger="l2gen.dispatch"):
        for _ in range(3):
            assert np.array_equal(d(a, b), numpy_matmul(a, b))
        out = np.empty((64, 256), np.float16)
        assert d(a, b, out=out) is out and np.array_equal(out, numpy_matmul(a, b))
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and why in warnings[0].getMessage() and "64x256x512" in warnings[0].getMessage()
    assert d.served_by(64, 256, 512) == "fallback"
    assert len(launcher.launches) <= 1
    if isinstance(launcher, BindingLauncher):  # its one bound run failed; none after it
        assert len(launcher.runs) == 1


def test_wrong_first_result_writes_the_reference_into_out(db):
    d = make(db, FakeLauncher(wrong=True))
    a, b = arrays(64, 256, 512)
    out = np.zeros((64, 256), np.float16)
    assert d(a, b, out=out) is out
    assert np.array_equal(out, numpy_matmul(a, b))


def test_ineligible_operands_use_the_fallback(db):
    fake = FakeLauncher()
    d = make(db, fake)
    a, b = arrays(64, 256, 512)
    assert np.array_equal(d(a.astype(np.float32), b.astype(np.float32)), numpy_matmul(a, b))
    bt = np.asfortranarray(b)
    assert np.array_equal(d(a, bt), numpy_matmul(a, b))
    assert fake.launches == []
    assert d.served_by(64, 256, 512) != "fallback"  # the shape itself stays served
    with pytest.raises(ValueError, match="A is 64 x 512 but B is 500 x 256"):
        d(a, np.zeros((500, 256), np.float16))


def test_no_db_or_other_gpu_means_fallback(db, tmp_path):
    fake = FakeLauncher()
    d = Dispatcher(None, H200, launcher=fake, fallback=numpy_matmul, toolchain={})
    a, b = arrays(64, 256, 512)
    assert np.array_equal(d(a, b), numpy_matmul(a, b)) and fake.loads == []
    d = Dispatcher(db, None, launcher=fake, fallback=numpy_matmul, toolchain={})
    assert d.plan(64, 256, 512) is None
    with pytest.warns(UserWarning, match="not a100"):
        d = Dispatcher(db, A100, launcher=fake, fallback=numpy_matmul, toolchain={})
    assert d.plan(64, 256, 512) is None
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"\x00garbage" * 100)
    d = Dispatcher(garbage, H200, launcher=fake, fallback=numpy_matmul, toolchain={})
    assert d.db is None and np.array_equal(d(a, b), numpy_matmul(a, b))


def test_default_db_path(monkeypatch, tmp_path):
    monkeypatch.setenv("L2GEN_DB", str(tmp_path / "mine.db"))
    assert default_db_path(H200) == tmp_path / "mine.db"
    monkeypatch.delenv("L2GEN_DB")
    shipped = default_db_path(H200)  # the package ships an H200 database, and no A100 one
    assert shipped.resolve() == Path(dispatch.__file__).resolve().parent / "data" / "kernels_h200.db" and shipped.is_file()
    assert default_db_path(GPUS["a100"]) is None


def test_module_matmul_caches_a_dispatcher_per_db(db, monkeypatch):
    monkeypatch.setattr(dispatch, "detect_gpu", lambda: H200)
    monkeypatch.setattr(dispatch, "own_toolchain", lambda: {})  # the rows here record no nvcc
    monkeypatch.setattr(dispatch, "_dispatchers", {})
    fake = FakeLauncher()
    monkeypatch.setattr(dispatch, "TorchLauncher", lambda: fake)
    monkeypatch.setattr(dispatch, "_torch_matmul", lambda: numpy_matmul)
    a, b = arrays(64, 256, 512)
    c = dispatch.matmul(a, b, db=db)
    assert np.array_equal(c, numpy_matmul(a, b))
    dispatch.matmul(a, b, db=db)
    assert len(dispatch._dispatchers) == 1 and len(fake.loads) == 1 and len(fake.launches) == 2


def test_use_db_sets_what_l2gen_matmul_serves_from(db, monkeypatch):
    monkeypatch.setattr(dispatch, "detect_gpu", lambda: H200)
    monkeypatch.setattr(dispatch, "own_toolchain", lambda: {})  # the rows here record no nvcc
    monkeypatch.setattr(dispatch, "_dispatchers", {})
    monkeypatch.setattr(dispatch, "_default_entry", None)
    fake = FakeLauncher()
    monkeypatch.setattr(dispatch, "TorchLauncher", lambda: fake)
    monkeypatch.setattr(dispatch, "_torch_matmul", lambda: numpy_matmul)
    d = dispatch.use_db(db)
    a, b = arrays(64, 256, 512)
    assert np.array_equal(dispatch.matmul(a, b), numpy_matmul(a, b))
    assert dispatch._dispatchers[(None, BLayout.KN)] is d and len(fake.launches) == 1
    assert dispatch._dispatchers[(None, BLayout.NK)].b_layout is BLayout.NK  # the op's, from the same database
    assert set(dispatch._dispatchers) == {(None, BLayout.KN), (None, BLayout.NK)}
    assert dispatch._default_entry == d.call  # a winner: calls go through the dispatcher


def test_default_dispatcher_is_the_default_of_each_layout(db, monkeypatch):
    monkeypatch.setattr(dispatch, "detect_gpu", lambda: H200)
    monkeypatch.setattr(dispatch, "own_toolchain", lambda: {})
    monkeypatch.setattr(dispatch, "_dispatchers", {})
    monkeypatch.setattr(dispatch, "_default_entry", None)
    monkeypatch.setattr(dispatch, "_torch_matmul", lambda: numpy_matmul)
    nk = dispatch.default_dispatcher(True)  # made on first use, as dispatcher() makes it
    assert nk.b_layout is BLayout.NK and nk is dispatch.dispatcher(b_layout=BLayout.NK)
    made = dispatch.use_db(db)
    assert dispatch.default_dispatcher(False) is made is dispatch.dispatcher()
    assert dispatch.default_dispatcher(True) is dispatch.dispatcher(b_layout=BLayout.NK) is not nk


def test_an_idle_default_dispatcher_hands_l2gen_matmul_the_fallback_itself(tmp_path, monkeypatch):
    slow = KernelDB(tmp_path / "slow.db")
    slow.add(Measurement(Shape(64, 256, 512), program(128, 128), "ok", time_us=12.0, baseline_us=10.0), H200)
    slow.close()
    monkeypatch.setattr(dispatch, "detect_gpu", lambda: H200)
    monkeypatch.setattr(dispatch, "own_toolchain", lambda: {})  # the rows here record no nvcc
    monkeypatch.setattr(dispatch, "_dispatchers", {})
    monkeypatch.setattr(dispatch, "_default_entry", None)
    monkeypatch.setattr(dispatch, "_torch_matmul", lambda: numpy_matmul)
    d = dispatch.use_db(tmp_path / "slow.db")
    assert d._idle and dispatch._default_entry is numpy_matmul
    a, b = arrays(64, 256, 512)
    assert np.array_equal(dispatch.matmul(a, b), numpy_matmul(a, b))


def test_a_database_with_no_winner_sends_every_call_straight_to_the_fallback(tmp_path):
    slow = KernelDB(tmp_path / "slow.db")
    slow.add(Measurement(Shape(64, 256, 512), program(128, 128), "ok", time_us=12.0, baseline_us=10.0), H200)
    fake = FakeLauncher()
    d = make(slow, fake)
    assert d._idle
    a, b = arrays(64, 256, 512)
    assert np.array_equal(d(a, b), numpy_matmul(a, b))
    assert d.served_by(64, 256, 512) == "fallback"
    assert not fake.loads and not fake.launches  # the launcher is never touched
    slow.close()


def test_a_tie_with_cublas_is_not_a_winner(tmp_path):
    tie = KernelDB(tmp_path / "tie.db")
    tie.add(Measurement(Shape(64, 256, 512), program(128, 128), "ok", time_us=9.95, baseline_us=10.0), H200)
    fake = FakeLauncher()
    d = make(tie, fake)
    assert d._idle  # 1.005x is inside the noise of a re-measurement: nothing is served
    a, b = arrays(64, 256, 512)
    assert np.array_equal(d(a, b), numpy_matmul(a, b))
    assert d.served_by(64, 256, 512) == "fallback" and not fake.launches
    # what the database judges best there is still on record, served or not
    assert d.plan(64, 256, 512) is None and d.recorded(64, 256, 512) == (program(128, 128), pytest.approx(10.0 / 9.95))
    assert d.recorded(64, 256, 1024) is None
    tie.close()


def test_a_program_that_beats_the_fallback_in_every_run_is_served(tmp_path):
    """cuBLAS-best (cuBLASLt's auto-tuner) may be out of reach while torch.matmul, what an
    unserved call runs, is not: a program faster than it by more than MIN_SPEEDUP in every
    run serves its shape; one that beat it in one run only, or whose runs did not time it,
    does not."""
    db = KernelDB(tmp_path / "k.db")
    wins, once, untimed = Shape(64, 256, 512), Shape(128, 256, 512), Shape(256, 256, 512)
    for fallback in (10.5, 10.4):  # 1.05x and 1.04x over torch.matmul, 0.9x of cuBLAS-best
        db.add(Measurement(wins, program(), "ok", time_us=10.0, baseline_us=9.0, fallback_us=fallback), H200)
    for fallback in (10.5, 10.1):  # the second run 1.01x: not a winner
        db.add(Measurement(once, program(), "ok", time_us=10.0, baseline_us=9.0, fallback_us=fallback), H200)
    db.add(Measurement(untimed, program(), "ok", time_us=10.0, baseline_us=9.0), H200)
    fake = FakeLauncher()
    d = make(db, fake)
    for shape in (wins, once, untimed):
        a, b = arrays(shape.m, shape.n, shape.k)
        assert np.array_equal(d(a, b), numpy_matmul(a, b))
    plan = d.plan(wins.m, wins.n, wins.k)
    assert plan is not None and plan.speedup == pytest.approx(0.9) and plan.over_fallback == pytest.approx(1.04)
    assert d.plan(once.m, once.n, once.k) is None and d.plan(untimed.m, untimed.n, untimed.k) is None
    assert [launch[1:4] for launch in fake.launches] == [(64, 256, 512)]
    db.close()


def test_a_database_with_a_winner_is_not_idle(db):
    assert not make(db, FakeLauncher())._idle
    assert make(None, FakeLauncher())._idle


def test_l2gen_matmul_is_the_dispatch_function_itself():
    import l2gen

    assert l2gen.matmul is dispatch.matmul  # bound on first use: no wrapper per call
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        l2gen.nope  # noqa: B018


# -- B stored N x K (a @ w.T) ---------------------------------------------------------


def nk_program(bm=128, bn=128, **choices):
    return assemble(Family.SM90, dict(bm=bm, bn=bn, bk=64, **choices), b_layout=BLayout.NK)


def test_b_stored_n_by_k_is_served_by_nk_programs_with_ldb_k(db):
    nk = nk_program(128, 64)
    db.add(Measurement(Shape(64, 256, 512), nk, "ok", time_us=4.0, baseline_us=10.0), H200)  # beats the kn programs
    fake = FakeLauncher()
    d = make(db, fake, b_layout=BLayout.NK)
    a, b = arrays(64, 256, 512)
    w = np.ascontiguousarray(b.T)  # N x K, as an nn.Linear holds its weight
    assert np.array_equal(d(a, w), numpy_matmul(a, b))
    out = np.empty((64, 256), np.float16)
    assert d(a, w, out=out) is out and np.array_equal(out, numpy_matmul(a, b))
    assert d.served_by(64, 256, 512) == nk.name and fake.loads == [nk]
    assert [(l[1:4], l[5]) for l in fake.launches] == [((64, 256, 512), 512)] * 2  # ldb = K
    # nearby, and the square nk shape the fixture holds
    a2, b2 = arrays(60, 248, 504)
    assert np.array_equal(d(a2, np.ascontiguousarray(b2.T)), numpy_matmul(a2, b2)) and d.served_by(60, 248, 504) == nk.name
    a3, b3 = arrays(32, 32, 32)
    assert np.array_equal(d(a3, np.ascontiguousarray(b3.T)), numpy_matmul(a3, b3))
    assert d.served_by(32, 32, 32) == nk_program().name and fake.launches[-1][5] == 32
    # the K x N dispatcher over the same database serves the best kn program, with ldb = N
    kn_fake = FakeLauncher()
    kn = make(db, kn_fake)
    assert np.array_equal(kn(a, b), numpy_matmul(a, b)) and kn.served_by(64, 256, 512) == program(128, 128).name
    assert kn_fake.launches[0][5] == 256 and kn.plan(32, 32, 32) is None


class TorchFakeLauncher(FakeLauncher):
    """FakeLauncher over CPU torch tensors: the GEMM by numpy, written into torch's out."""

    def eligible(self, a, b, out):
        import torch

        f16 = torch.float16
        ok = a.dtype is f16 and b.dtype is f16 and a.is_contiguous() and b.is_contiguous()
        return bool(ok and (out is None or (out.dtype is f16 and out.is_contiguous())))

    def empty(self, like, m, n):
        return like.new_empty(*like.shape[:-1], n)

    def launch(self, kernel, a, b, out, m, n, k, ldb, knobs, workspace):
        import torch

        self.launches.append((kernel, m, n, k, knobs, ldb))
        nk = kernel[2] is BLayout.NK
        rows = b.numpy().reshape(-1)[: (n if nk else k) * ldb].reshape(-1, ldb)
        out.copy_(torch.from_numpy(numpy_matmul(a.numpy(), rows[:, :k].T if nk else rows[:, :n])))
        return 0

    def relerr(self, out, ref):
        return super().relerr(out.numpy(), ref.numpy())


def test_l2gen_matmul_serves_the_transpose_of_a_stored_n_by_k_weight(db, monkeypatch):
    """``l2gen.matmul(x, w.t())`` (``w`` N x K, as an nn.Linear holds it) goes to the
    winners for B stored N x K, which read ``w`` as it is stored (ldb = K, no copy); a B
    that is neither row-major nor the transpose of a row-major tensor goes to torch."""
    torch = pytest.importorskip("torch")

    def fallback(a, b, out=None):  # torch.matmul's stand-in: numpy's, on CPU tensors
        c = torch.from_numpy(numpy_matmul(a.numpy(), b.numpy()))
        return c if out is None else out.copy_(c)

    monkeypatch.setattr(dispatch, "detect_gpu", lambda: H200)
    monkeypatch.setattr(dispatch, "own_toolchain", lambda: {})
    monkeypatch.setattr(dispatch, "_dispatchers", {})
    monkeypatch.setattr(dispatch, "_default_entry", None)
    monkeypatch.setattr(dispatch, "_torch_matmul", lambda: fallback)
    fake = TorchFakeLauncher()
    monkeypatch.setattr(dispatch, "TorchLauncher", lambda: fake)
    nk = nk_program(128, 64)
    db.add(Measurement(Shape(64, 256, 512), nk, "ok", time_us=4.0, baseline_us=10.0), H200)
    a, b = (torch.from_numpy(x) for x in arrays(64, 256, 512))
    w = b.t().contiguous()  # N x K
    ref = numpy_matmul(a.numpy(), b.numpy())
    for given_db in (db, None):  # a database named, and the default one (use_db)
        if given_db is None:
            dispatch.use_db(db)
        fake.launches.clear()
        assert np.array_equal(dispatch.matmul(a, w.t(), db=given_db).numpy(), ref)
        out = torch.empty(64, 256, dtype=torch.float16)
        assert dispatch.matmul(a, w.t(), out, db=given_db) is out and np.array_equal(out.numpy(), ref)
        assert [(l[0][1], l[5]) for l in fake.launches] == [(nk.name, 512)] * 2  # w read as stored
        # a row-major B is still the K x N dispatcher's; a strided one goes to torch
        assert np.array_equal(dispatch.matmul(a, b, db=given_db).numpy(), ref)
        assert fake.launches[-1][0][1] == program(128, 128).name
        n = len(fake.launches)
        wide = torch.from_numpy(np.ascontiguousarray(np.repeat(w.numpy(), 2, axis=1)))  # N x 2K
        assert np.array_equal(dispatch.matmul(a, wide[:, ::2].t(), db=given_db).numpy(), ref)
        assert len(fake.launches) == n


def test_an_nk_dispatcher_rejects_b_on_its_stored_shape(db):
    fake = FakeLauncher()
    d = make(db, fake, b_layout=BLayout.NK)
    assert not d._idle  # the fixture's 32^3 nk winner
    a, b = arrays(64, 256, 512)  # only kn programs were measured on 64x256x512
    w = np.ascontiguousarray(b.T)
    assert np.array_equal(d(a, w), numpy_matmul(a, b))
    assert d._unserved_b == {(256, 512)} and d.served_by(64, 256, 512) == "fallback"
    assert d.plan(64, 256, 512) is None and fake.launches == []
    with pytest.raises(ValueError, match=r"A is 64 x 500 but B is 32 x 32 \(N x K\)"):
        d(np.zeros((64, 500), np.float16), np.zeros((32, 32), np.float16))
    a, b = arrays(32, 32, 32)
    assert np.array_equal(d(a, np.asfortranarray(b.T)), numpy_matmul(a, b))  # not row-major: the fallback
    assert np.array_equal(d(a, np.ascontiguousarray(b.T), out=np.empty((32, 32), np.float32)), numpy_matmul(a, b))
    assert fake.launches == [] and d.served_by(32, 32, 32) == "unprepared"


def test_an_out_of_another_shape_goes_to_the_fallback(db):
    seen = []

    def fallback(a, b, out=None):
        seen.append(out)
        return numpy_matmul(a, b)

    fake = FakeLauncher()
    d = Dispatcher(db, H200, launcher=fake, fallback=fallback, toolchain={})
    a, b = arrays(64, 256, 512)
    wrong = np.empty((64, 128), np.float16)
    d(a, b, out=wrong)
    assert seen == [wrong] and fake.launches == []  # the fallback decides what a wrong out means


# -- the early reject on B's shape -------------------------------------------------------


class ShapeCounter:
    """Wraps an array; counts reads of ``.shape`` (the part of a call the early reject
    skips for A)."""

    def __init__(self, array):
        self.array, self.reads = array, 0

    @property
    def shape(self):
        self.reads += 1
        return self.array.shape


def test_a_b_shape_that_serves_no_m_is_rejected_without_reading_a(db):
    fake = FakeLauncher()
    seen = []

    def fallback(a, b, out=None):
        seen.append(out)
        return numpy_matmul(getattr(a, "array", a), b, out=out)

    d = Dispatcher(db, H200, launcher=fake, fallback=fallback, toolchain={})
    a, b = arrays(64, 128, 128)  # B 128 x 128: only 128^3 was measured, and cuBLAS won
    assert np.array_equal(d(a, b), numpy_matmul(a, b))
    assert (128, 128) in d._unserved_b and d.served_by(64, 128, 128) == "fallback"
    a = ShapeCounter(arrays(96, 128, 128)[0])  # any M now: A's shape is not read
    out = np.empty((96, 128), np.float16)
    assert d(a, b, out=out) is out and np.array_equal(out, numpy_matmul(a.array, b))
    assert a.reads == 0 and seen[-1] is out
    assert d(a, b) is not None and a.reads == 0 and seen[-1] is None
    assert fake.loads == [] and fake.launches == []
    assert not any(key[1:] == (128, 128) for key in d._shapes)  # no entry per M either


def test_a_b_shape_served_for_some_m_is_never_rejected(db):
    # 64x2048x2048 beats cuBLAS by 2%: served on its exact shape, too little to serve nearby
    db.add(Measurement(Shape(64, 2048, 2048), program(128, 64), "ok", time_us=9.8, baseline_us=10.0), H200)
    fake = FakeLauncher()
    d = make(db, fake)
    # each B first with an M that is not served, then with one that is (exactly, nearby)
    for (m_no, m_yes), (k, n), name in [
        ((4096, 64), (512, 256), program(128, 128).name),
        ((8, 60), (504, 248), program(128, 128).name),  # 60x248x504 is near 64x256x512
        ((60, 64), (2048, 2048), program(128, 64).name),
    ]:
        assert d.plan(m_no, n, k) is None and d.plan(m_yes, n, k) is not None
        a, b = arrays(m_no, n, k)
        assert np.array_equal(d(a, b), numpy_matmul(a, b))
        assert (k, n) not in d._unserved_b and d.served_by(m_no, n, k) == "fallback"
        a, b = arrays(m_yes, n, k)
        assert np.array_equal(d(a, b), numpy_matmul(a, b))
        assert d.served_by(m_yes, n, k) == name
    assert len(fake.launches) == 3


@pytest.mark.parametrize("nearby", [True, False])
def test_the_early_reject_holds_whatever_plan_serves(db, nearby):
    """plan() serving a shape implies its (K, N) passes, on a grid around what was measured."""
    db.add(Measurement(Shape(64, 2048, 2048), program(128, 64), "ok", time_us=9.8, baseline_us=10.0), H200)
    d = make(db, FakeLauncher(), nearby=nearby)
    sizes = (8, 16, 24, 32, 56, 64, 120, 128, 176, 184, 248, 256, 360, 368, 500, 504, 512, 720, 728,
             1000, 1024, 1448, 1456, 2048, 2896, 2904, 4096)
    served = 0
    for n in sizes:
        for k in sizes:
            passes = d._serves_some_m(k, n)
            for m in (1, 8, 45, 46, 60, 64, 90, 91, 128, 724, 1000, 1024, 1448, 4096):
                if d.plan(m, n, k) is not None:
                    served += 1
                    assert passes, (m, n, k)
    assert served > (20 if nearby else 2)
    assert not d._serves_some_m(500, 256) and not d._serves_some_m(512, 250)  # not multiples of 8


def test_a_wrong_k_or_other_rank_still_goes_where_it_went(db):
    d = make(db, FakeLauncher())
    b = np.zeros((504, 256), np.float16)  # 504 x 256 is served (near 64x256x512)
    with pytest.raises(ValueError, match="A is 64 x 512 but B is 504 x 256"):
        d(np.zeros((64, 512), np.float16), b)
    a, b = arrays(64, 256, 500)  # B 500 x 256 serves no M: rejected from now on
    d(a, b)
    assert (500, 256) in d._unserved_b
    with pytest.raises(ValueError):  # the fallback's own error now
        d(np.zeros((64, 512), np.float16), b)
    # not 2-D: the fallback, B of a served shape or not
    a, b = arrays(64, 256, 512)
    a3, b3 = np.stack([a, a]), np.stack([b, b])
    assert np.array_equal(d(a3, b), numpy_matmul(a3, b))
    assert np.array_equal(d(a, b3), numpy_matmul(a, b3))
    assert d.served_by(64, 256, 512) == "unprepared"


def test_calls_from_many_threads_agree_with_the_fallback(db):
    import threading

    fake = FakeLauncher()
    d = make(db, fake)
    # served, served B with an M in another bucket, nearby, and three Bs that serve no M
    shapes = [(64, 256, 512), (32, 256, 512), (60, 248, 504), (64, 128, 128), (16, 8, 8), (64, 256, 500)]
    cases = [arrays(*s, seed=i) for i, s in enumerate(shapes)]
    bad = []

    def work():
        for _ in range(5):
            for a, b in cases:
                if not np.array_equal(d(a, b), numpy_matmul(a, b)):
                    bad.append(a.shape)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad
    assert d._unserved_b == {(128, 128), (8, 8), (500, 256)}
    assert d.served_by(32, 256, 512) == "fallback" and d.served_by(60, 248, 504) == program(128, 128).name
    assert len(fake.loads) == 1 and {l[1:4] for l in fake.launches} == {(64, 256, 512), (60, 248, 504)}


# ---- the L2 protocol a dispatcher trusts -----------------------------------------------


@pytest.fixture
def dirty_db(tmp_path):
    from dataclasses import replace

    d = KernelDB(tmp_path / "dirty.db")
    d.add(replace(Measurement(Shape(64, 256, 512), program(128, 128), "ok", time_us=8.0, baseline_us=10.0), l2="dirty"), H200)
    yield d
    d.close()


def test_winners_timed_under_another_protocol_are_not_served(dirty_db, monkeypatch, caplog):
    monkeypatch.delenv(dispatch.TRUST_ENV, raising=False)
    a, b = arrays(64, 256, 512)
    with caplog.at_level(logging.WARNING, logger="l2gen.dispatch"):
        d = make(dirty_db, FakeLauncher())
    assert d.l2 == "clean" and d._idle and d.plan(64, 256, 512) is None
    assert "timed with l2=dirty and this dispatcher trusts l2=clean: it serves none of its 1 winners" in caplog.text
    assert np.array_equal(d(a, b), numpy_matmul(a, b))
    trusting = make(dirty_db, FakeLauncher(), l2="dirty")
    assert trusting.plan(64, 256, 512).program == program(128, 128)
    monkeypatch.setenv(dispatch.TRUST_ENV, "dirty")
    assert make(dirty_db, FakeLauncher()).plan(64, 256, 512).program == program(128, 128)
    monkeypatch.setenv(dispatch.TRUST_ENV, "tepid")
    with caplog.at_level(logging.WARNING, logger="l2gen.dispatch"):
        assert make(dirty_db, FakeLauncher()).l2 == "clean"
    assert "L2GEN_TRUST_L2='tepid' is not an L2 protocol" in caplog.text
    with pytest.raises(ValueError):
        make(dirty_db, FakeLauncher(), l2="tepid")


def test_a_clean_database_is_served_by_default_and_not_when_dirty_is_trusted(db, monkeypatch):
    monkeypatch.delenv(dispatch.TRUST_ENV, raising=False)
    assert make(db, FakeLauncher()).plan(64, 256, 512) is not None
    assert make(db, FakeLauncher(), l2="dirty").plan(64, 256, 512) is None


def test_the_shipped_database_is_clean_and_serves_its_winners_by_default(monkeypatch):
    """The shipped H200 database holds two-run clean-L2 benchmarks (bench/results/); the
    decode shapes where l2gen's swap-AB kernel beat cuBLAS-best by more than the margin
    are served, a shape it lost is not."""
    from pathlib import Path

    from l2gen.ir import BLayout

    monkeypatch.delenv(dispatch.TRUST_ENV, raising=False)
    shipped = Path(dispatch.__file__).parent / "data" / "kernels_h200.db"
    d = make(shipped, FakeLauncher(), b_layout=BLayout.NK)
    assert d.db.l2 == "clean" and not d._idle
    for m, n, k in ((1, 4096, 4096), (16, 4096, 4096), (32, 3584, 3584)):
        assert d.plan(m, n, k) is not None, (m, n, k)
    assert d.plan(1, 28672, 4096) is None  # at parity with cuBLAS-best, not past the margin: torch serves it


def test_each_stream_gets_its_own_workspace_and_keeps_it(db):
    """A split-K kernel's workspace must not serve two calls in flight at once: calls on
    four streams (four threads) get four workspaces; calls on one stream share one."""
    seen: dict = {}

    class Tracking(FakeLauncher):
        def launch(self, kernel, a, b, out, m, n, k, ldb, knobs, workspace):
            seen.setdefault(self.stream(a), set()).add(id(workspace))
            return super().launch(kernel, a, b, out, m, n, k, ldb, knobs, workspace)

    fake = Tracking()
    d = make(db, fake)
    a, b = arrays(64, 256, 512)
    go = threading.Barrier(4)

    def work(stream_id):
        STREAM.id = stream_id
        go.wait()
        for _ in range(20):
            assert np.array_equal(d(a, b), numpy_matmul(a, b))

    threads = [threading.Thread(target=work, args=(s,)) for s in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {s: len(ids) for s, ids in seen.items()} == {1: 1, 2: 1, 3: 1, 4: 1}
    assert len({i for ids in seen.values() for i in ids}) == 4  # four distinct workspaces
    assert len(fake.loads) == 1 and len(fake.workspaces) == 4


def test_a_stream_first_seen_while_capturing_gets_a_workspace_for_that_call_only(db):
    class Capturing(FakeLauncher):
        capture = False

        def capturing(self):
            return self.capture

    fake = Capturing()
    d = make(db, fake)
    a, b = arrays(64, 256, 512)
    d(a, b)  # outside capture: stream 0's workspace
    fake.capture, STREAM.id = True, 7
    try:
        d(a, b)
        d(a, b)
    finally:
        STREAM.id = 0
    assert len(fake.workspaces) == 3  # one per captured call, none kept for stream 7
    assert set(d._shapes[(64, 256, 512)].workspaces) == {0}


def test_only_rows_of_this_toolchain_and_never_simulated_ones_are_served(tmp_path):
    winner = Measurement(Shape(64, 256, 512), program(128, 128), "ok", time_us=8.0, baseline_us=10.0)
    with KernelDB(tmp_path / "other.db") as other:
        other.add(winner, H200, "tune", {"nvcc": "12.4.131"})
        d = Dispatcher(other, H200, launcher=FakeLauncher(), fallback=numpy_matmul, toolchain={"nvcc": "13.0.88"})
        assert d.plan(64, 256, 512) is None  # measured with another nvcc
        d = Dispatcher(other, H200, launcher=FakeLauncher(), fallback=numpy_matmul, toolchain={"nvcc": "12.4.131"})
        assert d.plan(64, 256, 512).program == program(128, 128)
    with KernelDB(tmp_path / "sim.db") as sim:
        sim.check_evidence("simulated")
        sim.add(winner, H200, "tune", {"simulated": "analytic model", "nvcc": "13.0.88"})
        d = Dispatcher(sim, H200, launcher=FakeLauncher(), fallback=numpy_matmul, toolchain={"nvcc": "13.0.88"})
        assert d.plan(64, 256, 512) is None and d.entry is d._fallback
        d = Dispatcher(sim, H200, launcher=FakeLauncher(), fallback=numpy_matmul, toolchain={})
        assert d.plan(64, 256, 512) is None  # simulated rows are never served, whatever the toolchain


def test_a_launcher_that_binds_is_bound_once_per_shape_and_run_per_call(db):
    fake = BindingLauncher()
    d = make(db, fake)
    shapes = ((64, 256, 512), (1024, 1024, 1024))
    for i in range(3):
        for m, n, k in shapes:
            a, b = arrays(m, n, k, seed=i)
            out = None if i % 2 else np.empty((m, n), np.float16)
            c = d(a, b, out)
            assert np.array_equal(c, numpy_matmul(a, b)) and (out is None or c is out)
    assert [(name, m, n, k, ldb) for name, m, n, k, ldb, _ in fake.binds] == [
        (program(128, 128).name, 64, 256, 512, 256), (program(256, 128).name, 1024, 1024, 1024, 1024)]
    assert [r[:3] for r in fake.runs] == list(shapes) * 3
    # one stream look-up per call (and one when a shape's first workspace is made), and
    # each call ran with that stream's workspace
    assert fake.streams == len(fake.runs) + len(shapes)
    assert {r[3] for r in fake.runs if r[:3] == shapes[0]} == {id(d._shapes[shapes[0]].workspaces[0])}
    assert {r[4] for r in fake.runs} == {0}


def test_an_nk_launcher_that_binds_gets_ldb_k(db):
    fake = BindingLauncher()
    d = make(db, fake, b_layout=BLayout.NK)
    a, w = arrays(32, 32, 32)[0], arrays(32, 32, 32, seed=1)[1].T.copy()  # w: N x K
    assert np.array_equal(d(a, w), numpy_matmul(a, w.T))
    assert [b[1:5] for b in fake.binds] == [(32, 32, 32, 32)]


def test_a_launcher_without_bind_is_launched_per_call_as_before(db):
    fake = FakeLauncher()
    assert not hasattr(fake, "bind")
    run = dispatch.bound_launch(fake, ("kernel", "p", BLayout.KN), 64, 256, 512, 256, program().knobs)
    a, b = arrays(64, 256, 512)
    out = np.empty((64, 256), np.float16)
    assert run(a, b, out, bytearray(16), 0) == 0 and np.array_equal(out, numpy_matmul(a, b))
    assert fake.launches == [(("kernel", "p", BLayout.KN), 64, 256, 512, program().knobs, 256)]


def test_the_hot_table_learns_served_and_fallback_shapes_from_calls(db):
    d = make(db, FakeLauncher())
    a, b = arrays(64, 256, 512)
    assert d.hot(a.shape, b.shape) is None  # nothing called yet
    d(a, b)
    state = d.hot(a.shape, b.shape)
    assert state is not None and state is not dispatch.FALLBACK and (state.m, state.n, state.k) == (64, 256, 512)
    a2, b2 = arrays(128, 128, 128)  # recorded, but slower than cuBLAS: the fallback's
    d(a2, b2)
    assert d.hot(a2.shape, b2.shape) is dispatch.FALLBACK
    a3, b3 = arrays(8, 24, 40)  # a B shape that serves no M
    d(a3, b3)
    assert d.hot(a3.shape, b3.shape) is dispatch.FALLBACK


def test_the_hot_table_never_learns_from_operands_the_kernel_refused(db):
    d = make(db, FakeLauncher())
    a, b = arrays(64, 256, 512)
    d(a.astype(np.float32), b.astype(np.float32))  # ineligible operands: not a fact about the shapes
    assert d.hot(a.shape, b.shape) is None
    d(a, b, out=np.empty((256, 64), np.float16).T)  # an out= the kernel cannot write: the same
    assert d.hot(a.shape, b.shape) is None


def test_a_shape_given_up_leaves_the_hot_table(db):
    d = make(db, FakeLauncher(wrong=True))  # its first result disagrees: given up
    a, b = arrays(64, 256, 512)
    d(a, b)
    assert d.hot(a.shape, b.shape) is dispatch.FALLBACK or d.hot(a.shape, b.shape) is None
    d(a, b)
    assert d.hot(a.shape, b.shape) is dispatch.FALLBACK


def test_the_hot_table_starts_over_when_full(db, monkeypatch):
    monkeypatch.setattr(dispatch, "HOT_ENTRIES", 3)
    d = make(db, FakeLauncher())
    shapes = [(8, 24, 40), (8, 24, 48), (8, 24, 56), (8, 24, 64)]
    for m, n, k in shapes:
        d(*arrays(m, n, k))
    assert len(d._hot) <= 3
    a, b = arrays(*shapes[-1])
    assert d.hot(a.shape, b.shape) is dispatch.FALLBACK  # the newest is kept


def set_env(monkeypatch, name, value):
    """Set the environment variable ``name`` to ``value``, or unset it for None."""
    if value is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, value)


def l2gen_program(**choices):
    return assemble(Family.SM90_L2GEN, dict(bm=128, bn=128, bk=64, **choices))


@pytest.mark.parametrize("pdl, env", [(True, None), (None, "1"), (False, "1"), (None, None)])
def test_pdl_launches_only_l2gen_kernels_with_the_knob_on(tmp_path, monkeypatch, pdl, env):
    set_env(monkeypatch, "L2GEN_PDL", env)
    d = KernelDB(tmp_path / "p.db")
    own, cutlass = l2gen_program(), program(128, 128)
    d.add(Measurement(Shape(64, 256, 512), own, "ok", time_us=8.0, baseline_us=10.0), H200)
    d.add(Measurement(Shape(128, 256, 512), cutlass, "ok", time_us=8.0, baseline_us=10.0), H200)
    fake = FakeLauncher()
    dispatcher = make(d, fake, pdl=pdl)
    on = pdl if pdl is not None else env == "1"
    assert dispatcher.pdl is on
    for m in (64, 128):
        a, b = arrays(m, 256, 512)
        assert np.array_equal(dispatcher(a, b), numpy_matmul(a, b))
    knobs = {kernel[1]: kn for kernel, _, _, _, kn, _ in fake.launches}
    assert knobs[own.name].pdl is on  # the served program's own knobs otherwise
    assert knobs[cutlass.name].pdl is False  # CUTLASS's kernels take no such knob
    d.close()


@pytest.mark.parametrize("grid, env", [(100, None), (None, "100"), (0, "100"), (None, None)])
def test_a_grid_cap_reaches_every_served_launch_or_the_fallback(tmp_path, monkeypatch, grid, env):
    set_env(monkeypatch, "L2GEN_GRID", env)
    d = KernelDB(tmp_path / "g.db")
    rows = {  # m -> the program served there
        64: l2gen_program(),
        128: program(128, 128, cluster=(2, 1)),  # CUTLASS cooperative: whole clusters of 2 under 100
        192: l2gen_program(grid=64),  # its own, tuned cap is below the dispatcher's: kept
        256: program(128, 128, mainloop=Mainloop.WS),  # a CTA per tile: cannot keep to a cap
        320: l2gen_program(split_k=SplitK.CLUSTER),  # a cluster per tile: likewise
    }
    for m, p in rows.items():
        d.add(Measurement(Shape(m, 256, 512), p, "ok", time_us=8.0, baseline_us=10.0), H200)
    fake = FakeLauncher()
    dispatcher = make(d, fake, grid=grid)
    cap = grid if grid is not None else int(env or 0)
    assert dispatcher.grid == cap
    for m in rows:
        a, b = arrays(m, 256, 512)
        assert np.array_equal(dispatcher(a, b), numpy_matmul(a, b))
    grids = {m: kn.grid for _, m, _, _, kn, _ in fake.launches}  # the served shapes' launches
    if cap:
        assert grids == {64: 100, 128: 100, 192: 64}  # 256 and 320: the fallback
    else:
        assert grids == {64: 0, 128: 0, 192: 64, 256: 0, 320: 0}
    d.close()


def test_a_grid_cap_that_is_not_a_count_is_refused(monkeypatch):
    monkeypatch.setenv("L2GEN_GRID", "half")
    with pytest.raises(ValueError, match="L2GEN_GRID"):
        make(None, FakeLauncher())
    with pytest.raises(ValueError, match="grid -4"):
        make(None, FakeLauncher(), grid=-4)
