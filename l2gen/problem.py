"""The nouns every stage shares: a GEMM shape, a measured candidate, its status, and a
program's identity.

This module sits below everything that uses it (the bench, the search, the database, the
dispatcher), so none of them has to import another to speak of a shape or a measurement.
"""

from __future__ import annotations

import enum
import functools
import hashlib
from dataclasses import dataclass, replace

from .ir import Program
from .protocol import DEFAULT_L2

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


def unserved(shape: Shape) -> str | None:
    """Why no l2gen program serves a shape, or None. Every program serves any M, and N
    and K multiples of 8: rows of A (lda = K), B and C (ldb, ldc = N for B stored K x N)
    must start 16-byte aligned (the templates' problem rule)."""
    if min(shape.m, shape.n, shape.k) <= 0:
        return f"shape {shape} has a non-positive dimension"
    if shape.k % 8:
        return f"shape {shape}: K = {shape.k} is not a multiple of 8 (16-byte rows of A)"
    if shape.n % 8:
        return f"shape {shape}: N = {shape.n} is not a multiple of 8 (16-byte rows of B and C)"
    return None


class Status(enum.StrEnum):
    """How a measurement ended. The values are what the database and the results files
    store; a :class:`Measurement`'s ``status`` is one of them."""

    OK = "ok"
    REJECTED = "rejected"  # the checker (or the shape rule) refused the program
    BUILD_ERROR = "build_error"  # lowering or nvcc failed
    RUN_ERROR = "run_error"  # the launch failed, or the run could not be judged
    WRONG = "wrong"  # verification failed
    TIMEOUT = "timeout"

    @classmethod
    def of(cls, verdict: object) -> "Status":
        """The status of a finer verdict: a worker's per-runner word or a bench row's. A
        run that escaped the timed stream, could not be captured, or whose runner was
        unavailable has no time to rank: anything that is not a status is a run_error."""
        try:
            return cls(verdict)
        except ValueError:
            return cls.RUN_ERROR


STATUSES = tuple(s.value for s in Status)


@dataclass(frozen=True)
class Measurement:
    """One measured candidate: a program (with the knobs it ran with) on one shape.

    ``status`` is one of :data:`STATUSES` (see :class:`Status`). ``time_us`` and
    ``speedup`` are None unless ok. ``l2`` is the L2 protocol it was timed under
    (:mod:`l2gen.protocol`). ``sustained``: where the run also timed calls back to back in
    rotated blocks (``--sustained``), the program's, cuBLAS-best's and torch.matmul's time
    per call there (µs; torch None if it did not run); the database judges a program by the
    less favourable of that and one call at a time (:meth:`l2gen.db.KernelDB.add_back_to_back`).
    """

    shape: Shape
    program: Program
    status: str
    time_us: float | None = None
    baseline_us: float | None = None  # cuBLAS-best for the shape, same run
    relerr: float | None = None
    error: str | None = None
    l2: str = DEFAULT_L2
    fallback_us: float | None = None  # torch.matmul for the shape (the dispatcher's fallback), same run
    sustained: tuple[float, float, float | None] | None = None  # back to back: program, cuBLAS-best, torch µs

    @property
    def speedup(self) -> float | None:
        if self.status != "ok" or not self.time_us or not self.baseline_us:
            return None
        return self.baseline_us / self.time_us


@functools.lru_cache(maxsize=1 << 16)
def program_key(program: Program) -> str:
    """sha256 of the program's canonical text with the name normalized.

    The name is cosmetic: two programs that differ only in name build the same kernel,
    so they share a key (the database and the policies' deduplication use it).
    """
    from .printer import format_program

    text = format_program(replace(program, name="k"))
    return hashlib.sha256(text.encode()).hexdigest()
