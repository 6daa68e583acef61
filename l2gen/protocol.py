"""Protocols: how a time was taken, recorded with it, so that only like is compared with like.

A measurement's protocol has two parts.

**The L2 state before each timed run** (``l2``):

- ``clean`` (the default): the L2 holds clean lines of other data, as it does for a model
  layer whose predecessor read its own weights. A read pass over a buffer of at least
  4x the L2 (:mod:`l2gen.probes`) runs on the timed stream before each run; the writes of
  the previous run are written back during that pass, not during the timed kernel.
- ``dirty``: a *written* flush (a memset of the same buffer size) before each run. It leaves
  the L2 full of dirty lines that the timed kernel must write back while it reads; no model
  layer sees that, and it slows memory-bound kernels (measured in bench/results/README.md,
  "How the numbers are made"). Every l2gen measurement made before the protocol was
  recorded used it, so a results file or a database row without the field is ``dirty``
  (:data:`LEGACY_L2`).
- ``warm``: no flush (inputs left in the L2 by the previous run), for completeness.

**The mode** (``mode``): how the calls are issued.

- ``events`` (the default): flush, event, one call, event; the median of many such runs.
- ``graph``: N calls back to back captured in one CUDA graph, inputs rotated among copies
  that together exceed the L2; time per call = replay time / N. How inference engines run
  GEMMs. The L2 protocol applies before each replay.
- ``server``: calls arrive with exponential gaps at ``qps`` per second (the host sleeps
  between calls, the flush runs in the gap); per call, event time and synchronized host
  wall time.

Ratios measured under different protocols are not comparable: :func:`require_comparable`
refuses them. A shape's floor (:class:`Floors`) is recorded with the protocol it was
measured under.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

L2_PROTOCOLS = ("clean", "dirty", "warm")
MODES = ("events", "graph", "server")
DEFAULT_L2 = "clean"
LEGACY_L2 = "dirty"  # what a record without an "l2" field was measured with
DEFAULT_MODE = "events"
DEFAULT_QPS = 100.0
DEFAULT_GRAPH_CALLS = 100  # the most calls one graph replays (fewer for slow shapes)


class ProtocolError(ValueError):
    """A protocol that does not exist or does not make sense (an unknown mode, qps <= 0)."""


class ProtocolMismatch(ValueError):
    """Two things measured under different protocols were about to be compared."""


def check_l2(l2: str) -> str:
    """``l2`` if it names an L2 protocol, else :class:`ProtocolError`."""
    if l2 not in L2_PROTOCOLS:
        raise ProtocolError(f"unknown L2 protocol {l2!r} (known: {', '.join(L2_PROTOCOLS)})")
    return l2


def l2_of(record: Mapping) -> str:
    """The L2 protocol a results file, an export or a row was measured with: its ``l2``
    field, or :data:`LEGACY_L2` where it has none (it predates the field)."""
    value = record.get("l2")
    return LEGACY_L2 if value is None else check_l2(value)


@dataclass(frozen=True)
class Protocol:
    """How a run timed its calls (see the module docstring). ``qps`` only in server mode,
    ``graph_calls`` (the most calls per graph) only in graph mode; ``seed`` orders the
    server mode's calls and draws its gaps."""

    mode: str = DEFAULT_MODE
    l2: str = DEFAULT_L2
    qps: float | None = None
    graph_calls: int | None = None
    seed: int = 0

    def __post_init__(self):
        if self.mode not in MODES:
            raise ProtocolError(f"unknown timing mode {self.mode!r} (known: {', '.join(MODES)})")
        check_l2(self.l2)
        if self.mode == "server":
            if self.qps is None:
                object.__setattr__(self, "qps", DEFAULT_QPS)
            if not (isinstance(self.qps, (int, float)) and math.isfinite(self.qps) and self.qps > 0):
                raise ProtocolError(f"--qps must be a positive number of calls per second, got {self.qps}")
            object.__setattr__(self, "qps", float(self.qps))
        elif self.qps is not None:
            raise ProtocolError(f"--qps sets the arrival rate of server mode; this is {self.mode} mode")
        if self.mode == "graph":
            if self.graph_calls is None:
                object.__setattr__(self, "graph_calls", DEFAULT_GRAPH_CALLS)
            if not (isinstance(self.graph_calls, int) and self.graph_calls >= 1):
                raise ProtocolError(f"--graph-calls must be a positive number of calls, got {self.graph_calls}")
        elif self.graph_calls is not None:
            raise ProtocolError(f"--graph-calls sets the calls per graph of graph mode; this is {self.mode} mode")

    def to_dict(self) -> dict:
        """The fields a results file carries at its top level."""
        out: dict = {"mode": self.mode, "l2": self.l2}
        if self.mode == "server":
            out.update(qps=self.qps, seed=self.seed)
        if self.mode == "graph":
            out["graph_calls"] = self.graph_calls
        return out

    @classmethod
    def of(cls, record: Mapping, *, missing_l2: str = LEGACY_L2) -> "Protocol":
        """The protocol of a results file: missing fields read as the protocol every
        earlier file was measured with (events mode, a written flush). A worker task, which
        is made now, passes ``missing_l2=DEFAULT_L2``."""
        l2 = record.get("l2")
        return cls(record.get("mode") or DEFAULT_MODE, missing_l2 if l2 is None else l2, record.get("qps"),
                   record.get("graph_calls"), int(record.get("seed") or 0))

    def describe(self) -> str:
        extra = ""
        if self.mode == "server":
            extra = f" at {self.qps:g} calls/s"
        elif self.mode == "graph":
            extra = f" (up to {self.graph_calls} calls per graph)"
        return f"{self.mode} mode{extra}, l2 {self.l2}"

    def comparable(self, other: "Protocol") -> bool:
        """Whether ratios measured under the two can be compared (the seed aside)."""
        return (self.mode, self.l2, self.qps, self.graph_calls) == (other.mode, other.l2, other.qps, other.graph_calls)


def require_comparable(first: Protocol, second: Protocol, names: tuple[str, str] = ("first", "second")) -> None:
    """Raise :class:`ProtocolMismatch`, naming both, unless the two protocols compare."""
    if not first.comparable(second):
        raise ProtocolMismatch(
            f"{names[0]} was timed in {first.describe()}, {names[1]} in {second.describe()}: ratios measured "
            "under different protocols are not comparable (re-measure one of them under the other's protocol)")


# ---- the floor ------------------------------------------------------------------------


@dataclass(frozen=True)
class Floors:
    """What bounds a GEMM's time from below in one run: the launch floor (an empty kernel's
    time under the run's protocol and mode), the stream rate and the fp16 peak, each
    measured in that run where it could be (``*_source`` says how it was had)."""

    launch_us: float | None
    stream_tbs: float
    peak_tflops: float
    launch_source: str
    stream_source: str
    peak_source: str

    def floor_us(self, m: int, n: int, k: int) -> float:
        """``max(launch floor, bytes / stream rate, FLOPs / peak)`` for C = A @ B in fp16."""
        compute = 2.0 * m * n * k / (self.peak_tflops * 1e6)
        memory = 2.0 * (m * k + k * n + m * n) / (self.stream_tbs * 1e6)
        return max(self.launch_us or 0.0, compute, memory)

    def to_dict(self) -> dict:
        return {"launch_floor_us": self.launch_us, "stream_tbs": self.stream_tbs, "peak_tflops": self.peak_tflops,
                "launch_source": self.launch_source, "stream_source": self.stream_source,
                "peak_source": self.peak_source}

    @classmethod
    def from_dict(cls, d: Mapping) -> "Floors":
        """The inverse of :meth:`to_dict`: a results file's ``"floors"``."""
        return cls(d.get("launch_floor_us"), d["stream_tbs"], d["peak_tflops"],
                   d.get("launch_source", ""), d.get("stream_source", ""), d.get("peak_source", ""))

    @classmethod
    def from_gpu(cls, gpu, why: str = "not measured") -> "Floors":
        """The target record's constants (:mod:`l2gen.targets`), no launch floor."""
        note = f"{gpu.name} constant in targets.py ({why})"
        return cls(None, gpu.bandwidth_tbs, gpu.peak_tflops_fp16, f"none ({why})", note, note)

    @classmethod
    def from_probe(cls, probe: Mapping, gpu) -> "Floors":
        """From a worker's probe result (:func:`l2gen.measure.execute`, kind "probe"); what it
        could not measure comes from the target record, with a note saying why."""
        fallback = cls.from_gpu(gpu, probe.get("error") or "not measured")
        launch, stream, peak = probe.get("launch_floor_us"), probe.get("stream_tbs"), probe.get("peak_tflops")
        peak_note = f"{gpu.name} constant in targets.py ({probe.get('peak_error') or probe.get('error') or 'not measured'})"
        return cls(launch if _positive(launch) else None,
                   stream if _positive(stream) else fallback.stream_tbs,
                   peak if _positive(peak) else fallback.peak_tflops,
                   probe.get("launch_source") if _positive(launch) else fallback.launch_source,
                   probe.get("stream_source") if _positive(stream) else fallback.stream_source,
                   probe.get("peak_source") if _positive(peak) else peak_note)


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0
