"""What crosses the worker boundary, as records: a measure task going in, each runner's
result and the task's result coming back.

The worker speaks JSON lines (:mod:`l2gen.worker`); this module is the one place that
turns these records into that JSON and back (``to_wire`` / ``from_wire``). The wire form
of a measure task::

    {"kind": "measure", "m": M, "n": N, "k": K, "b_layout": "kn",
     "candidates": [{"name", "library", "entry", "program_text" (optional: checked
                     against the library's E_program), "knobs": {"raster", "swizzle",
                     "splits", "decomposition"} (optional: the defaults)}],
     "baselines": ["torch_matmul", "cublas", ...]  (optional),
     "shim": path of the cuBLAS shim (optional: built or found in the cache),
     "probes": path of the timing probes library (optional: likewise),
     "l2": "clean" | "dirty" | "warm" (default clean), "mode": "events" | "graph" |
     "server" (default events), "qps" and "seed" (server), "graph_calls" (graph),
     "seeds": 3, "reps": 50, "warmup": 5, "rounds": 1}

(:meth:`MeasureTask.from_wire` also takes a single candidate inline: "library",
"entry", ... at the top level; and the shape as "shape": [M, N, K] or "MxNxK".)

Its result: ``{"status", "error", "device", "protocol", "candidates": [per candidate],
"baselines": {name: per baseline}}``; per candidate or baseline ``{"name", "status" ("ok",
"wrong", "run_error", "escaped", "capture_error", "unavailable", "timeout"), "time_us",
"relerr", "error", "escaped", "event_vs_wall": {...}}``, and in graph or server mode that
mode's figures (``"graph"``, ``"server"``). With a single candidate, its fields are also
at the top level. A result the worker could not finish (it crashed, hung or could not
start) has only ``status``, ``error`` and ``last_note``, the last thing it said it was
doing. A "probe" task (:class:`ProbeTask`) measures the run's floors (:mod:`l2gen.floors`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from .ir import Decomposition, Knobs, Raster
from .problem import Shape, Status
from .protocol import DEFAULT_L2, Protocol

DEFAULT_REPS = 50
DEFAULT_WARMUP = 5


def knobs_to_dict(knobs: Knobs) -> dict:
    out = {"raster": knobs.raster.value, "swizzle": knobs.swizzle, "splits": knobs.splits,
           "decomposition": knobs.decomposition.value}
    if knobs.pdl:
        out["pdl"] = True
    if knobs.grid:
        out["grid"] = knobs.grid
    return out


def knobs_from_dict(d: Mapping | None) -> Knobs:
    if not d:
        return Knobs()
    return Knobs(raster=Raster(d.get("raster", "heuristic")), swizzle=int(d.get("swizzle", 0)),
                 splits=int(d.get("splits", 1)),
                 decomposition=Decomposition(d.get("decomposition", "heuristic")),
                 pdl=bool(d.get("pdl", False)), grid=int(d.get("grid", 0)))


@dataclass(frozen=True)
class Candidate:
    """A built program to verify and time: its library, the entry symbol, the build
    program's canonical text (checked against the library's own, None: not checked) and
    the knobs to launch it with."""

    name: str
    library: str
    entry: str
    program_text: str | None = None
    knobs: Knobs = Knobs()

    def to_wire(self) -> dict:
        out = {"name": self.name, "library": self.library, "entry": self.entry, "knobs": knobs_to_dict(self.knobs)}
        if self.program_text is not None:
            out["program_text"] = self.program_text
        return out

    @classmethod
    def from_wire(cls, d: Mapping) -> "Candidate":
        return cls(str(d.get("name", d.get("entry", "candidate"))), str(d["library"]), str(d["entry"]),
                   d.get("program_text"), knobs_from_dict(d.get("knobs")))


@dataclass(frozen=True)
class MeasureTask:
    """One shape's measurement: every candidate and baseline verified on ``seeds`` input
    sets, then the verified ones timed interleaved under ``protocol``, ``reps`` runs per
    median in each of ``rounds`` rounds (None: the executor's default seeds)."""

    shape: Shape
    candidates: tuple[Candidate, ...] = ()
    baselines: tuple[str, ...] = ()
    b_layout: str = "kn"
    protocol: Protocol = Protocol()
    shim: str | None = None
    probes: str | None = None
    seeds: int | None = None
    reps: int = DEFAULT_REPS
    warmup: int = DEFAULT_WARMUP
    rounds: int = 1
    sustained_us: float = 0.0  # > 0: also each runner's time per call in blocks this long, back to back

    def to_wire(self) -> dict:
        out = {"kind": "measure", "m": self.shape.m, "n": self.shape.n, "k": self.shape.k,
               "b_layout": self.b_layout, "candidates": [c.to_wire() for c in self.candidates],
               "baselines": list(self.baselines), "shim": self.shim, "probes": self.probes,
               "reps": self.reps, "warmup": self.warmup, "rounds": self.rounds, **self.protocol.to_dict()}
        if self.seeds is not None:
            out["seeds"] = self.seeds
        if self.sustained_us > 0:
            out["sustained_us"] = self.sustained_us
        return out

    @classmethod
    def from_wire(cls, d: Mapping) -> "MeasureTask":
        """A task from its wire form, the shorthands expanded (a single candidate inline,
        the shape as "shape"); a missing L2 protocol is today's default."""
        if "shape" in d:  # [m, n, k] or "MxNxK"
            shape = d["shape"]
            m, n, k = (int(x) for x in (shape.lower().split("x") if isinstance(shape, str) else shape))
        else:
            m, n, k = int(d["m"]), int(d["n"]), int(d["k"])
        if "candidates" in d:
            candidates = tuple(Candidate.from_wire(c) for c in d["candidates"])
        elif "library" in d:
            candidates = (Candidate.from_wire(d),)
        else:
            candidates = ()
        seeds = d.get("seeds")
        return cls(Shape(m, n, k), candidates, tuple(d.get("baselines") or ()), d.get("b_layout", "kn"),
                   Protocol.of(d, missing_l2=DEFAULT_L2), d.get("shim"), d.get("probes"),
                   None if seeds is None else int(seeds), int(d.get("reps", DEFAULT_REPS)),
                   int(d.get("warmup", DEFAULT_WARMUP)), max(1, int(d.get("rounds", 1))),
                   max(0.0, float(d.get("sustained_us", 0.0))))


@dataclass(frozen=True)
class ProbeTask:
    """Measure the run's floors under ``protocol`` (:mod:`l2gen.floors`)."""

    protocol: Protocol = Protocol()
    shim: str | None = None
    probes: str | None = None
    reps: int = DEFAULT_REPS

    def to_wire(self) -> dict:
        return {"kind": "probe", **self.protocol.to_dict(), "shim": self.shim, "probes": self.probes, "reps": self.reps}


_RUN_FIELDS = ("name", "status", "time_us", "relerr", "error", "baselines")


@dataclass(frozen=True)
class RunResult:
    """How one runner (a candidate or a baseline) fared. ``verdict`` is the worker's word
    (ok, wrong, run_error, escaped, capture_error, unavailable, timeout) or the runner's
    before it (rejected, build_error); :attr:`status` is its :class:`Status`. ``figures``
    holds everything else reported (event_vs_wall, spread, reps, round_us, graph, server,
    the auto-tune's finalists, ...); ``baselines``, for a candidate that was timed alone
    after a fault, the baselines it was timed against."""

    name: str
    verdict: str
    time_us: float | None = None
    relerr: float | None = None
    error: str | None = None
    figures: Mapping[str, Any] = field(default_factory=dict)
    baselines: Mapping[str, "RunResult"] | None = None

    @property
    def status(self) -> Status:
        return Status.of(self.verdict)

    @property
    def ok(self) -> bool:
        return self.verdict == Status.OK

    @classmethod
    def failed(cls, name: str, verdict: str, error: str | None) -> "RunResult":
        return cls(name, verdict, error=error)

    def to_wire(self) -> dict:
        out = {"name": self.name, "status": self.verdict, "time_us": self.time_us, "relerr": self.relerr,
               "error": self.error, **self.figures}
        if self.baselines is not None:
            out["baselines"] = {n: b.to_wire() for n, b in self.baselines.items()}
        return out

    @classmethod
    def from_wire(cls, d: Mapping, name: str | None = None) -> "RunResult":
        base = d.get("baselines")
        return cls(str(d.get("name", name or "")), str(d.get("status") or Status.RUN_ERROR), d.get("time_us"),
                   d.get("relerr"), d.get("error"), MappingProxyType({k: v for k, v in d.items() if k not in _RUN_FIELDS}),
                   None if base is None else MappingProxyType({n: cls.from_wire(b, n) for n, b in base.items()}))


def failed(name: str, status: str, error: str | None) -> dict:
    """The wire form of a runner's result with no time (the executor's failures)."""
    return dict(RunResult.failed(name, status, error).to_wire(), escaped=None, event_vs_wall=None)


@dataclass(frozen=True)
class TaskResult:
    """A measure task's outcome: ``verdict`` "ok" when the worker finished it, else how it
    ended (run_error, timeout) with ``error`` and ``last_note``; one :class:`RunResult`
    per candidate, in the task's order, and per baseline."""

    verdict: str
    error: str | None = None
    device: Mapping | None = None
    protocol: Mapping | None = None
    candidates: tuple[RunResult, ...] = ()
    baselines: Mapping[str, RunResult] = field(default_factory=dict)
    last_note: Mapping | None = None

    @property
    def ok(self) -> bool:
        return self.verdict == Status.OK

    def to_wire(self) -> dict:
        out = {"status": self.verdict, "error": self.error, "device": self.device, "protocol": self.protocol,
               "candidates": [c.to_wire() for c in self.candidates],
               "baselines": {n: b.to_wire() for n, b in self.baselines.items()}}
        if len(self.candidates) == 1:  # a single candidate's fields on top
            out.update({k: v for k, v in self.candidates[0].to_wire().items() if k not in ("name", "baselines")})
        return out

    @classmethod
    def from_wire(cls, d: Mapping) -> "TaskResult":
        return cls(str(d.get("status") or Status.RUN_ERROR), d.get("error"), d.get("device"), d.get("protocol"),
                   tuple(RunResult.from_wire(c) for c in d.get("candidates") or ()),
                   MappingProxyType({n: RunResult.from_wire(b, n) for n, b in (d.get("baselines") or {}).items()}),
                   d.get("last_note"))
