"""The ``l2gen::mm`` op on a GPU, served by real generated kernels for both B layouts:
results and gradients against torch, batched A, bias and ``out=``, CUDA graph capture,
torch.compile, and a patched model. Needs nvcc, CUTLASS headers, torch and a CUDA GPU
(skips cleanly without).

Run on a GPU machine: ``python -m pytest tests/gpu/test_torch_op_gpu.py -m gpu -v``.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

import l2gen  # noqa: E402
from l2gen import dispatch  # noqa: E402
from l2gen.check import is_valid  # noqa: E402
from l2gen.db import KernelDB  # noqa: E402
from l2gen.dispatch import Dispatcher, TorchLauncher, own_toolchain  # noqa: E402
from l2gen.ir import BLayout, Family, SplitK  # noqa: E402
from l2gen.problem import Measurement, Shape  # noqa: E402
from l2gen.space import assemble  # noqa: E402
from l2gen.torch_ops import linear, mm  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="torch has no CUDA device"),
]

MAX_RELERR = 1e-3


def winners(gpu, layout: BLayout) -> list[tuple[Shape, object]]:
    """(shape, program) pairs of one B layout, each a pretend winner on its shape: both
    families, and a split-K program (a workspace per stream)."""
    out = [
        (Shape(64, 256, 512), assemble(Family.SM80, dict(bm=128, bn=128, bk=32, warps=(2, 2), stages=3, smem_swizzle_b=2), b_layout=layout)),
        (Shape(128, 512, 1024), assemble(Family.SM80, dict(bm=64, bn=64, bk=64, warps=(2, 2), stages=4, split_k=SplitK.PARALLEL, splits=3), b_layout=layout)),
    ]
    if gpu.sm >= 90:
        out.append((Shape(256, 1024, 512), assemble(Family.SM90, dict(bm=128, bn=128, bk=64, mainloop="cooperative"), b_layout=layout)))
    assert all(is_valid(p, gpu) for _, p in out)
    return out


class Counting(TorchLauncher):
    """The real launcher, counting launches per B layout of the loaded program."""

    def __init__(self):
        super().__init__()
        self.launches = {layout: 0 for layout in BLayout}
        self._layouts: dict = {}

    def load(self, program, gpu):
        kernel = super().load(program, gpu)
        self._layouts[id(kernel)] = program.b_layout
        return kernel

    def bind(self, kernel, m, n, k, ldb, knobs):
        layout = self._layouts[id(kernel)]
        assert ldb == (k if layout is BLayout.NK else n)
        run = super().bind(kernel, m, n, k, ldb, knobs)

        def counted(*args):
            self.launches[layout] += 1
            return run(*args)

        return counted


@pytest.fixture(scope="module")
def served(gpu, tmp_path_factory):
    """The op's default dispatchers, one per layout, over a database of the winners above
    (verification off: the kernels are what is tested). Yields (launcher, shapes by layout)."""
    launcher = Counting()
    shapes = {}
    with KernelDB(tmp_path_factory.mktemp("torch-op") / "k.db") as db, pytest.MonkeyPatch.context() as patch:
        for layout in BLayout:
            shapes[layout] = []
            for shape, program in winners(gpu, layout):
                db.add(Measurement(shape, program, "ok", time_us=1.0, baseline_us=2.0, relerr=0.0), gpu, "test", own_toolchain())
                shapes[layout].append((shape, program.name))
        made = {(None, layout): Dispatcher(db, gpu, launcher=launcher, verify=False, b_layout=layout) for layout in BLayout}
        patch.setattr(dispatch, "_dispatchers", made)
        yield launcher, shapes


def relerr(c, ref) -> float:
    ref = ref.float()
    return float((c.float() - ref).norm() / ref.norm().clamp_min(1e-30))


def operands(shape: Shape, seed=0, lead=None):
    g = torch.Generator(device="cuda").manual_seed(seed + shape.m + shape.n + shape.k)
    x = torch.randn((*(lead or (shape.m,)), shape.k), device="cuda", dtype=torch.float16, generator=g)
    w = torch.randn((shape.n, shape.k), device="cuda", dtype=torch.float16, generator=g) / shape.k**0.5
    bias = torch.randn((shape.n,), device="cuda", dtype=torch.float16, generator=g)
    return x, w, bias


def served_by(layout, shape) -> str:
    return dispatch._dispatchers[(None, layout)].served_by(shape.m, shape.n, shape.k)


def test_served_results_match_torch_in_both_layouts(served):
    launcher, shapes = served
    for layout, cases in shapes.items():
        for shape, name in cases:
            x, w, bias = operands(shape)
            b = w.t().contiguous()  # the same B stored K x N
            lead = (2, shape.m // 2)
            before = launcher.launches[layout]
            ref = x.float() @ w.float().t()
            out = torch.full((shape.m, shape.n), float("nan"), device="cuda", dtype=torch.float16)
            if layout is BLayout.NK:
                # the weight as stored, its transposed view, and that view through l2gen.matmul
                plain = [linear(x, w), mm(x, w.t()), dispatch.matmul(x, w.t())]
                biased = linear(x.view(*lead, shape.k), w, bias)
                assert linear(x, w, out=out) is out
            else:
                plain = [mm(x, b)]
                biased = mm(x.view(*lead, shape.k), b, bias=bias)
                assert mm(x, b, out=out) is out
            torch.cuda.synchronize()
            assert served_by(layout, shape) == name, f"{name} did not serve {shape} ({layout.value})"
            for c in plain + [out]:
                assert c.shape == (shape.m, shape.n) and torch.isfinite(c).all() and relerr(c, ref) < MAX_RELERR
            assert biased.shape == (*lead, shape.n) and relerr(biased.view(shape.m, shape.n), ref + bias.float()) < 2 * MAX_RELERR  # and the fp16 add
            assert launcher.launches[layout] - before == len(plain) + 2


@pytest.mark.parametrize("layout", list(BLayout))
def test_gradients_through_served_calls_match_torchs(served, layout):
    launcher, shapes = served
    shape, _ = shapes[layout][0]
    x, w, bias = operands(shape, seed=1, lead=(4, shape.m // 4))
    g = torch.randn((4, shape.m // 4, shape.n), device="cuda", dtype=torch.float16)

    def grads(fn):
        leaves = [t.detach().clone().requires_grad_(True) for t in (x, w, bias)]
        y = fn(*leaves)
        y.backward(g)
        return y.detach(), [t.grad for t in leaves]

    before = launcher.launches[layout]
    if layout is BLayout.NK:
        y, ours = grads(lambda x, w, c: linear(x, w, c))
        y_ref, theirs = grads(lambda x, w, c: F.linear(x, w, c))
    else:
        y, ours = grads(lambda x, w, c: mm(x, w.t().contiguous(), bias=c))
        y_ref, theirs = grads(lambda x, w, c: torch.matmul(x, w.t().contiguous()) + c)
    assert launcher.launches[layout] == before + 1
    assert relerr(y, y_ref) < 2 * MAX_RELERR
    for u, v in zip(ours, theirs):
        assert u.shape == v.shape and relerr(u, v) < 2 * MAX_RELERR


def test_cuda_graphs_capture_the_op(served):
    launcher, shapes = served
    (kn_shape, _), (nk_shape, _) = shapes[BLayout.KN][1], shapes[BLayout.NK][1]  # split-K: a workspace
    x, w, bias = operands(nk_shape, seed=2)
    a, b, _ = operands(kn_shape, seed=3)
    b = b.t().contiguous()
    y, z = linear(x, w, bias), mm(a, b)  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.cuda.graph(graph):
        y, z = linear(x, w, bias), mm(a, b)
    torch.cuda.current_stream().wait_stream(side)
    before = dict(launcher.launches)
    x.copy_(torch.randn_like(x))
    a.copy_(torch.randn_like(a))
    graph.replay()
    torch.cuda.synchronize()
    assert launcher.launches == before  # replays launch no Python
    assert relerr(y, x.float() @ w.float().t() + bias.float()) < 3 * MAX_RELERR
    assert relerr(z, a.float() @ b.float()) < MAX_RELERR


def test_torch_compile_traces_and_serves_the_op(served):
    launcher, shapes = served
    torch._dynamo.reset()
    shape, _ = shapes[BLayout.NK][0]
    x, w, bias = operands(shape, seed=4)

    def fn(x, w, bias):
        return torch.relu(linear(x, w, bias)) * 2

    before = launcher.launches[BLayout.NK]
    y = torch.compile(fn, fullgraph=True, backend="aot_eager")(x, w, bias)
    torch.cuda.synchronize()
    assert launcher.launches[BLayout.NK] == before + 1
    assert relerr(y, torch.relu(x.float() @ w.float().t() + bias.float()) * 2) < 3 * MAX_RELERR


def test_a_patched_model_trains_on_the_gpu(served):
    launcher, shapes = served
    shape, _ = shapes[BLayout.NK][0]  # 64 tokens through Linear(K, N)
    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(shape.k, shape.n), torch.nn.GELU(), torch.nn.Linear(shape.n, 8)).half().cuda()
    routed = copy.deepcopy(plain)
    x = torch.randn((shape.m, shape.k), device="cuda", dtype=torch.float16)
    before = launcher.launches[BLayout.NK]
    with l2gen.patch(routed) as handle:
        assert len(handle.layers) == 2
        y = routed(x)
        y.float().pow(2).sum().backward()
    y_ref = plain(x)
    y_ref.float().pow(2).sum().backward()
    assert launcher.launches[BLayout.NK] == before + 1  # the first layer's shape is served
    assert relerr(y, y_ref) < 5e-3
    for p, q in zip(routed.parameters(), plain.parameters()):
        assert relerr(p.grad, q.grad) < 1e-2
    assert type(routed[0]) is torch.nn.Linear


def test_fp32_activations_under_autocast_are_served(served):
    launcher, shapes = served
    shape, _ = shapes[BLayout.NK][0]
    x, w, bias = operands(shape, seed=5)
    before = launcher.launches[BLayout.NK]
    with torch.autocast("cuda", dtype=torch.float16):
        y = linear(x.float(), w, bias.float())
    torch.cuda.synchronize()
    assert y.dtype is torch.float16 and launcher.launches[BLayout.NK] == before + 1
    assert relerr(y, x.float() @ w.float().t() + bias.float()) < 2 * MAX_RELERR
