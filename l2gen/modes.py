"""Timing modes beyond one call between two events: calls captured in a CUDA graph, and
calls arriving as a server sees them (see :mod:`l2gen.protocol` for what each one means).

**Graph mode** (:func:`time_graph`). Each runner's N calls are captured in one graph, call
``i`` on input copy ``i % copies``; the copies (:func:`rotation_copies`) are enough that
the calls between two uses of one copy touch :data:`ROTATE_L2_MULTIPLE` x the L2, so every
call finds its operands cold, as a GEMM in a model does. Each replay is ``flush; event;
graph; event`` on the timed stream, the runners' replays interleaved round-robin in rotated
order; a call's time is the median replay over N. A runner that cannot be captured (it
synchronizes, allocates, raises) is reported with why, and the others go on.

**Server mode** (:func:`time_server`). The calls of every runner are shuffled into one
seeded order and separated by exponential gaps of mean 1/qps (:func:`arrival_schedule`):
during a gap the host flushes the L2 by the protocol, waits for that, then sleeps the rest.
Each call is ``event; call; event`` then a device-wide synchronize, and gives an event time
and the host's wall time from before the launch to the end of the synchronize. Reported:
medians and means of both (an idle GPU takes time to wake: the mean shows the slow calls).

The device calls go through :mod:`l2gen.runtime` (``Event``, ``synchronize``,
``capture_graph``) looked up at call time, so tests run both modes on a fake device.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from .timing import median, round_robin, spread

GRAPH_REPLAYS = 20  # replays of each runner's graph; a call's time is the median over N
GRAPH_MIN_CALLS = 10  # the fewest calls a graph holds (a slow shape's graph)
GRAPH_REPLAY_US = 10_000.0  # aim a replay at about this much device time
ROTATE_L2_MULTIPLE = 2  # calls between two uses of an input copy touch this many L2s

Runner = Callable[[int], None]


# ---- graph mode -----------------------------------------------------------------------


def graph_calls_for(floor_us: float, most: int) -> int:
    """Calls per graph for a shape whose floor is ``floor_us``: about
    :data:`GRAPH_REPLAY_US` of work per replay, between :data:`GRAPH_MIN_CALLS` and
    ``most`` (and ``most`` itself if that is fewer)."""
    want = math.ceil(GRAPH_REPLAY_US / floor_us) if floor_us > 0 else most
    return max(min(GRAPH_MIN_CALLS, most), min(most, want))


def rotation_copies(set_bytes: int, l2_bytes: int, calls: int) -> int:
    """How many copies of a call's operands (``set_bytes``: A, B and C) a graph of
    ``calls`` calls rotates among: enough that the other copies used between two uses of
    one copy hold :data:`ROTATE_L2_MULTIPLE` x the L2, and no more than the calls."""
    if set_bytes <= 0:
        raise ValueError("a call's operands have no bytes")
    need = 1 + math.ceil(ROTATE_L2_MULTIPLE * l2_bytes / set_bytes)
    return max(1, min(calls, need))


@dataclass(frozen=True)
class GraphSample:
    """One runner in graph mode: each replay's event time for ``calls`` calls."""

    name: str
    calls: int
    copies: int
    replay_us: tuple[float, ...]

    @property
    def per_call_us(self) -> tuple[float, ...]:
        return tuple(t / self.calls for t in self.replay_us)

    @property
    def median_us(self) -> float:
        return median(self.per_call_us)

    def to_dict(self) -> dict:
        return {"calls": self.calls, "copies": self.copies, "replays": len(self.replay_us),
                "replay_median_us": median(self.replay_us), "spread": spread(self.replay_us)}


def time_graph(
    runner_sets: Mapping[str, Sequence[Runner]],
    stream: int,
    flush: Callable[[int], None],
    *,
    calls: int,
    replays: int = GRAPH_REPLAYS,
) -> tuple[dict[str, GraphSample], dict[str, str]]:
    """Capture each runner's ``calls`` calls in a graph (call ``i`` runs
    ``runner_sets[name][i % len]``, one runner per input copy) and time ``replays``
    replays of each, interleaved. Returns the samples and, for each runner that could not
    be captured, why (:class:`runtime.CaptureError`)."""
    from . import runtime

    if calls < 1 or replays < 1:
        raise ValueError("graph mode needs at least one call and one replay")
    graphs: dict[str, object] = {}
    failures: dict[str, str] = {}
    for name, runners in runner_sets.items():
        def enqueue(h, runners=runners):
            for i in range(calls):
                runners[i % len(runners)](h)
        try:
            graphs[name] = runtime.capture_graph(stream, enqueue)
        except runtime.CaptureError as exc:
            failures[name] = f"cannot be captured in a CUDA graph: {exc}"
    names = list(graphs)
    try:
        for name in names:  # the first launch uploads the graph
            graphs[name].launch(stream)
        runtime.synchronize()
        times = round_robin({name: graphs[name].launch for name in names}, stream, flush, replays)
    finally:
        for graph in graphs.values():
            _quietly(graph.destroy)
    samples = {name: GraphSample(name, calls, len(runner_sets[name]), tuple(times[name])) for name in names}
    return samples, failures


# ---- server mode ----------------------------------------------------------------------


@dataclass(frozen=True)
class Arrival:
    """One call of a server-mode run: which runner, after how long a gap."""

    name: str
    gap_s: float


def arrival_schedule(names: Sequence[str], calls_each: int, qps: float, seed: int = 0) -> list[Arrival]:
    """Every runner ``calls_each`` times in a seeded random order, each call after an
    exponential gap of mean ``1 / qps`` seconds (a Poisson arrival process)."""
    if qps <= 0 or not math.isfinite(qps):
        raise ValueError(f"qps must be a positive number of calls per second, got {qps}")
    rng = random.Random(seed)
    order = [name for name in names for _ in range(calls_each)]
    rng.shuffle(order)
    return [Arrival(name, rng.expovariate(qps)) for name in order]


def schedule_stats(schedule: Sequence[Arrival]) -> dict:
    """What a schedule promises: calls per runner, mean gap, the gaps' coefficient of
    variation (1 for exponential gaps), and the arrival rate."""
    gaps = [a.gap_s for a in schedule]
    counts: dict[str, int] = {}
    for a in schedule:
        counts[a.name] = counts.get(a.name, 0) + 1
    mean = statistics.fmean(gaps) if gaps else 0.0
    cv = statistics.pstdev(gaps) / mean if len(gaps) > 1 and mean else 0.0
    return {"calls": len(schedule), "per_runner": counts, "mean_gap_s": mean, "cv": cv,
            "rate_qps": 1.0 / mean if mean else 0.0}


@dataclass(frozen=True)
class ServerSample:
    """One runner in server mode: per call, the event time and the synchronized wall time."""

    name: str
    event_us: tuple[float, ...]
    wall_us: tuple[float, ...]

    @property
    def median_us(self) -> float:
        return median(self.event_us)

    def to_dict(self) -> dict:
        return {"calls": len(self.event_us),
                "event_median_us": median(self.event_us), "event_mean_us": statistics.fmean(self.event_us),
                "wall_median_us": median(self.wall_us), "wall_mean_us": statistics.fmean(self.wall_us)}


def time_server(
    runners: Mapping[str, Runner],
    stream: int,
    flush: Callable[[int], None],
    schedule: Sequence[Arrival],
    *,
    warmup: int = 3,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, ServerSample]:
    """Run ``schedule`` (see the module docstring); one sample per runner it names."""
    from . import runtime

    for _ in range(warmup):
        for run in runners.values():
            run(stream)
    runtime.synchronize()
    start, end = runtime.Event(), runtime.Event()
    event_us: dict[str, list[float]] = {name: [] for name in runners}
    wall_us: dict[str, list[float]] = {name: [] for name in runners}
    try:
        for arrival in schedule:
            gap_start = clock()
            flush(stream)
            runtime.synchronize()
            rest = arrival.gap_s - (clock() - gap_start)
            if rest > 0:
                sleep(rest)
            t0 = clock()
            start.record(stream)
            runners[arrival.name](stream)
            end.record(stream)
            runtime.synchronize()
            t1 = clock()
            event_us[arrival.name].append(1000.0 * start.elapsed_ms(end))
            wall_us[arrival.name].append(1e6 * (t1 - t0))
    finally:
        _quietly(start.destroy)
        _quietly(end.destroy)
    return {name: ServerSample(name, tuple(event_us[name]), tuple(wall_us[name]))
            for name in runners if event_us[name]}


def _quietly(fn) -> None:
    try:
        fn()
    except Exception:
        pass
