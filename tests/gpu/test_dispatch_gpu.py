"""The dispatcher on a GPU: random shapes served by real generated kernels agree with
torch.matmul. Needs nvcc, CUTLASS headers, torch and a CUDA GPU (skips cleanly without).

Run on a GPU machine: ``python -m pytest tests/gpu/test_dispatch_gpu.py -m gpu -v``.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from l2gen.check import is_valid  # noqa: E402
from l2gen.db import KernelDB  # noqa: E402
from l2gen.dispatch import Dispatcher, TorchLauncher, own_toolchain  # noqa: E402
from l2gen.ir import Family, SplitK  # noqa: E402
from l2gen.problem import Measurement, Shape  # noqa: E402
from l2gen.space import assemble  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="torch has no CUDA device"),
]

MAX_RELERR = 1e-3


def programs(gpu):
    """A few programs of both families, with run-time knobs that exercise the splitters."""
    out = [
        assemble(Family.SM80, dict(bm=128, bn=128, bk=32, warps=(2, 2), stages=3, smem_swizzle_b=2)),
        assemble(Family.SM80, dict(bm=64, bn=64, bk=64, warps=(2, 2), stages=4, split_k=SplitK.PARALLEL, splits=3)),
    ]
    if gpu.sm >= 90:
        out += [
            assemble(Family.SM90, dict(bm=128, bn=128, bk=64, mainloop="cooperative")),
            assemble(Family.SM90, dict(bm=128, bn=256, bk=64, mainloop="cooperative", scheduler="stream_k", splits=2, decomposition="split_k")),
        ]
    assert all(is_valid(p, gpu) for p in out)
    return out


@pytest.fixture(scope="module")
def launcher():
    return TorchLauncher()  # shared: each library is built and loaded once for the module


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    with KernelDB(tmp_path_factory.mktemp("db") / "k.db") as d:
        yield d


def relerr(c, ref):
    ref = ref.float()
    return float((c.float() - ref).norm() / ref.norm().clamp_min(1e-30))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    m=st.integers(1, 1500),
    n=st.integers(1, 160).map(lambda v: 8 * v),
    k=st.integers(1, 512).map(lambda v: 8 * v),
    which=st.integers(0, 3),
    give_out=st.booleans(),
)
def test_dispatch_matches_torch(gpu, launcher, db, m, n, k, which, give_out):
    options = programs(gpu)
    program = options[which % len(options)]
    shape = Shape(m, n, k)
    # Pretend it won on this shape, so the dispatcher serves it (and only it) here.
    db.add(Measurement(shape, program, "ok", time_us=1.0, baseline_us=2.0, relerr=0.0), gpu, "test", own_toolchain())
    d = Dispatcher(db, gpu, launcher=launcher, verify=False)  # no safety net: test the kernel
    g = torch.Generator(device="cuda").manual_seed(m * 131 + n * 7 + k)
    a = torch.randn((m, k), device="cuda", dtype=torch.float16, generator=g)
    b = torch.randn((k, n), device="cuda", dtype=torch.float16, generator=g)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16) if give_out else None
    c = d(a, b, out)
    torch.cuda.synchronize()
    assert d.served_by(m, n, k) not in ("fallback", "unprepared"), f"{program.name} did not serve {shape}"
    if give_out:
        assert c is out
    ref = torch.matmul(a.float(), b.float())
    assert torch.isfinite(c).all()
    assert relerr(c, ref) < MAX_RELERR


def test_unserved_shapes_fall_back(gpu, launcher, db):
    d = Dispatcher(db, gpu, launcher=launcher)
    a = torch.randn((33, 20), device="cuda", dtype=torch.float16)  # K = 20: not a multiple of 8
    b = torch.randn((20, 17), device="cuda", dtype=torch.float16)
    c = d(a, b)
    assert d.served_by(33, 17, 20) == "fallback"
    assert relerr(c, torch.matmul(a.float(), b.float())) < MAX_RELERR


def test_dispatch_inside_cuda_graph(gpu, launcher, db):
    m, n, k = 256, 512, 1024
    program = programs(gpu)[0]
    db.add(Measurement(Shape(m, n, k), program, "ok", time_us=1.0, baseline_us=2.0, relerr=0.0), gpu, "test", own_toolchain())
    d = Dispatcher(db, gpu, launcher=launcher)
    a = torch.randn((m, k), device="cuda", dtype=torch.float16)
    b = torch.randn((k, n), device="cuda", dtype=torch.float16)
    out = torch.empty((m, n), device="cuda", dtype=torch.float16)
    d(a, b, out)  # warm-up outside capture: build, load, workspace, verification
    torch.cuda.synchronize()
    assert d.served_by(m, n, k) == program.name
    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(graph):
            d(a, b, out)
    torch.cuda.current_stream().wait_stream(s)
    out.fill_(float("nan"))
    a.copy_(torch.randn_like(a))
    graph.replay()
    torch.cuda.synchronize()
    assert relerr(out, torch.matmul(a.float(), b.float())) < MAX_RELERR
