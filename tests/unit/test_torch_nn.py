"""``l2gen.nn.Linear`` and ``l2gen.patch`` on the CPU: which layers change, an exact undo
(function and context manager), tracing a patched model with no graph break, and training
through it."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

import l2gen  # noqa: E402
from l2gen.ir import BLayout  # noqa: E402


class Block(nn.Module):
    def __init__(self, width=64, dtype=torch.float16):
        super().__init__()
        self.up = nn.Linear(width, 4 * width, dtype=dtype)
        self.down = nn.Linear(4 * width, width, bias=False, dtype=dtype)
        self.norm = nn.LayerNorm(width, dtype=dtype)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x))))


class Scaled(nn.Linear):
    """A subclass of nn.Linear that computes something else: left alone."""

    def forward(self, x):
        return 2 * super().forward(x)


class Model(nn.Module):
    def __init__(self, dtype=torch.float16):
        super().__init__()
        self.body = nn.Sequential(Block(dtype=dtype), Block(dtype=dtype), Scaled(64, 64, dtype=dtype))
        self.head = nn.Linear(64, 32, dtype=torch.float32)  # fp32: left alone
        self.tied = self.body[0].up  # one module under two names

    def forward(self, x):
        return self.head(self.body(x).float())


def model(dtype=torch.float16):
    torch.manual_seed(0)
    return Model(dtype)


def inputs(dtype=torch.float16):
    return torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(1)).to(dtype)


def snapshot(m) -> dict:
    """What undo must restore: every module by name (object and type), every parameter
    (object and version), and the state dict's tensors."""
    state = m.state_dict()
    return {
        "modules": [(name, id(mod), type(mod)) for name, mod in m.named_modules(remove_duplicate=False)],
        "parameters": [(name, id(p), p._version) for name, p in m.named_parameters(remove_duplicate=False)],
        "state": ({k: (v.dtype, v.shape, v.data_ptr()) for k, v in state.items()}, {k: v.clone() for k, v in state.items()}),
    }


def same(before, after, *parts) -> bool:
    for part in parts or before:
        if part == "state":
            (meta, values), (meta2, values2) = before[part], after[part]
            if meta != meta2 or any(not torch.equal(values[k], values2[k]) for k in values):
                return False
        elif before[part] != after[part]:
            return False
    return True


def test_patch_routes_the_fp16_linear_layers_and_undo_restores_the_model_exactly():
    m = model()
    x = inputs()
    before, ref = snapshot(m), m(x)
    handle = l2gen.patch(m)
    assert sorted(handle.layers) == ["body.0.down", "body.0.up", "body.1.down", "body.1.up"]  # the tied one once
    assert all(type(mod) is l2gen.nn.Linear for mod in handle.layers.values())
    assert type(m.body[2]) is Scaled and type(m.head) is nn.Linear and m.tied is m.body[0].up
    patched = snapshot(m)
    assert same(before, patched, "parameters", "state")
    assert [i for _, i, _ in patched["modules"]] == [i for _, i, _ in before["modules"]]  # the same module objects
    assert torch.equal(m(x), ref)  # nothing serves on the CPU: torch's own result, bitwise
    handle.undo()
    assert same(before, snapshot(m)) and torch.equal(m(x), ref)
    handle.undo()  # a second undo does nothing
    assert same(before, snapshot(m))


def test_patch_as_a_context_manager_undoes_on_exit_and_on_error():
    m = model()
    before = snapshot(m)
    with l2gen.patch(m) as handle:
        assert type(m.body[1].up) is l2gen.nn.Linear and len(handle.layers) == 4
    assert same(before, snapshot(m))
    with pytest.raises(KeyError):
        with l2gen.patch(m):
            raise KeyError("boom")
    assert same(before, snapshot(m))


def test_a_model_with_no_fp16_linear_layers_gets_a_warning_and_is_unchanged():
    m = model(torch.float32)
    before = snapshot(m)
    with pytest.warns(UserWarning, match="no fp16 nn.Linear layers; the model is unchanged"):
        handle = l2gen.patch(m)
    assert handle.layers == {} and same(before, snapshot(m))
    with pytest.warns(UserWarning):
        with l2gen.patch(nn.ReLU()):
            pass
    with pytest.raises(TypeError, match="torch.nn.Module"):
        l2gen.patch(lambda x: x)


def test_nested_patches_undo_only_their_own_layers():
    m = model()
    outer = l2gen.patch(m)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        inner = l2gen.patch(m)  # already routed: nothing of its own
    assert inner.layers == {} and len(seen) == 1
    inner.undo()
    assert type(m.body[0].up) is l2gen.nn.Linear
    outer.undo()
    assert type(m.body[0].up) is nn.Linear


def test_l2gen_linear_is_a_drop_in():
    torch.manual_seed(0)
    ours = l2gen.nn.Linear(64, 32, dtype=torch.float16)
    theirs = nn.Linear(64, 32, dtype=torch.float16)
    theirs.load_state_dict(ours.state_dict())
    assert isinstance(ours, nn.Linear) and repr(ours) == repr(theirs)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    x = inputs()
    assert torch.equal(ours(x), theirs(x))


def test_a_patched_model_compiles_with_no_graph_break():
    torch._dynamo.reset()
    m, x = model(), inputs()
    with l2gen.patch(m):
        explained = torch._dynamo.explain(m)(x)
        assert explained.graph_break_count == 0 and explained.graph_count == 1
        assert explained.graphs[0].code.count("torch.ops.l2gen.mm(") == 4
        compiled = torch.compile(m, fullgraph=True, backend="eager")
        assert torch.equal(compiled(x), m(x))


def train(m, steps=3):
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for step in range(steps):
        opt.zero_grad()
        loss = m(inputs(torch.float32) * (step + 1)).pow(2).mean()
        loss.backward()
        opt.step()
    return loss.detach(), {k: v.detach().clone() for k, v in m.state_dict().items()}


def test_a_patched_model_trains_as_the_unpatched_one_does():
    """Patched while fp16, then cast to fp32 (a layer keeps its class): the forward is
    then torch's own, bitwise, so the steps compare l2gen's backward with torch's."""
    plain, routed = model(), model()
    with l2gen.patch(routed):
        routed.float()
        loss, state = train(routed)
        assert type(routed.body[0].up) is l2gen.nn.Linear
    loss_ref, state_ref = train(plain.float())
    assert torch.allclose(loss, loss_ref, rtol=1e-5)
    assert all(torch.allclose(state[k], state_ref[k], rtol=1e-4, atol=1e-6) for k in state)


def test_a_patched_model_serves_its_layers_through_the_dispatcher(served_on_cpu):
    """With 64 tokens, the first layer is a 64x256x512 GEMM, which the served_on_cpu
    database serves; nothing serves the second (64x64x256)."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(512, 256, dtype=torch.float16), nn.ReLU(), nn.Linear(256, 64, dtype=torch.float16))
    x = torch.randn(4, 16, 512).half()
    ref = m(x)
    with l2gen.patch(m):
        y = m(x)
        y.float().sum().backward()
    assert [(l["layout"], l["mnk"], l["ldb"]) for l in served_on_cpu.launches] == [(BLayout.NK, (64, 256, 512), 512)]
    assert torch.allclose(y.float(), ref.float(), rtol=1e-2, atol=1e-2)
    assert m[0].weight.grad is not None and m[0].weight.grad.shape == (256, 512)
