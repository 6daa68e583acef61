"""Tuning under a cap on the SMs: every measured program keeps its launches to at most
``grid`` CTAs (the knob ``grid``), as a dispatcher made with the same cap will serve it.

:class:`GridCapped` wraps any policy (the library first, the embedded policy, the LLM):
each proposal is capped (:func:`l2gen.space.cap_grid`: its persistent grid lowered to the
cap, whole clusters) or, where its kernel launches a CTA per tile and cannot keep to a cap,
left out, and the wrapped policy is asked again, a few times, to fill the batch. The wrapped
policy learns from what was measured: the capped programs.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from ..problem import Measurement, Shape, program_key
from ..space import cap_grid
from .base import Policy, Proposal

ASKS = 4  # times the wrapped policy is asked for a batch before a short one is returned


class GridCapped:
    """``inner``'s proposals, each kept to at most ``grid`` CTAs or left out."""

    def __init__(self, inner: Policy, grid: int):
        if grid <= 0:
            raise ValueError(f"grid {grid}: a cap is a positive count of CTAs")
        self.inner = inner
        self.grid = grid
        self.name = inner.name  # the database and the curves name the run by the policy it wraps
        self.left_out = 0  # proposals whose kernels cannot keep to the cap

    def __getattr__(self, attr):  # prime, state, stats, model, quota, ...: the wrapped policy's
        if attr == "inner":
            raise AttributeError(attr)
        return getattr(self.inner, attr)

    def propose(self, shape: Shape, history: Sequence[Measurement], n: int) -> list[Proposal]:
        seen = {program_key(m.program) for m in history}
        out: list[Proposal] = []
        for _ in range(ASKS):
            if len(out) >= n:
                break
            for proposal in self.inner.propose(shape, history, n - len(out)):
                try:
                    program = cap_grid(proposal.program, self.grid)
                except ValueError:
                    self.left_out += 1
                    continue
                key = program_key(program)
                if key not in seen:
                    seen.add(key)
                    out.append(replace(proposal, program=program))
        return out[:n]

    def update(self, shape: Shape, results: Sequence[tuple[Proposal, Measurement]]) -> None:
        self.inner.update(shape, results)
