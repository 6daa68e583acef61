"""bench-dispatch's operand rotation for its wall-time loops (CPU tensors stand in)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from l2gen.dispatch_bench import _wall_times, operand_copies  # noqa: E402


def test_operand_copies_exceed_the_l2_between_uses_and_keep_bs_layout():
    a = torch.zeros(64, 1024, dtype=torch.half)
    w = torch.zeros(2048, 1024, dtype=torch.half)
    b = w.t()  # an nn.Linear weight as the product reads it
    set_bytes = 2 * (64 * 1024 + 1024 * 2048 + 64 * 2048)
    copies = operand_copies(a, b, l2_bytes=50 * 2**20, calls=500)
    assert len(copies) == 1 + -(-2 * 50 * 2**20 // set_bytes)
    assert copies[0] == (a, b)
    pointers = {(x.data_ptr(), y.data_ptr()) for x, y in copies}
    assert len(pointers) == len(copies)  # every copy at other addresses
    assert all(y.stride() == b.stride() and y.shape == b.shape for _, y in copies)
    assert len(operand_copies(a, b, l2_bytes=50 * 2**20, calls=3)) == 3  # never more than the loop's calls


def test_wall_loops_take_turns_over_the_copies(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    seen = []
    callers = {"l2gen": lambda out, a=None, b=None: seen.append(("l2gen", a)),
               "torch": lambda out, a=None, b=None: seen.append(("torch", a))}
    sets = [("a0", "b0"), ("a1", "b1"), ("a2", "b2")]
    wall, enq = _wall_times(callers, ["o0", "o1"], calls=7, rounds=1, operands=sets)
    assert [a for name, a in seen if name == "l2gen"] == ["a0", "a1", "a2", "a0", "a1", "a2", "a0"]
    assert set(wall) == {"l2gen", "torch"} and all(v >= 0 for v in enq.values())
    seen.clear()
    _wall_times(callers, ["o0", "o1"], calls=2, rounds=1)  # without copies: the caller's own operands
    assert [a for _, a in seen] == [None, None, None, None]
