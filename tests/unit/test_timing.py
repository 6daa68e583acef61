"""Timing statistics, the escape rule, reproducibility, and the interleaved loop on a fake
device (a simulated stream clock in place of CUDA events)."""

from __future__ import annotations

import time

import pytest

from l2gen import runtime, timing
from l2gen.timing import (
    ESCAPE_RATIO,
    MIN_REPS,
    TimingSample,
    escaped,
    median,
    quantile,
    reproducible,
    spread,
    time_interleaved,
    wall_batch_calls,
)


def test_median():
    assert median([3.0]) == 3.0
    assert median([5, 1, 3]) == 3
    assert median([4, 1, 3, 2]) == 2.5
    with pytest.raises(ValueError):
        median([])


def test_quantile_matches_linear_interpolation():
    xs = [10, 20, 30, 40, 50]
    assert quantile(xs, 0) == 10 and quantile(xs, 1) == 50
    assert quantile(xs, 0.25) == 20 and quantile(xs, 0.75) == 40
    assert quantile([1, 2], 0.5) == 1.5


def test_spread_is_iqr_over_median():
    assert spread([7.0] * 31) == 0.0
    assert spread([10, 20, 30, 40, 50]) == pytest.approx(20 / 30)
    # one outlier does not move it
    assert spread([10.0] * 30 + [1000.0]) == 0.0


def test_escape_rule_flags_work_outside_the_timed_stream():
    # The H200 case: 2 us of events against 17 us of real work per call.
    assert escaped(event_us=2.0, wall_us=17.0, host_us=4.0)
    assert escaped(event_us=2.0, wall_us=17.0)  # host time unknown: judged as device-bound


def test_escape_rule_passes_honest_kernels():
    assert not escaped(event_us=100.0, wall_us=95.0, host_us=5.0)  # warm batch is faster
    assert not escaped(event_us=100.0, wall_us=130.0, host_us=5.0)  # some jitter
    assert not escaped(event_us=ESCAPE_RATIO * 40.0, wall_us=40.0, host_us=1.0)  # boundary


def test_escape_rule_ignores_launch_bound_batches():
    # A 3 us kernel launched from Python: wall time is the host's enqueue time.
    assert not escaped(event_us=3.0, wall_us=9.0, host_us=8.5)
    assert not escaped(event_us=3.0, wall_us=9.0, host_us=6.5)
    assert escaped(event_us=3.0, wall_us=20.0, host_us=6.5)


def test_escape_rule_without_a_wall_time():
    assert not escaped(5.0, None)
    assert not escaped(5.0, 0.0)


def test_reproducible_within_three_percent():
    assert reproducible(100.0, 102.9)
    assert reproducible(102.9, 100.0)
    assert not reproducible(100.0, 104.0)
    assert not reproducible(0.0, 1.0)
    assert reproducible(100.0, 110.0, tolerance=0.1)


def test_timing_sample():
    s = TimingSample("k", tuple(float(x) for x in range(1, 32)), wall_us=30.0, host_us=2.0, batch=50)
    assert s.median_us == 16.0
    assert not s.escaped
    d = s.to_dict()
    assert d["reps"] == 31 and d["median_us"] == 16.0 and d["escaped"] is False
    assert TimingSample("k", (1.0,) * 30, wall_us=40.0, host_us=2.0).escaped


def test_wall_batch_calls_bounds():
    lo, hi = timing.WALL_CALLS
    assert wall_batch_calls(0.0) == hi
    assert wall_batch_calls(1.0) == hi
    assert wall_batch_calls(1e6) == lo
    assert lo <= wall_batch_calls(500.0) <= hi


# ---- the interleaved loop on a fake device --------------------------------------------


class FakeDevice:
    """A single simulated stream: enqueued work advances its clock; 'side' work runs
    elsewhere and only a device-wide synchronize waits for it (for real, by sleeping)."""

    def __init__(self):
        self.clock = 0.0  # µs of device time on the timed stream
        self.side_us = 0.0  # pending work on another stream
        self.log: list[str] = []
        dev = self

        class Event:
            def __init__(self):
                self.t = None

            def record(self, stream):
                self.t = dev.clock

            def elapsed_ms(self, end):
                return (end.t - self.t) / 1000.0

            def destroy(self):
                pass

        self.Event = Event

    def synchronize(self):
        if self.side_us:
            time.sleep(self.side_us / 1e6)
            self.side_us = 0.0

    def flush(self, stream):
        self.log.append("flush")
        self.clock += 50.0

    def kernel(self, name, us, side=False):
        def run(stream):
            self.log.append(name)
            if side:
                self.side_us += us
            else:
                self.clock += us
                self.side_us += us  # for the synchronize: the device is busy that long
        return run


@pytest.fixture
def fake(monkeypatch):
    dev = FakeDevice()
    monkeypatch.setattr(runtime, "Event", dev.Event)
    monkeypatch.setattr(runtime, "synchronize", dev.synchronize)
    return dev


def test_interleaved_round_robin_with_a_flush_before_each_run(fake):
    runners = {"a": fake.kernel("a", 10), "b": fake.kernel("b", 20), "c": fake.kernel("c", 30)}
    samples = time_interleaved(runners, 0, fake.flush, reps=MIN_REPS, warmup=1, wall_check=False)
    assert {n: s.median_us for n, s in samples.items()} == {"a": 10, "b": 20, "c": 30}
    assert all(len(s.event_us) == MIN_REPS for s in samples.values())
    timed = fake.log[3:]  # after one warm-up round
    assert timed[:6] == ["flush", "a", "flush", "b", "flush", "c"]
    assert timed[6:12] == ["flush", "b", "flush", "c", "flush", "a"]  # rotated
    assert timed[12:18] == ["flush", "c", "flush", "a", "flush", "b"]
    assert timed.count("flush") == 3 * MIN_REPS


def test_interleaved_needs_thirty_runs(fake):
    with pytest.raises(ValueError):
        time_interleaved({"a": fake.kernel("a", 1)}, 0, fake.flush, reps=MIN_REPS - 1)


def test_interleaved_flags_a_kernel_working_on_another_stream(fake):
    runners = {"honest": fake.kernel("honest", 2000), "sneaky": fake.kernel("sneaky", 2000, side=True)}
    samples = time_interleaved(runners, 0, fake.flush, reps=MIN_REPS, warmup=0)
    honest, sneaky = samples["honest"], samples["sneaky"]
    assert honest.median_us == 2000 and not honest.escaped
    assert sneaky.median_us == 0 and sneaky.escaped
    assert sneaky.wall_us >= 1500  # the device-wide synchronize saw the side work


def test_escape_check_compares_the_batch_with_events_around_the_same_batch():
    # An honest kernel slowed down back to back (clocks down under sustained load): the
    # events around the batch see the slowdown too, so it is not flagged...
    slowed = TimingSample("k", (1820.0,) * 30, wall_us=3662.0, host_us=26.0, batch=10, batch_event_us=3650.0)
    assert not slowed.escaped
    # ...while work on another stream escapes the events around the batch as well.
    side = TimingSample("k", (2.0,) * 30, wall_us=17.0, host_us=3.0, batch=50, batch_event_us=1.5)
    assert side.escaped
    assert side.to_dict()["batch_event_us"] == 1.5


def test_rounds_pool_their_runs_and_keep_the_last_rounds_batch():
    from l2gen.measure import _pool

    first = {"k": TimingSample("k", (1.0, 2.0, 3.0))}
    last = {"k": TimingSample("k", (10.0, 11.0, 12.0), wall_us=12.0, host_us=1.0, batch=8, batch_event_us=11.5)}
    pooled = _pool([first, last])["k"]
    assert pooled.event_us == (1.0, 2.0, 3.0, 10.0, 11.0, 12.0)
    assert pooled.median_us == pytest.approx(6.5)
    assert (pooled.wall_us, pooled.batch, pooled.batch_event_us) == (12.0, 8, 11.5)
    assert _pool([]) == {}


def test_the_autotuned_baseline_is_the_fastest_finalist_of_the_pooled_timing():
    from l2gen.measure import _finalists

    key = "baseline/cublaslt_autotuned"
    ok = lambda t: {"name": "x", "status": "ok", "time_us": t, "relerr": 2e-4}  # noqa: E731
    results = {key: ok(10.0), key + "#2": ok(9.5), key + "#3": {"name": "x", "status": "wrong", "time_us": None},
               "baseline/cublas": ok(11.0)}
    _finalists(results, key)
    assert set(results) == {key, "baseline/cublas"}
    assert results[key]["time_us"] == 9.5 and results[key]["rank"] == 2
    assert results[key]["name"] == "cublaslt_autotuned"
    assert results[key]["finalists_us"] == {"1": 10.0, "2": 9.5, "3": None}
    alone = {key: ok(10.0)}
    _finalists(alone, key)  # no runners-up: untouched
    assert alone == {key: ok(10.0)}


def test_sustained_blocks_are_rotated_and_about_as_long_as_asked(fake):
    from l2gen.timing import SUSTAINED_CALLS, sustained_calls, time_sustained

    runners = {"a": [fake.kernel("a0", 10), fake.kernel("a1", 10)], "b": [fake.kernel("b", 40)]}
    blocks = time_sustained(runners, 0, {"a": 10.0, "b": 40.0}, block_us=400.0, blocks=3)
    assert blocks == {"a": [10.0] * 3, "b": [40.0] * 3}  # event time per call in each block
    assert fake.log[:40] == ["a0", "a1"] * 20 and fake.log[40:50] == ["b"] * 10  # 400 us of each, copies in turn
    assert fake.log[50:60] == ["b"] * 10 and fake.log[60:100] == ["a0", "a1"] * 20  # the next block rotated
    assert "flush" not in fake.log  # back to back: no flush between calls
    assert sustained_calls(0.001, 1e5) == SUSTAINED_CALLS[1] and sustained_calls(5e4, 1e5) == SUSTAINED_CALLS[0]
    assert sustained_calls(0.0, 1e5) == SUSTAINED_CALLS[0]
