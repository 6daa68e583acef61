"""Records and the policy interface shared by every part of the search."""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass, field, replace
from typing import Protocol, Sequence

from ..ir import Program
from ..protocol import DEFAULT_L2


MAX_DIM = 2**31 - 1  # the kernels take M, N, K and leading dimensions as 32-bit ints


@dataclass(frozen=True, order=True)
class Shape:
    m: int
    n: int
    k: int

    def __str__(self) -> str:
        return f"{self.m}x{self.n}x{self.k}"

    @classmethod
    def parse(cls, text: str) -> "Shape":
        """Parse 'MxNxK' (the form the CLI takes)."""
        parts = text.lower().replace("*", "x").split("x")
        if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
            raise ValueError(f"shape '{text}' is not of the form MxNxK (e.g. 128x4096x4096)")
        if any(len(p.strip()) > 10 for p in parts):
            raise ValueError(f"shape '{text[:80]}': a dimension is out of range 1..{MAX_DIM}")
        m, n, k = (int(p) for p in parts)
        if min(m, n, k) <= 0:
            raise ValueError(f"shape '{text}' has a non-positive dimension")
        if max(m, n, k) > MAX_DIM:
            raise ValueError(f"shape '{text}': a dimension is out of range 1..{MAX_DIM}")
        return cls(m, n, k)


@dataclass(frozen=True)
class Measurement:
    """One measured candidate: a program (with the knobs it ran with) on one shape.

    ``status`` is "ok", "rejected" (checker), "build_error", "run_error", "wrong"
    (verification failed) or "timeout". ``time_us`` and ``speedup`` are None unless ok.
    ``l2`` is the L2 protocol it was timed under (:mod:`l2gen.protocol`).
    """

    shape: Shape
    program: Program
    status: str
    time_us: float | None = None
    baseline_us: float | None = None  # cuBLAS-best for the shape, same run
    relerr: float | None = None
    error: str | None = None
    l2: str = DEFAULT_L2

    @property
    def speedup(self) -> float | None:
        if self.status != "ok" or not self.time_us or not self.baseline_us:
            return None
        return self.baseline_us / self.time_us


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


@functools.lru_cache(maxsize=1 << 16)
def program_key(program: Program) -> str:
    """sha256 of the program's canonical text with the name normalized.

    The name is cosmetic: two programs that differ only in name build the same kernel,
    so they share a key (the database and the policies' deduplication use it).
    """
    from ..printer import format_program

    text = format_program(replace(program, name="k"))
    return hashlib.sha256(text.encode()).hexdigest()
