"""New configurations only where the cost model expects a gain.

A proposal that needs a compile (anything but a knob setting of the kernel library, which
``l2gen build --library`` built beforehand) costs 30–60 s of nvcc before its first launch.
:class:`ModelGated` wraps any policy and lets such a proposal through only where the cost
model predicts it at most ``slack`` slower than the shape's best measured program, both
predicted by the same model, so that the model's bias on the shape cancels. Before a shape
has a verified measurement nothing is gated; library settings and proposals the policy
already diagnosed pass as they are. When the wrapped policy, asked a few times, has nothing
the model expects to gain, the batch comes back short (or empty), and the search stops the
shape there (:meth:`stop_note` says why): the GPU time goes to shapes that can still gain.
"""

from __future__ import annotations

from typing import Callable, Sequence

from ..ir import Program
from ..problem import Measurement, Shape, Status
from ..targets import Gpu
from .base import Policy, Proposal
from .library_first import LIBRARY_KIND
from .simulate import model_us

ASKS = 4  # times the wrapped policy is asked for a batch before a short one is returned


class ModelGated:
    """``inner``'s proposals, those needing a compile kept only where ``score`` (predicted µs
    of programs on a shape; default the analytic model) expects at most ``slack`` above the
    prediction for the shape's best measured program."""

    def __init__(self, inner: Policy, gpu: Gpu, *, slack: float = 0.05,
                 score: Callable[[Sequence[Program], Shape], Sequence[float]] | None = None):
        if not slack >= 0.0:
            raise ValueError(f"gate slack {slack} is not a fraction >= 0")
        self.inner = inner
        self.gpu = gpu
        self.slack = slack
        self.score = score
        self.name = inner.name  # the database and the curves name the run by the policy it wraps
        self.gated: dict[Shape, int] = {}  # proposals left out (their compile saved), per shape

    def __getattr__(self, attr):  # prime, state, stats, model, quota, ...: the wrapped policy's
        if attr == "inner":
            raise AttributeError(attr)
        return getattr(self.inner, attr)

    def _predict(self, programs: Sequence[Program], shape: Shape) -> list[float]:
        if self.score is not None:
            return list(self.score(programs, shape))
        return [model_us(p, shape, self.gpu) for p in programs]

    def bar_us(self, shape: Shape, history: Sequence[Measurement]) -> float | None:
        """The most µs the model may predict for a proposal that needs a compile: its
        prediction for the shape's fastest verified program, plus ``slack``; None before
        there is one."""
        ok = [m for m in history if m.status == Status.OK and m.time_us is not None]
        if not ok:
            return None
        best = min(ok, key=lambda m: m.time_us)
        return self._predict([best.program], shape)[0] * (1.0 + self.slack)

    def propose(self, shape: Shape, history: Sequence[Measurement], n: int) -> list[Proposal]:
        bar = self.bar_us(shape, history)
        out: list[Proposal] = []
        for _ in range(ASKS):
            if len(out) >= n:
                break
            proposals = self.inner.propose(shape, history, n - len(out))
            if not proposals:
                break
            if bar is None:  # nothing to compare with yet: the batch as proposed
                return proposals[:n]
            compiled = [p for p in proposals if not _free(p)]
            times = self._predict([p.program for p in compiled], shape) if compiled else []
            slow = {id(p) for p, us in zip(compiled, times) if us > bar}
            out += [p for p in proposals if id(p) not in slow]
            self.gated[shape] = self.gated.get(shape, 0) + len(slow)
        return out[:n]

    def update(self, shape: Shape, results: Sequence[tuple[Proposal, Measurement]]) -> None:
        self.inner.update(shape, results)

    def stop_note(self, shape: Shape) -> str | None:
        """Why a shape whose batches came back empty stopped, where the gate is the reason."""
        left = self.gated.get(shape, 0)
        if not left:
            return None
        return (f"no new configuration the cost model expects within {self.slack:.0%} of the best "
                f"({left} proposals left out uncompiled)")


def _free(proposal: Proposal) -> bool:
    """A proposal measured without a compile of its own (a library knob setting) or
    already diagnosed by the policy: never gated."""
    return proposal.meta.get("kind") == LIBRARY_KIND or bool(proposal.meta.get("rejected"))
