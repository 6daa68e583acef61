"""Timing: statistics and the rules that keep a measured time honest, plus the device loop.

The statistics (:func:`median`, :func:`spread`, :func:`escaped`, :func:`reproducible`,
:class:`TimingSample`) are pure and need no GPU. :func:`time_interleaved` is the device
side of the default ("events") mode: every timed run is preceded by the protocol's L2
flush on the timed stream (:class:`l2gen.probes.Flush`; clean by default, see
:mod:`l2gen.protocol`), is bracketed by CUDA events on that same stream, and the runners
(candidate and baselines) take turns in one process, round-robin, so drifting clocks and
neighbours hit them all alike. The graph and server modes live in :mod:`l2gen.modes`; the
escape check below (:func:`with_escape_check`) is the same in every mode.

The escape check. A kernel that does its work on another stream (or thread) leaves the
timed stream nearly empty: its event time is tiny. Launching it ``n`` times back to back
and waiting with a *device-wide* synchronize shows the real cost: that wall time divided by
``n`` is at least the device work per call. Event time below :data:`ESCAPE_RATIO` times
that wall time per call means the events did not see the work. The wall time of a short
kernel is bounded below by the host's launch overhead, which events rightly do not see; so
the check only judges a batch that was device-bound, i.e. whose wall time exceeds the time
the host took to enqueue it by :data:`HOST_BOUND_RATIO`.

The batch is bracketed by events on the timed stream too, and it is *that* event time per
call, not the flushed runs' median, that is held against the wall time: like is compared
with like. An honest kernel can run slower back to back than in flushed, gapped runs (seen
on the H200: a 1.8 ms sm80 kernel at 3.7 ms per call in a batch, clocks down under
sustained load), which fooled a check against the median; events around the batch see that
slowdown as well, while work on another stream still escapes them.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

MIN_REPS = 30  # the median is taken over at least this many timed runs
DEFAULT_ROUNDS = 4  # timing rounds on fresh buffers (bench, tune): with one, a few-µs
# kernel's ratio moved 3-5% between two runs on the H200 (where its buffers landed); with
# 4, 144 of 144 example ratios held to 3%
ESCAPE_RATIO = 0.5  # event median below this fraction of the wall time per call: escaped
HOST_BOUND_RATIO = 1.5  # wall must exceed host enqueue time by this to judge escape at all
REPRO_TOLERANCE = 0.03  # two measurements of one thing agree when within 3 %
WALL_BATCH_US = 20_000.0  # aim the back-to-back batch at about this much device time
WALL_CALLS = (10, 200)  # and keep its length within these bounds
SUSTAINED_BLOCKS = 6  # rotated blocks per runner in a sustained measurement: on an H100, three
# blocks of 100 ms of one kernel at 2048x3584x3584 spread 8% (87, 91, 94 us) as the board warmed
SUSTAINED_CALLS = (10, 100_000)  # calls in one block, at least and at most
SUSTAINED_COPIES = 64  # most operand copies a sustained block rotates among


# ---- statistics -----------------------------------------------------------------------


def median(xs: Sequence[float]) -> float:
    if not xs:
        raise ValueError("median of no values")
    s = sorted(xs)
    mid = len(s) // 2
    return float(s[mid]) if len(s) % 2 else 0.5 * (s[mid - 1] + s[mid])


def quantile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile (numpy's default method), ``0 <= q <= 1``."""
    if not xs:
        raise ValueError("quantile of no values")
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return float(s[lo] + (s[hi] - s[lo]) * (pos - lo))


def spread(xs: Sequence[float]) -> float:
    """Interquartile range relative to the median (0 for a constant sample)."""
    mid = median(xs)
    iqr = quantile(xs, 0.75) - quantile(xs, 0.25)
    return iqr / mid if mid else (0.0 if iqr == 0 else math.inf)


def escaped(event_us: float, wall_us: float | None, host_us: float | None = None) -> bool:
    """True when event time misses work the synchronized wall time saw (module docstring).

    ``event_us``: median event time of one run; ``wall_us``: wall time per call of a batch
    of back-to-back runs ended by a device-wide synchronize; ``host_us``: the time per call
    the host took to enqueue that batch (None: assume the batch was device-bound).
    """
    if wall_us is None or wall_us <= 0:
        return False
    if host_us is not None and wall_us < HOST_BOUND_RATIO * host_us:
        return False  # launch-bound batch: it says nothing about the device work
    return event_us < ESCAPE_RATIO * wall_us


def reproducible(first_us: float, second_us: float, tolerance: float = REPRO_TOLERANCE) -> bool:
    """Two measurements of the same thing agree: their ratio is within ``1 ± tolerance``."""
    if first_us <= 0 or second_us <= 0:
        return False
    return abs(first_us / second_us - 1.0) <= tolerance


@dataclass(frozen=True)
class TimingSample:
    """What one runner measured: its event times and the escape-check batch."""

    name: str
    event_us: tuple[float, ...]  # one per timed run (per call, in graph mode)
    wall_us: float | None = None  # wall time per call, back-to-back batch, device-synchronized
    host_us: float | None = None  # host enqueue time per call in that batch
    batch: int = 0  # calls in that batch
    batch_event_us: float | None = None  # event time per call around that batch, timed stream

    @property
    def median_us(self) -> float:
        return median(self.event_us)

    @property
    def spread(self) -> float:
        return spread(self.event_us)

    @property
    def judged_us(self) -> float:
        """The event time per call the escape rule holds against the wall time."""
        return self.batch_event_us if self.batch_event_us is not None else self.median_us

    @property
    def escaped(self) -> bool:
        return escaped(self.judged_us, self.wall_us, self.host_us)

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "median_us": self.median_us,
            "spread": self.spread,
            "reps": len(self.event_us),
            "wall_us": self.wall_us,
            "host_us": self.host_us,
            "batch": self.batch,
            "batch_event_us": self.batch_event_us,
            "escaped": self.escaped,
        }


def wall_batch_calls(event_median_us: float) -> int:
    """How many back-to-back calls the escape-check batch makes for a runner."""
    lo, hi = WALL_CALLS
    if event_median_us <= 0:
        return hi
    return max(lo, min(hi, math.ceil(WALL_BATCH_US / event_median_us)))


# ---- device side ----------------------------------------------------------------------

Runner = Callable[[int], None]  # enqueue one run on the given stream handle; raise on error


def time_interleaved(
    runners: Mapping[str, Runner],
    stream: int,
    flush: Callable[[int], None],
    *,
    reps: int = 50,
    warmup: int = 5,
    wall_check: bool = True,
) -> dict[str, TimingSample]:
    """Time every runner ``reps`` times, round-robin, in this process.

    Iteration ``i`` runs the runners in the order rotated by ``i`` (so none is always
    first after the synchronize); each run is ``flush; event; run; event`` on ``stream``.
    The device is synchronized after each iteration, which also drains work a runner left
    on another stream. Then, if ``wall_check``, each runner's back-to-back batch is timed
    for :func:`escaped`.
    """
    from .runtime import synchronize

    if reps < MIN_REPS:
        raise ValueError(f"reps={reps}: the median needs at least {MIN_REPS} runs")
    names = list(runners)
    for _ in range(warmup):
        for name in names:
            runners[name](stream)
    synchronize()
    times = round_robin(runners, stream, flush, reps)

    samples = {}
    for name in names:
        sample = TimingSample(name, tuple(times[name]))
        samples[name] = with_escape_check(sample, runners[name], stream) if wall_check else sample
    return samples


def round_robin(runners: Mapping[str, Runner], stream: int, flush: Callable[[int], None], rounds: int) -> dict[str, list[float]]:
    """Event times (µs) of every runner in ``rounds`` rounds. Round ``i`` runs the runners
    in the order rotated by ``i``, each as ``flush; event; run; event`` on ``stream``, and
    ends with a device-wide synchronize (which also drains work left on other streams)."""
    from .runtime import Event, synchronize

    names = list(runners)
    events = {name: (Event(), Event()) for name in names}
    times: dict[str, list[float]] = {name: [] for name in names}
    try:
        for i in range(rounds):
            shift = i % len(names) if names else 0
            for name in names[shift:] + names[:shift]:
                start, end = events[name]
                flush(stream)
                start.record(stream)
                runners[name](stream)
                end.record(stream)
            synchronize()
            for name in names:
                start, end = events[name]
                times[name].append(1000.0 * start.elapsed_ms(end))
    finally:
        for pair in events.values():
            for event in pair:
                try:
                    event.destroy()
                except Exception:
                    pass
    return times


def sustained_calls(event_median_us: float, block_us: float) -> int:
    """How many back-to-back calls make one sustained block of about ``block_us``."""
    lo, hi = SUSTAINED_CALLS
    if event_median_us <= 0:
        return lo
    return max(lo, min(hi, math.ceil(block_us / event_median_us)))


def time_sustained(runners: Mapping[str, Sequence[Runner]], stream: int, medians: Mapping[str, float], *,
                   block_us: float, blocks: int = SUSTAINED_BLOCKS) -> dict[str, list[float]]:
    """Event time per call (µs) of every runner under sustained load: ``blocks`` rounds, each
    running every runner's block of back-to-back calls (about ``block_us`` of its one-call
    ``medians`` time, no flush between calls) in an order rotated by the round, with a
    device-wide synchronize after each block. ``runners[key]`` is one runner per copy of the
    operands, taken in turn call by call (copies that together exceed the L2 keep each
    call's inputs out of it, as a model's next layer finds them). A loop of GEMMs holds the
    GPU at its power cap, where the clock settles lower for a kernel that spends more energy
    per FLOP; one ~20 ms batch per runner in a fixed order (the escape check's) does not show
    that reliably, blocks of 100 ms taken in turns do."""
    from .runtime import Event, synchronize

    names = list(runners)
    calls = {name: sustained_calls(medians.get(name, 0.0), block_us) for name in names}
    out: dict[str, list[float]] = {name: [] for name in names}
    start, end = Event(), Event()
    try:
        for i in range(blocks):
            shift = i % len(names) if names else 0
            for name in names[shift:] + names[:shift]:
                turn = runners[name]
                start.record(stream)
                for j in range(calls[name]):
                    turn[j % len(turn)](stream)
                end.record(stream)
                synchronize()
                out[name].append(1000.0 * start.elapsed_ms(end) / calls[name])
    finally:
        for event in (start, end):
            try:
                event.destroy()
            except Exception:
                pass
    return out


def with_escape_check(sample: TimingSample, runner: Runner, stream: int) -> TimingSample:
    """``sample`` with the escape check's back-to-back batch of ``runner`` timed."""
    wall, host, n, seen = _wall_batch(runner, stream, wall_batch_calls(sample.median_us))
    return TimingSample(sample.name, sample.event_us, wall, host, n, seen)


def _wall_batch(runner: Runner, stream: int, calls: int) -> tuple[float, float, int, float]:
    """(wall µs per call, host enqueue µs per call, calls, event µs per call on ``stream``)
    of a back-to-back batch."""
    from .runtime import Event, synchronize

    start, end = Event(), Event()
    try:
        synchronize()
        t0 = time.perf_counter()
        start.record(stream)
        for _ in range(calls):
            runner(stream)
        end.record(stream)
        t1 = time.perf_counter()
        synchronize()
        t2 = time.perf_counter()
        seen = 1000.0 * start.elapsed_ms(end) / calls
    finally:
        start.destroy()
        end.destroy()
    return 1e6 * (t2 - t0) / calls, 1e6 * (t1 - t0) / calls, calls, seen
