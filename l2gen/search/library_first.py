"""Library first: a shape's first measurements are knob settings of already-built libraries.

:class:`LibraryFirst` wraps any policy. For each shape it first proposes the kernel
library's knob settings (:func:`l2gen.search.library.ranked`: each configuration's best setting
by a cost model, then the next best; the model learned from measurements where there are
enough, else the analytic one), up to a share of the shape's budget; then it
hands the shape to the policy it wraps. With the library built beforehand (``l2gen build
--library``, the same cache) those proposals are cache hits: a launch each, no compile.
The wrapped policy sees every result (as edits of known programs, not as its own draws),
so it learns from them and starts its own proposals from the best of them.
"""

from __future__ import annotations

from typing import Sequence

from ..ir import BLayout, Program
from ..problem import Measurement, Shape, program_key
from ..targets import Gpu
from .base import Policy, Proposal
from .library import ranked

LIBRARY_KIND = "library"


class LibraryFirst:
    """``inner``'s proposals, preceded for every shape by up to ``share`` × ``budget``
    knob settings of ``programs`` (the library) for it, ranked by ``model`` (a
    :class:`~l2gen.search.learned.LearnedModel`) where given, else by the analytic model."""

    def __init__(self, inner: Policy, programs: Sequence[Program], gpu: Gpu, *, budget: int, share: float = 0.5,
                 b_layout: BLayout | None = None, model=None):
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"library share {share} is not between 0 and 1")
        self.inner = inner
        self.programs = list(programs)
        self.gpu = gpu
        self.quota = int(budget * share)
        self.b_layout = b_layout
        self.model = model  # a LearnedModel ranks the settings where given; else the analytic model
        self.name = inner.name  # the database and the curves name the run by the policy it wraps
        self._issued: dict[Shape, int] = {}

    def __getattr__(self, attr):  # prime, state, stats, ...: the wrapped policy's
        if attr == "inner":
            raise AttributeError(attr)
        return getattr(self.inner, attr)

    def propose(self, shape: Shape, history: Sequence[Measurement], n: int) -> list[Proposal]:
        left = min(n, self.quota - self._issued.get(shape, 0))
        proposals: list[Proposal] = []
        if left > 0:
            measured = {program_key(m.program) for m in history}
            score = self.model.predict_us if self.model is not None else None
            for program in ranked(self.programs, shape, self.gpu, left, b_layout=self.b_layout, exclude=measured, score=score):
                proposals.append(Proposal(program, "a knob setting of the kernel library", {"kind": LIBRARY_KIND}))
            self._issued[shape] = self._issued.get(shape, 0) + len(proposals)
        if len(proposals) < n:
            proposals += self.inner.propose(shape, history, n - len(proposals))
        return proposals

    def update(self, shape: Shape, results: Sequence[tuple[Proposal, Measurement]]) -> None:
        self.inner.update(shape, results)
