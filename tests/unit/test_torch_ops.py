"""The ``l2gen::mm`` op on the CPU: its registration and fake implementation, tracing with
no graph break, torch's own result wherever nothing serves, autograd against torch's, and
the served path through dispatchers whose launcher runs on the CPU (``served_on_cpu``)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from l2gen import torch_ops  # noqa: E402
from l2gen.ir import BLayout  # noqa: E402
from l2gen.torch_ops import linear, mm  # noqa: E402


def randn(*shape, dtype=torch.float16, seed=0, **kw):
    g = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(shape, generator=g, dtype=torch.float32).to(dtype).requires_grad_(kw.get("grad", False))


# -- registration and the fake implementation --------------------------------------------


def test_the_ops_are_registered_with_their_schemas():
    assert str(torch.ops.l2gen.mm.default._schema) == "l2gen::mm(Tensor a, Tensor b, bool b_nk, Tensor? bias) -> Tensor"
    assert str(torch.ops.l2gen.mm_out.default._schema) == "l2gen::mm_out(Tensor a, Tensor b, bool b_nk, Tensor? bias, Tensor(a!) out) -> ()"


CASES = [  # A's shape, B's shape as stored, nk, bias
    ((64, 512), (512, 256), False, False),
    ((64, 512), (256, 512), True, False),
    ((2, 32, 512), (512, 256), False, True),
    ((2, 3, 5, 512), (256, 512), True, True),
    ((512,), (256, 512), True, True),
    ((7, 24), (24, 40), False, False),
]


@pytest.mark.parametrize("a_shape, b_shape, nk, bias", CASES)
def test_the_fake_gives_the_shape_dtype_and_strides_of_the_real_op(a_shape, b_shape, nk, bias):
    n = b_shape[0] if nk else b_shape[1]
    with FakeTensorMode():
        for device in ("cuda", "cpu"):  # a fake CUDA tensor needs no GPU
            a = torch.empty(a_shape, dtype=torch.float16, device=device)
            b = torch.empty(b_shape, dtype=torch.float16, device=device)
            c = torch.ops.l2gen.mm(a, b, nk, torch.empty(n, dtype=torch.float16, device=device) if bias else None)
            assert c.shape == a_shape[:-1] + (n,) and c.dtype is torch.float16 and c.device.type == device
            assert c.is_contiguous()
    a, b = randn(*a_shape), randn(*b_shape)
    real = torch.ops.l2gen.mm(a, b, nk, randn(n) if bias else None)
    assert (real.shape, real.stride(), real.dtype) == (c.shape, c.stride(), c.dtype)


@pytest.mark.parametrize("a_shape, b_shape, nk, bias", CASES[:4])
def test_opcheck_agrees_on_schema_fake_and_autograd(a_shape, b_shape, nk, bias):
    n = b_shape[0] if nk else b_shape[1]
    a, b, c = randn(*a_shape, dtype=torch.float32), randn(*b_shape, dtype=torch.float32), randn(n, dtype=torch.float32)
    torch.library.opcheck(torch.ops.l2gen.mm.default, (a, b, nk, c if bias else None))
    out = torch.empty(a_shape[:-1] + (n,))
    torch.library.opcheck(torch.ops.l2gen.mm_out.default, (a, b, nk, c if bias else None, out))


# -- torch.compile -----------------------------------------------------------------------


def layers(x, w, b, w2, bias):
    y = linear(x, w, bias)  # B stored N x K, batched A, a bias
    z = mm(y, b)  # B stored K x N
    return mm(z, w2.t())  # a transposed view of an N x K tensor: served as stored


def test_a_function_calling_the_op_compiles_with_no_graph_break():
    torch._dynamo.reset()
    args = randn(2, 8, 128), randn(64, 128), randn(64, 64), randn(32, 64), randn(64)
    explained = torch._dynamo.explain(layers)(*args)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    assert explained.graphs[0].code.count("torch.ops.l2gen.mm(") == 3
    compiled = torch.compile(layers, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(*args), layers(*args))


def test_out_and_autograd_compile_with_no_graph_break():
    torch._dynamo.reset()

    def step(x, w, out):
        linear(x.detach(), w.detach(), out=out)
        return linear(x, w).float().pow(2).sum() + out.float().sum()

    x, w = randn(16, 64, dtype=torch.float32, grad=True), randn(32, 64, dtype=torch.float32, grad=True)
    out = torch.empty(16, 32)
    loss = torch.compile(step, fullgraph=True, backend="aot_eager")(x, w, out)
    loss.backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    ref = F.linear(x, w).pow(2).sum() + F.linear(x, w).detach().sum()
    ref.backward()
    assert torch.allclose(loss, ref) and torch.allclose(out, F.linear(x, w).detach())
    assert torch.allclose(gx, x.grad) and torch.allclose(gw, w.grad)


# -- what is not served is torch's own result --------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.bfloat16, torch.float64])
def test_cpu_tensors_get_torchs_result_bitwise(dtype):
    a, b, w, bias = randn(3, 40, 64, dtype=dtype), randn(64, 48, dtype=dtype), randn(48, 64, dtype=dtype), randn(48, dtype=dtype)
    assert torch.equal(mm(a, b), torch.matmul(a, b))
    assert torch.equal(mm(a, w.t()), torch.matmul(a, w.t()))
    assert torch.equal(linear(a, w), F.linear(a, w))
    assert torch.equal(linear(a, w, bias), F.linear(a, w, bias))
    assert torch.equal(mm(a[0], b, bias=bias), torch.addmm(bias, a[0], b))
    out = torch.empty(3, 40, 48, dtype=dtype)
    assert mm(a, b, out=out) is out and torch.equal(out, torch.matmul(a, b))


def test_what_the_op_does_not_take_goes_to_torch_as_it_is():
    a, b = randn(4, 8, 16), randn(4, 16, 24)
    assert torch.equal(mm(a, b), torch.matmul(a, b))  # a batched B
    assert torch.equal(mm(a[0, 0], b[0]), torch.matmul(a[0, 0], b[0]))  # 1-D A
    bias2 = randn(8, 24)
    assert torch.equal(mm(a[0], b[0], bias=bias2), torch.addmm(bias2, a[0], b[0]))  # a bias that is not N values
    at = randn(16, 8).t()  # a non-contiguous A
    assert torch.equal(mm(at, b[0]), torch.matmul(at, b[0]))
    ints = torch.arange(12).view(3, 4)
    assert torch.equal(mm(ints, ints.t()), torch.matmul(ints, ints.t()))


def test_torchs_errors_are_torchs():
    a, b = randn(4, 16), randn(12, 8)

    def message(fn):
        with pytest.raises(RuntimeError) as info:
            fn()
        return str(info.value)

    assert message(lambda: mm(a, b)) == message(lambda: torch.matmul(a, b))
    assert message(lambda: linear(a, b)) == message(lambda: F.linear(a, b))
    assert message(lambda: mm(a, randn(16, 8, dtype=torch.float32))) == message(lambda: torch.matmul(a, randn(16, 8, dtype=torch.float32)))
    grad = randn(4, 16, grad=True)
    out = torch.empty(4, 8, dtype=torch.float16)
    assert "automatic differentiation" in message(lambda: mm(grad, randn(16, 8), out=out))


# -- autograd -----------------------------------------------------------------------------


@pytest.mark.parametrize("nk", [False, True])
@pytest.mark.parametrize("a_shape", [(6, 16), (2, 3, 16), (16,)])
@pytest.mark.parametrize("bias", [False, True])
def test_gradcheck(nk, a_shape, bias):
    a = randn(*a_shape, dtype=torch.float64, grad=True)
    b = randn(*((8, 16) if nk else (16, 8)), dtype=torch.float64, grad=True)
    c = randn(8, dtype=torch.float64, grad=True)
    args = (a, b, c) if bias else (a, b)
    assert torch.autograd.gradcheck(lambda a, b, *c: torch.ops.l2gen.mm(a, b, nk, c[0] if c else None), args)
    assert torch.autograd.gradgradcheck(lambda a, b, *c: torch.ops.l2gen.mm(a, b, nk, c[0] if c else None), args)


def grads_of(fn, *tensors):
    tensors = [t.detach().clone().requires_grad_(True) for t in tensors]
    y = fn(*tensors)
    y.backward(randn(*y.shape, dtype=y.dtype, seed=7))
    return y.detach(), [t.grad for t in tensors]


def close(x, y, tol=2e-2):
    return float((x.double() - y.double()).norm() / y.double().norm()) < tol


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_gradients_match_torchs(dtype):
    x, w, b, bias = randn(2, 5, 64, dtype=dtype), randn(48, 64, dtype=dtype), randn(64, 48, dtype=dtype), randn(48, dtype=dtype)
    for ours, theirs, args in [
        (lambda x, w, c: linear(x, w, c), lambda x, w, c: F.linear(x, w, c), (x, w, bias)),
        (lambda x, w: mm(x, w.t()), lambda x, w: torch.matmul(x, w.t()), (x, w)),
        (lambda x, b, c: mm(x, b, bias=c), lambda x, b, c: torch.matmul(x, b) + c, (x, b, bias)),
    ]:
        y, g = grads_of(ours, *args)
        y_ref, g_ref = grads_of(theirs, *args)
        assert close(y, y_ref) and all(close(u, v) for u, v in zip(g, g_ref))
        assert [u.shape for u in g] == [t.shape for t in args] and all(u.dtype is dtype for u in g)


@pytest.mark.parametrize("nk", [False, True])
def test_only_the_gradients_asked_for_are_computed(nk):
    x = randn(6, 16, dtype=torch.float64, grad=True)
    b = randn(*((8, 16) if nk else (16, 8)), dtype=torch.float64, grad=True)
    frozen = b.detach()
    y = torch.ops.l2gen.mm(x, frozen, nk, None)  # a frozen weight: the gradient of A alone
    y.sum().backward()
    assert torch.allclose(x.grad, torch.ones(6, 8, dtype=torch.float64) @ (frozen if nk else frozen.t()))
    y = torch.ops.l2gen.mm(x.detach(), b, nk, None)  # activations without a gradient: B's alone
    y.sum().backward()
    ones = torch.ones(6, 8, dtype=torch.float64)
    assert torch.allclose(b.grad, ones.t() @ x.detach() if nk else x.detach().t() @ ones)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_under_autocast_the_op_casts_as_torch_does_and_still_differentiates(dtype):
    torch._dynamo.reset()
    x, w, bias = randn(2, 8, 64, dtype=torch.float32), randn(32, 64), randn(32, dtype=torch.float32)
    with torch.autocast("cpu", dtype=dtype):
        for ours, theirs, args in [
            (lambda x, w, c: linear(x, w, c), lambda x, w, c: F.linear(x, w, c), (x, w, bias)),
            (lambda x, w: mm(x, w.t()), lambda x, w: torch.matmul(x, w.t()), (x, w)),
        ]:
            y, g = grads_of(ours, *args)
            y_ref, g_ref = grads_of(theirs, *args)
            assert y.dtype is dtype and torch.equal(y, y_ref)
            assert [u.dtype for u in g] == [t.dtype for t in args] and all(close(u, v) for u, v in zip(g, g_ref))
        compiled = torch.compile(lambda x, w, c: linear(x, w, c), fullgraph=True, backend="aot_eager")
        assert torch.equal(compiled(x, w, bias), F.linear(x, w, bias))
        with pytest.raises(RuntimeError) as ours:  # out= under autocast: torch's own call, and its refusal
            mm(x, w.t(), out=torch.empty(2, 8, 32))
        with pytest.raises(RuntimeError) as theirs:
            torch.matmul(x, w.t(), out=torch.empty(2, 8, 32))
        assert str(ours.value) == str(theirs.value)


# -- the served path (dispatchers with a CPU launcher) -----------------------------------


def test_both_layouts_are_served_with_their_leading_dimension(served_on_cpu):
    launches = served_on_cpu.launches
    x, w, b = randn(4, 16, 512), randn(256, 512), randn(512, 256)
    assert torch.equal(linear(x, w), torch.matmul(x.view(64, 512), w.t()).view(4, 16, 256))
    assert launches[-1]["layout"] is BLayout.NK and launches[-1]["mnk"] == (64, 256, 512) and launches[-1]["ldb"] == 512
    assert launches[-1]["b"] == w.data_ptr() and launches[-1]["a"] == x.data_ptr()  # no copy of either
    assert torch.equal(mm(x, w.t()), linear(x, w)) and launches[-1]["b"] == w.data_ptr()
    assert torch.equal(mm(x, b), torch.matmul(x.view(64, 512), b).view(4, 16, 256))
    assert launches[-1]["layout"] is BLayout.KN and launches[-1]["ldb"] == 256
    assert len(launches) == 4
    # A's leading dimensions are the rows: the launch gets the 3-D input and writes the
    # 3-D output it returns (no view of either on the way)
    c = linear(x, w)
    assert c.shape == (4, 16, 256) and launches[-1]["c"] == c.data_ptr() and launches[-1]["a"] == x.data_ptr()


def test_a_served_call_adds_its_bias_and_writes_out(served_on_cpu):
    launches = served_on_cpu.launches
    x, w, bias = randn(64, 512), randn(256, 512), randn(256)
    assert torch.equal(linear(x, w, bias), torch.matmul(x, w.t()) + bias)
    out = torch.empty(2, 32, 256, dtype=torch.float16)
    assert linear(x.view(2, 32, 512), w, bias, out=out) is out
    assert launches[-1]["c"] == out.data_ptr() and torch.equal(out.view(64, 256), torch.matmul(x, w.t()) + bias)
    assert len(launches) == 2


def test_what_the_kernels_cannot_take_is_not_launched(served_on_cpu):
    x, w = randn(4, 16, 512), randn(256, 512)
    for a, b in [
        (x.transpose(0, 1), w),  # A's leading dimensions do not flatten into a view
        (x.float(), w.float()),  # not fp16
        (x, randn(512, 256).t()),  # the weight is a transposed view: not N x K as stored
        (randn(64, 256), randn(256, 256)),  # a shape nothing serves
    ]:
        assert torch.equal(linear(a, b), F.linear(a, b))
    with pytest.raises(RuntimeError) as ours:  # a bias of another dtype: torch's error
        linear(x, w, randn(256, dtype=torch.float32))
    with pytest.raises(RuntimeError) as theirs:
        F.linear(x, w, randn(256, dtype=torch.float32))
    assert str(ours.value) == str(theirs.value)
    out = torch.empty(64, 256, dtype=torch.float16)  # an out of another shape: torch resizes it
    with pytest.warns(UserWarning, match="resized"):
        linear(x, w, out=out)
    assert out.shape == (4, 16, 256) and torch.equal(out, torch.matmul(x, w.t()))
    assert served_on_cpu.launches == []


def test_gradients_through_served_calls_match_torchs(served_on_cpu):
    x, w, b, bias = randn(64, 512), randn(256, 512), randn(512, 256), randn(256)
    y, g = grads_of(lambda x, w, c: linear(x, w, c), x, w, bias)
    y_ref, g_ref = grads_of(lambda x, w, c: F.linear(x, w, c), x, w, bias)
    assert close(y, y_ref) and all(close(u, v) for u, v in zip(g, g_ref))
    y, g = grads_of(lambda x, b: mm(x.view(2, 32, 512), b), x, b)
    y_ref, g_ref = grads_of(lambda x, b: torch.matmul(x.view(2, 32, 512), b), x, b)
    assert close(y, y_ref) and all(close(u, v) for u, v in zip(g, g_ref))
    assert [l["layout"] for l in served_on_cpu.launches] == [BLayout.NK, BLayout.KN]


def test_a_compiled_function_serves_through_the_op(served_on_cpu):
    torch._dynamo.reset()
    x, w, bias = randn(64, 512), randn(256, 512), randn(256)
    compiled = torch.compile(lambda x, w, c: linear(x, w, c).relu(), fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(x, w, bias), (torch.matmul(x, w.t()) + bias).relu())
    assert len(served_on_cpu.launches) == 1


def test_fp32_activations_under_fp16_autocast_are_served(served_on_cpu):
    x, w = randn(64, 512, dtype=torch.float32), randn(256, 512)
    with torch.autocast("cpu", dtype=torch.float16):
        y = linear(x, w)
    assert y.dtype is torch.float16 and torch.equal(y, torch.matmul(x.half(), w.t()))
    assert [l["mnk"] for l in served_on_cpu.launches] == [(64, 256, 512)]


def test_the_op_serves_nothing_that_is_not_on_a_served_device(served_on_cpu, monkeypatch):
    monkeypatch.setattr(torch_ops, "SERVED_DEVICES", frozenset({"cuda"}))
    x, w = randn(64, 512), randn(256, 512)
    assert torch.equal(linear(x, w), F.linear(x, w)) and served_on_cpu.launches == []


def test_eager_inference_skips_the_ops_dispatch_and_autograd_or_compile_use_it(served_on_cpu, monkeypatch):
    calls = []
    real = torch.ops.l2gen.mm

    class Counting:
        def __call__(self, *args):
            calls.append(args)
            return real(*args)

    monkeypatch.setattr(torch.ops.l2gen, "mm", Counting())
    x, w = randn(64, 512), randn(256, 512)
    with torch.no_grad():
        assert torch.equal(linear(x, w), torch.matmul(x, w.t()))
    assert calls == [] and len(served_on_cpu.launches) == 1  # served, without the op
    x.requires_grad_(True)
    y = linear(x, w)  # a gradient to record: through the op and its autograd
    assert len(calls) == 1 and y.grad_fn is not None and len(served_on_cpu.launches) == 2


# -- the hot path: eager calls of shapes the dispatcher has seen ---------------------------


def counting_serve(monkeypatch, layout=BLayout.NK):
    """Counts the calls that went through the dispatcher's full path (``serve``)."""
    from l2gen import dispatch

    d = dispatch.default_dispatcher(layout is BLayout.NK)
    calls = []
    real = d.serve
    monkeypatch.setattr(d, "serve", lambda *args: calls.append(args) or real(*args))
    return calls


def test_a_served_shapes_later_calls_take_the_hot_path(served_on_cpu, monkeypatch):
    serves = counting_serve(monkeypatch)
    x, w = randn(64, 512), randn(256, 512)
    with torch.no_grad():
        first = linear(x, w)
        assert len(serves) == 1 and len(served_on_cpu.launches) == 1
        for _ in range(3):
            assert torch.equal(linear(x, w), first)
        out = torch.empty(64, 256, dtype=torch.float16)
        assert linear(x, w, out=out) is out and torch.equal(out, first)
    assert len(serves) == 1 and len(served_on_cpu.launches) == 5  # launched each time, looked up once
    assert served_on_cpu.launches[-1]["c"] == out.data_ptr() and served_on_cpu.launches[-1]["b"] == w.data_ptr()


def test_the_hot_path_shapes_c_like_a_of_any_rank(served_on_cpu, monkeypatch):
    """A hot call makes C (or checks the caller's) from A's leading dimensions and N: a
    3-D activation gets a 3-D result, launched from the hot path each time."""
    serves = counting_serve(monkeypatch)
    x, w = randn(2, 32, 512), randn(256, 512)
    with torch.no_grad():
        first = linear(x, w)  # learnt: served
        hot = linear(x, w)
        out = torch.empty(2, 32, 256, dtype=torch.float16)
        assert linear(x, w, out=out) is out
    assert first.shape == hot.shape == (2, 32, 256) and torch.equal(hot, first) and torch.equal(out, first)
    assert len(serves) == 1 and len(served_on_cpu.launches) == 3
    assert [l["c"] for l in served_on_cpu.launches[1:]] == [hot.data_ptr(), out.data_ptr()]


def test_a_fallback_shapes_later_calls_go_straight_to_torch(served_on_cpu, monkeypatch):
    serves = counting_serve(monkeypatch)
    x, w = randn(64, 256), randn(256, 256)  # a B shape nothing serves
    for _ in range(3):
        assert torch.equal(linear(x, w), F.linear(x, w))
    assert len(serves) == 1 and served_on_cpu.launches == []
    x.requires_grad_(True)  # torch's own call keeps its autograd
    y = linear(x, w)
    assert y.grad_fn is not None and len(serves) == 1


def test_the_hot_path_hands_what_the_kernel_cannot_take_to_the_full_path(served_on_cpu, monkeypatch):
    serves = counting_serve(monkeypatch)
    x, w = randn(64, 512), randn(256, 512)
    with torch.no_grad():
        linear(x, w)  # learnt: served
    cases = [
        (x.float(), w.float(), None),                        # not fp16
        (randn(512, 64).t(), w, None),                       # A not contiguous
        (x, w, torch.empty(256, 64, dtype=torch.float16).t()),  # out not contiguous
    ]
    for a, b, out in cases:
        with torch.no_grad():
            got = linear(a, b) if out is None else linear(a, b, out=out)
        assert torch.equal(got, F.linear(a, b))
    assert len(serves) == 1 + len(cases) - 1  # the out= it cannot write goes to torch before the dispatcher
    assert len(served_on_cpu.launches) == 1
    x.requires_grad_(True)
    assert linear(x, w).grad_fn is not None  # a gradient to record: through the op
    assert linear(x, w, randn(256)).shape == (64, 256)  # a bias: the full path adds it


def test_a_transposed_weight_of_known_fallback_shapes_goes_to_torch_as_written(served_on_cpu, monkeypatch):
    serves = counting_serve(monkeypatch)
    x, w = randn(64, 256), randn(256, 256)  # nothing serves a 256 x 256 weight
    for _ in range(3):
        assert torch.equal(mm(x, w.t()), torch.matmul(x, w.t()))
    out = torch.empty(64, 256, dtype=torch.float16)
    assert mm(x, w.t(), out=out) is out and torch.equal(out, torch.matmul(x, w.t()))
    assert len(serves) == 1 and served_on_cpu.launches == []
    x2, w2 = randn(64, 512), randn(256, 512)  # a served weight's transpose is still served as stored
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(mm(x2, w2.t()), torch.matmul(x2, w2.t()))
    assert [l["b"] for l in served_on_cpu.launches] == [w2.data_ptr()] * 2
