"""The timing protocols on a GPU: the clean flush leaves the L2 clean, the launch floor is a
few µs, a run's probe measures plausible floors, and graph and server modes time a small
shape with one baseline (a runner that cannot be captured fails alone).

Run on a GPU machine: ``python -m pytest tests/gpu/test_timing_gpu.py -v``.
"""

from __future__ import annotations

import pytest

from l2gen.runtime import device_count

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(device_count() == 0, reason="no CUDA device"),
]

SHAPE = dict(m=256, n=1024, k=1024)


def measure(worker, task: dict, timeout=None) -> dict:
    """The runner's measure of a task given in its wire form; the result in wire form too."""
    from l2gen.runner import measure as run_task
    from l2gen.tasks import MeasureTask

    return run_task(worker, MeasureTask.from_wire(task), timeout).to_wire()


@pytest.fixture(scope="module")
def device():
    """The probes, a stream and the L2 size, in this process."""
    from l2gen import runtime
    from l2gen.probes import Probes, build_probes

    runtime.call("cudaSetDevice", 0)
    stream = runtime.Stream()
    yield Probes(build_probes()), stream.handle, runtime.device_info(0).l2_bytes
    stream.destroy()


def _median_after(device, l2: str, runner) -> float:
    from l2gen.probes import Flush
    from l2gen.timing import time_interleaved

    probes, stream, l2_bytes = device
    flush = Flush(probes, l2, l2_bytes)
    try:
        return time_interleaved({"x": runner}, stream, flush, reps=50, warmup=3, wall_check=False)["x"].median_us
    finally:
        flush.free()


def test_a_read_after_the_clean_flush_is_faster_than_after_the_written_one(device):
    """After a written flush the read must also write back the dirty lines it evicts (on
    the H200: 15.1 against 11.8 µs for 32 MiB); after the read-pass flush there are none."""
    from l2gen.probes import ReadPass

    probes = device[0]
    read = ReadPass(probes, 32 * 2**20)
    try:
        clean = _median_after(device, "clean", read)
        dirty = _median_after(device, "dirty", read)
    finally:
        read.free()
    assert clean < dirty, (clean, dirty)


def test_the_launch_floor_is_a_few_microseconds(device):
    floor = _median_after(device, "clean", device[0].empty)
    assert 1.0 <= floor <= 10.0, floor


def test_cluster_residency_is_at_most_the_sms_and_shrinks_with_the_cluster(device):
    """One CTA per SM (384 threads, 200 KB each): no more clusters of c CTAs than SMs / c,
    and at least one; two CTAs per SM hold at least as many."""
    from l2gen import runtime

    probes = device[0]
    if runtime.device_info(0).sm < 90:
        pytest.skip("thread block clusters need sm_90")
    sms = runtime.device_info(0).sms
    held = {c: probes.max_active_clusters(c, 384, 200 * 1024) for c in (1, 2, 4, 8)}
    assert held[1] == sms, held
    assert all(1 <= held[c] <= sms // c for c in held), held
    assert all(probes.max_active_clusters(c, 384, 100 * 1024) >= held[c] for c in held)


def test_an_empty_grid_launches_in_clusters_and_refuses_a_partial_cluster(device):
    from l2gen import runtime
    from l2gen.probes import ProbeError

    probes, stream, _ = device
    if runtime.device_info(0).sm < 90:
        pytest.skip("thread block clusters need sm_90")
    t = _median_after(device, "clean", lambda s: probes.empty_grid(128, 2, 384, 200 * 1024, s))
    assert 1.0 <= t <= 20.0, t
    with pytest.raises(ProbeError, match="empty_grid"):
        probes.empty_grid(3, 2, 384, 0, stream)


def test_a_runner_that_cannot_be_captured_fails_alone_and_the_stream_goes_on(device):
    from l2gen import runtime
    from l2gen.modes import time_graph
    from l2gen.probes import Flush

    probes, stream, l2_bytes = device
    flush = Flush(probes, "clean", l2_bytes)
    try:
        samples, failures = time_graph({"empty": [probes.empty], "syncs": [lambda s: runtime.synchronize()]},
                                       stream, flush, calls=20, replays=5)
        assert set(samples) == {"empty"} and set(failures) == {"syncs"}
        assert "cannot be captured" in failures["syncs"]
        assert 0 < samples["empty"].median_us < 10.0
        again, _ = time_graph({"empty": [probes.empty]}, stream, flush, calls=20, replays=5)  # nothing left broken
        assert again["empty"].median_us > 0
    finally:
        flush.free()


def test_the_runs_probe_measures_plausible_floors(worker, shim):
    r = worker.run({"kind": "probe", "shim": shim, "l2": "clean", "mode": "events", "reps": 50})
    assert r["status"] == "ok", r.get("error")
    assert 1.0 <= r["launch_floor_us"] <= 10.0
    assert 0.5 <= r["stream_tbs"] <= 10.0  # H200: about 4.3 TB/s on a large read
    assert 50.0 <= r["peak_tflops"] <= 2000.0, r  # H200: 640-770 TFLOP/s
    assert r["peak_source"].startswith("measured: cublasGemmEx")


def _measure(worker, shim, **protocol):
    r = measure(worker, {"kind": "measure", **SHAPE, "b_layout": "kn", "candidates": [], "baselines": ["cublas"],
                         "shim": shim, "seeds": 1, "reps": 30, **protocol})
    assert r["status"] == "ok", r.get("error")
    assert r["protocol"]["mode"] == protocol.get("mode", "events")
    return r["baselines"]["cublas"]


def test_graph_mode_times_a_call_as_a_replay_over_its_calls(worker, shim):
    events = _measure(worker, shim)
    graph = _measure(worker, shim, mode="graph", graph_calls=50)
    assert graph["status"] == "ok", graph
    g = graph["graph"]
    assert g["calls"] == 50 and g["copies"] >= 2 and g["replays"] >= 10
    assert graph["time_us"] == pytest.approx(g["replay_median_us"] / 50, rel=0.2)
    assert 0 < graph["time_us"] < 2 * events["time_us"]  # back to back it is no slower than alone


def test_server_mode_reports_event_and_wall_time_per_call(worker, shim):
    served = _measure(worker, shim, mode="server", qps=200.0, seed=1)
    assert served["status"] == "ok", served
    s = served["server"]
    assert s["calls"] == 30
    assert s["wall_median_us"] >= s["event_median_us"] > 0
    assert s["event_mean_us"] > 0 and s["wall_mean_us"] > 0
    assert served["time_us"] == s["event_median_us"]
