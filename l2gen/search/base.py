"""The policy interface and the rewards shared by every part of the search (the shape
and measurement records it speaks of are :mod:`l2gen.problem`'s)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol, Sequence

from ..ir import Program
from ..problem import Measurement, Shape


@dataclass
class Proposal:
    """What a policy hands the search: a program and, optionally, why."""

    program: Program
    note: str = ""
    meta: dict = field(default_factory=dict)  # policy-private (e.g. sampled action indices)


class Policy(Protocol):
    """Proposes programs for a shape and learns from measured rewards."""

    name: str

    def propose(
        self, shape: Shape, history: Sequence[Measurement], n: int
    ) -> list[Proposal]: ...

    def update(self, shape: Shape, results: Sequence[tuple[Proposal, Measurement]]) -> None: ...


# Rewards the search optimizes: log speedup over cuBLAS-best for a verified program; a
# constant penalty for one that failed to build, launch or verify (or timed out); a
# milder one for a program the checker rejected (it cost nothing to find out).
REWARD_FAILED = -1.0
REWARD_REJECTED = -0.5


def reward(measurement: Measurement) -> float:
    """The reward of one measurement (see REWARD_FAILED and REWARD_REJECTED)."""
    if measurement.status == "rejected":
        return REWARD_REJECTED
    speedup = measurement.speedup
    if speedup is None:
        return REWARD_FAILED
    return math.log(speedup)
