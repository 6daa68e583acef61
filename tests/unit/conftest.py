"""Fixtures the unit tests share."""

from __future__ import annotations

import pytest

from l2gen import toolchain


@pytest.fixture
def bare(tmp_path, monkeypatch):
    """No CUDA tools anywhere: empty PATH, no L2GEN_NVCC / L2GEN_CUOBJDUMP / CUDA_HOME /
    CUDA_PATH, no wheels, no /usr/local/cuda. Returns the test's tmp_path."""
    for name in ("L2GEN_NVCC", "L2GEN_CUOBJDUMP", "CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(toolchain, "SYSTEM_CUDA_DIRS", ())
    monkeypatch.setattr(toolchain, "_wheel_dirs", lambda: [])
    return tmp_path


@pytest.fixture
def failing_nvcc(tmp_path, monkeypatch):
    """An nvcc that reports its version and fails every compile with one located error,
    as $L2GEN_NVCC, with an empty build cache. Returns its path."""
    import stat

    fake = tmp_path / "nvcc"
    fake.write_text("#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'Cuda compilation tools, release 13.0, V13.0.88'; exit 0; fi\n"
                    "echo 'kernel.cu(12): error: something is wrong' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("L2GEN_NVCC", str(fake))
    monkeypatch.setenv("L2GEN_CACHE_DIR", str(tmp_path / "cache"))
    return fake


class CpuLauncher:
    """A dispatcher's launcher for CPU torch tensors: the GEMM by torch, reading B as the
    loaded program's layout and the leading dimension it is given say. Records each
    launch: the program's layout, (M, N, K), ldb, and the data pointers of A, B and C."""

    def __init__(self):
        self.launches: list[dict] = []

    def load(self, program, gpu):
        return program.b_layout

    def workspace(self, kernel, m, n, k, knobs, like):
        return None

    def stream(self, like):
        return 0

    def eligible(self, a, b, out):
        import torch

        def fits(t):
            return t.dtype is torch.float16 and t.dim() >= 2 and t.is_contiguous()

        return fits(a) and fits(b) and b.dim() == 2 and (out is None or fits(out))

    def empty(self, like, m, n):
        import torch

        return torch.empty((*like.shape[:-1], n), dtype=like.dtype, device=like.device)

    def launch(self, kernel, a, b, out, m, n, k, ldb, knobs, workspace):
        import torch

        from l2gen.ir import BLayout

        nk = kernel is BLayout.NK
        # a kernel writes C in A's leading dimensions by N, exactly: torch's out= would
        # resize a C of any other shape and hide the caller's mistake
        assert out.shape == (*a.shape[:-1], n), f"C is {tuple(out.shape)}, A {tuple(a.shape)}, N {n}"
        self.launches.append({"layout": kernel, "mnk": (m, n, k), "ldb": ldb,
                              "a": a.data_ptr(), "b": b.data_ptr(), "c": out.data_ptr()})
        rows = b.reshape(-1)[: (n if nk else k) * ldb].view(-1, ldb)
        torch.matmul(a, rows[:, :k].t() if nk else rows[:, :n], out=out)
        return 0

    def capturing(self):
        return False

    def relerr(self, out, ref):
        ref = ref.double()
        return float((out.double() - ref).norm() / ref.norm().clamp_min(1e-30))


SERVED_SHAPES = ((64, 256, 512), (32, 64, 128))  # what the served_on_cpu database serves, in both B layouts


@pytest.fixture
def served_on_cpu(tmp_path, monkeypatch):
    """The torch op serves CPU tensors: its default dispatchers (one per B layout) launch
    through a :class:`CpuLauncher`, from a database in which one program of each layout
    beat cuBLAS on each of :data:`SERVED_SHAPES`. Returns the launcher."""
    pytest.importorskip("torch")
    from l2gen import dispatch, torch_ops
    from l2gen.db import KernelDB
    from l2gen.ir import BLayout, Family
    from l2gen.problem import Measurement, Shape
    from l2gen.space import assemble
    from l2gen.targets import GPUS

    db = KernelDB(tmp_path / "served.db")
    for layout in BLayout:
        program = assemble(Family.SM90, dict(bm=128, bn=128, bk=64), b_layout=layout)
        for m, n, k in SERVED_SHAPES:
            db.add(Measurement(Shape(m, n, k), program, "ok", time_us=5.0, baseline_us=10.0), GPUS["h200"])
    launcher = CpuLauncher()
    made = {(None, layout): dispatch.Dispatcher(db, GPUS["h200"], launcher=launcher, toolchain={}, b_layout=layout) for layout in BLayout}
    monkeypatch.setattr(dispatch, "_dispatchers", made)
    monkeypatch.setattr(torch_ops, "SERVED_DEVICES", frozenset({"cuda", "cpu"}))
    yield launcher
    db.close()
