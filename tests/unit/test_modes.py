"""Graph and server modes on a fake device (a simulated stream clock, graphs that record
what was enqueued while capturing), and the server mode's arrival schedule."""

from __future__ import annotations

import itertools
import statistics

import pytest

from l2gen import runtime
from l2gen.modes import (
    GRAPH_MIN_CALLS,
    ROTATE_L2_MULTIPLE,
    arrival_schedule,
    graph_calls_for,
    rotation_copies,
    schedule_stats,
    time_graph,
    time_server,
)


class FakeDevice:
    """One simulated stream. Work advances the device clock (µs); a device-wide
    synchronize moves the host clock (s) past it. While a capture is under way, kernels
    are recorded into the graph instead, and a synchronize fails as CUDA's does."""

    def __init__(self):
        self.clock = 0.0
        self.host = 0.0
        self.pending = 0.0
        self.capturing: list | None = None
        self.log: list[str] = []
        dev = self

        class Event:
            def record(self, stream):
                self.t = dev.clock

            def elapsed_ms(self, end):
                return (end.t - self.t) / 1000.0

            def destroy(self):
                pass

        class Graph:
            def __init__(self, ops):
                self.ops = ops

            def launch(self, stream):
                dev.log.append("graph")
                for name, us in self.ops:
                    dev.run(name, us)

            def destroy(self):
                dev.log.append("destroy")

        self.Event, self.Graph = Event, Graph

    def run(self, name, us):
        self.clock += us
        self.pending += us

    def synchronize(self):
        if self.capturing is not None:
            raise RuntimeError("cudaDeviceSynchronize: operation not permitted when stream is capturing")
        self.host += self.pending / 1e6
        self.pending = 0.0

    def capture_graph(self, stream, enqueue):
        self.capturing = []
        try:
            enqueue(stream)
        except Exception as exc:
            raise runtime.CaptureError(f"{type(exc).__name__}: {exc}") from None
        finally:
            ops, self.capturing = self.capturing, None
        return self.Graph(ops)

    def kernel(self, name, us):
        def run(stream):
            if self.capturing is not None:
                self.capturing.append((name, us))
            else:
                self.log.append(name)
                self.run(name, us)
        return run

    def flush(self, stream):
        self.log.append("flush")
        self.run("flush", 50.0)

    def sleep(self, seconds):
        self.log.append("sleep")
        self.host += seconds

    def now(self):
        return self.host


@pytest.fixture
def fake(monkeypatch):
    dev = FakeDevice()
    monkeypatch.setattr(runtime, "Event", dev.Event)
    monkeypatch.setattr(runtime, "synchronize", dev.synchronize)
    monkeypatch.setattr(runtime, "capture_graph", dev.capture_graph)
    return dev


# ---- graph mode -----------------------------------------------------------------------


def test_graph_calls_rotate_the_copies_and_a_call_is_a_replay_over_n(fake, monkeypatch):
    captured = []

    def spy(stream, enqueue):
        graph = fake.capture_graph(stream, enqueue)
        captured.append([name for name, _ in graph.ops])
        return graph

    monkeypatch.setattr(runtime, "capture_graph", spy)
    sets = {"a": [fake.kernel("a0", 10.0), fake.kernel("a1", 10.0), fake.kernel("a2", 10.0)],
            "b": [fake.kernel("b0", 20.0)]}
    samples, failures = time_graph(sets, 0, fake.flush, calls=7, replays=5)
    assert failures == {}
    assert captured[0] == ["a0", "a1", "a2", "a0", "a1", "a2", "a0"]  # call i on copy i % 3
    assert captured[1] == ["b0"] * 7
    a, b = samples["a"], samples["b"]
    assert (a.calls, a.copies, len(a.replay_us)) == (7, 3, 5)
    assert a.replay_us == (70.0,) * 5 and a.median_us == 10.0 and b.median_us == 20.0
    d = a.to_dict()
    assert d == {"calls": 7, "copies": 3, "replays": 5, "replay_median_us": 70.0, "spread": 0.0}
    timed = fake.log[2:]  # after the launch that uploads each graph
    assert timed[:4] == ["flush", "graph", "flush", "graph"]  # the protocol's flush before each replay
    assert timed.count("flush") == 2 * 5 and fake.log.count("destroy") == 2


def test_a_runner_that_cannot_be_captured_fails_alone(fake):
    def syncs(stream):
        fake.synchronize()  # e.g. a kernel wrapper that waits for its result

    def allocates(stream):
        raise MemoryError("cudaMalloc while capturing")

    sets = {"good": [fake.kernel("g", 5.0)], "sync": [syncs], "alloc": [allocates]}
    samples, failures = time_graph(sets, 0, fake.flush, calls=4, replays=3)
    assert set(samples) == {"good"} and samples["good"].median_us == 5.0
    assert set(failures) == {"sync", "alloc"}
    assert "cannot be captured in a CUDA graph" in failures["sync"]
    assert "operation not permitted when stream is capturing" in failures["sync"]
    assert "MemoryError" in failures["alloc"]


def test_graph_mode_with_nothing_capturable_times_nothing(fake):
    samples, failures = time_graph({"bad": [lambda s: fake.synchronize()]}, 0, fake.flush, calls=2, replays=2)
    assert samples == {} and list(failures) == ["bad"]
    with pytest.raises(ValueError):
        time_graph({}, 0, fake.flush, calls=0)


def test_rotation_copies_exceed_the_l2_between_two_uses():
    l2 = 50 * 2**20
    small = 3 * 2 * 64 * 64  # 64^3: 24 KiB of operands per call
    assert rotation_copies(small, l2, 100) == 100  # more needed than calls: one copy per call
    big = 2 * (64 * 4096 + 4096 * 4096 + 64 * 4096)  # 34 MB per call
    n = rotation_copies(big, l2, 100)
    assert (n - 1) * big >= ROTATE_L2_MULTIPLE * l2 > (n - 2) * big
    assert rotation_copies(10 * l2, l2, 100) == 2  # one call is larger than the L2
    with pytest.raises(ValueError):
        rotation_copies(0, l2, 10)


def test_graph_calls_aim_at_a_replay_of_about_ten_ms():
    assert graph_calls_for(5.0, 100) == 100
    assert graph_calls_for(500.0, 100) == 20
    assert graph_calls_for(12_000.0, 100) == GRAPH_MIN_CALLS
    assert graph_calls_for(12_000.0, 4) == 4  # never more than asked for


# ---- server mode ----------------------------------------------------------------------


def test_the_arrival_schedule_is_poisson_at_the_rate_asked_and_seeded():
    names = ["a", "b", "c", "d", "e"]
    schedule = arrival_schedule(names, 400, qps=100.0, seed=3)
    stats = schedule_stats(schedule)
    assert stats["calls"] == 2000 and stats["per_runner"] == {n: 400 for n in names}
    assert stats["mean_gap_s"] == pytest.approx(0.01, rel=0.06)
    assert stats["rate_qps"] == pytest.approx(100.0, rel=0.06)
    assert stats["cv"] == pytest.approx(1.0, abs=0.08)  # exponential gaps: sd = mean
    gaps = sorted(a.gap_s for a in schedule)
    assert gaps[len(gaps) // 2] == pytest.approx(0.01 * 0.693, rel=0.1)  # the median gap is ln 2 / qps
    assert arrival_schedule(names, 400, 100.0, seed=3) == schedule
    other = arrival_schedule(names, 400, 100.0, seed=4)
    assert [a.name for a in other] != [a.name for a in schedule]
    runs = [len(list(g)) for _, g in itertools.groupby(a.name for a in schedule)]
    assert max(runs) < 10  # interleaved, not runner by runner
    for bad in (0.0, -1.0, float("inf")):
        with pytest.raises(ValueError):
            arrival_schedule(names, 1, bad)


def test_server_mode_flushes_in_the_gap_then_sleeps_and_times_each_call(fake):
    runners = {"fast": fake.kernel("fast", 10.0), "slow": fake.kernel("slow", 40.0)}
    schedule = arrival_schedule(list(runners), 30, qps=200.0, seed=0)
    samples = time_server(runners, 0, fake.flush, schedule, warmup=1, sleep=fake.sleep, clock=fake.now)
    fast, slow = samples["fast"], samples["slow"]
    assert len(fast.event_us) == len(slow.event_us) == 30
    assert set(fast.event_us) == {10.0} and set(slow.event_us) == {40.0}
    assert fast.wall_us == pytest.approx((10.0,) * 30)  # the fake host waits exactly for the device
    d = slow.to_dict()
    assert d["calls"] == 30 and d["event_median_us"] == 40.0 and d["event_mean_us"] == 40.0
    assert d["wall_median_us"] == pytest.approx(40.0) and d["wall_mean_us"] == pytest.approx(40.0)
    timed = fake.log[2:]  # after the warm-up
    for i, arrival in enumerate(schedule):  # each call: flush, (sleep,) the call
        step = timed[:3] if timed[1] == "sleep" else timed[:2]
        assert step[0] == "flush" and step[-1] == arrival.name
        timed = timed[len(step):]
    # the host's time: the warm-up, then per call the flush it waited for, the rest of the gap, the call
    calls = sum(10.0 if a.name == "fast" else 40.0 for a in schedule) * 1e-6
    expected = 50e-6 + sum(50e-6 + max(a.gap_s - 50e-6, 0.0) for a in schedule) + calls
    assert fake.host == pytest.approx(expected)
    assert statistics.fmean(fast.event_us) == 10.0
