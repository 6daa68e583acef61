"""The worker protocol, with fake executors: results, timeouts, crashes, restarts, and the
culprit-dropping retries of worker.measure(). No GPU: the executors below are injected."""

from __future__ import annotations

import ctypes
import os
import time
from pathlib import Path

import pytest

from l2gen.ir import Decomposition, Knobs, Raster
from l2gen.runtime import device_count
from l2gen.worker import Worker, knobs_from_dict, knobs_to_dict, measure, normalize

HERE = Path(__file__).resolve().parent
EXECUTOR = f"{Path(__file__).stem}:fake_execute"


# ---- fake executors (run inside the worker process) -----------------------------------


def fake_execute(task: dict, note) -> dict:
    kind = task["kind"]
    if kind == "echo":
        return {"status": "ok", "echo": task.get("value"), "pid": os.getpid()}
    if kind == "noisy":  # prints through Python and through fd 1 directly
        print("python print on stdout")
        os.write(1, b"raw write to fd 1\n")
        return {"status": "ok", "pid": os.getpid()}
    if kind == "sleep":
        note({"phase": "sleeping"})
        time.sleep(3600)
    if kind == "exit":
        os._exit(3)
    if kind == "segfault":
        ctypes.string_at(0)
    if kind == "raise":
        raise ValueError("boom")
    if kind == "measure":
        return fake_measure(task, note)
    raise ValueError(kind)


def fake_measure(task: dict, note) -> dict:
    """Behaves like the GPU executor; a candidate's name says how it misbehaves."""
    for name in task["baselines"]:
        note({"phase": "verify", "baseline": name})
        if name.startswith("crash"):
            os._exit(5)
    for cand in task["candidates"]:
        note({"phase": "verify", "candidate": cand["name"]})
        if cand["name"].startswith("crash"):
            os._exit(1)
        if cand["name"].startswith("hang"):
            time.sleep(3600)
    names = [c["name"] for c in task["candidates"]]
    note({"phase": "time", "runners": names})
    if any(n.startswith("timecrash") for n in names) and len(names) > 1:
        os._exit(2)  # only when interleaved with others: alone it "works" (then is wrong)
    cands = []
    for cand in task["candidates"]:
        wrong = cand["name"].startswith("timecrash")
        cands.append({"name": cand["name"], "status": "wrong" if wrong else "ok",
                      "time_us": None if wrong else 10.0, "relerr": 1e-4, "error": None,
                      "pid": os.getpid()})
    return {"status": "ok", "error": None, "device": {"name": "fake"},
            "protocol": {"mode": task.get("mode", "events"), "l2": task.get("l2", "clean")},
            "candidates": cands,
            "baselines": {b: {"name": b, "status": "ok", "time_us": 12.0} for b in task["baselines"]}}


@pytest.fixture
def worker():
    w = Worker(EXECUTOR, pythonpath=[HERE], timeout=30, first_task_grace=0)
    yield w
    w.close()


# ---- the protocol ---------------------------------------------------------------------


def test_result_comes_back_and_worker_is_reused(worker):
    a = worker.run({"kind": "echo", "value": [1, "x"]})
    b = worker.run({"kind": "echo", "value": 2})
    assert a["status"] == "ok" and a["echo"] == [1, "x"]
    assert b["echo"] == 2 and b["pid"] == a["pid"]
    assert worker.restarts == 0


def test_prints_do_not_corrupt_the_protocol(worker):
    r = worker.run({"kind": "noisy"})
    assert r["status"] == "ok"
    assert worker.run({"kind": "echo", "value": 1})["pid"] == r["pid"]


def test_hang_is_killed_as_timeout_and_worker_restarts(worker):
    first = worker.run({"kind": "echo"})
    t0 = time.monotonic()
    r = worker.run({"kind": "sleep"}, timeout=1.5)
    assert time.monotonic() - t0 < 20
    assert r["status"] == "timeout"
    assert "no result within" in r["error"]
    assert r["last_note"] == {"phase": "sleeping"}
    after = worker.run({"kind": "echo"})
    assert after["status"] == "ok" and after["pid"] != first["pid"]
    assert worker.restarts == 1


@pytest.mark.parametrize("kind,words", [
    ("segfault", "SIGSEGV"),
    ("exit", "exit status 3"),
])
def test_crash_is_run_error_and_worker_restarts(worker, kind, words):
    first = worker.run({"kind": "echo"})
    r = worker.run({"kind": kind})
    assert r["status"] == "run_error"
    assert words in r["error"]
    after = worker.run({"kind": "echo"})
    assert after["status"] == "ok" and after["pid"] != first["pid"]


def test_segfault_leaves_a_traceback_in_the_error(worker):
    r = worker.run({"kind": "segfault"})
    assert "Segmentation fault" in r["error"] and "fake_execute" in r["error"]


def test_exception_is_reported_then_worker_replaced(worker):
    first = worker.run({"kind": "echo"})
    r = worker.run({"kind": "raise"})
    assert r["status"] == "run_error"
    assert r["error"] == "ValueError: boom"
    assert "Traceback" in r["traceback"]
    assert worker.run({"kind": "echo"})["pid"] != first["pid"]


def test_unknown_executor_fails_to_start():
    w = Worker(f"{Path(__file__).stem}:no_such_function", pythonpath=[HERE], first_task_grace=0)
    try:
        r = w.run({"kind": "echo"})
    finally:
        w.close()
    assert r["status"] == "run_error"
    assert "failed to start" in r["error"] and "no_such_function" in r["error"]


def test_close_ends_the_process(worker):
    worker.run({"kind": "echo"})
    proc = worker._proc
    worker.close()
    assert proc.poll() is not None
    assert not worker.alive()


# ---- measure(): faulty candidates fail alone ------------------------------------------


def _cands(*names):
    return [{"name": n, "library": f"/lib/{n}.so", "entry": n} for n in names]


def test_measure_all_good(worker):
    r = measure(worker, {"m": 8, "n": 8, "k": 8, "candidates": _cands("a", "b"),
                         "baselines": ["cublas"]})
    assert r["status"] == "ok"
    assert [c["status"] for c in r["candidates"]] == ["ok", "ok"]
    assert r["baselines"]["cublas"]["time_us"] == 12.0
    assert r["protocol"] == {"mode": "events", "l2": "clean"}  # what the worker timed under comes back
    assert worker.restarts == 0


def test_measure_drops_the_candidate_that_crashed_or_hung(worker):
    task = {"m": 8, "n": 8, "k": 8, "candidates": _cands("a", "crash1", "hang1", "b"),
            "baselines": ["cublas"]}
    r = measure(worker, task, timeout=2)
    by = {c["name"]: c for c in r["candidates"]}
    assert [c["name"] for c in r["candidates"]] == ["a", "crash1", "hang1", "b"]
    assert by["a"]["status"] == "ok" and by["b"]["status"] == "ok"
    assert by["crash1"]["status"] == "run_error" and "exit status 1" in by["crash1"]["error"]
    assert by["hang1"]["status"] == "timeout" and by["hang1"]["time_us"] is None
    assert r["baselines"]["cublas"]["status"] == "ok"
    assert by["a"]["pid"] == by["b"]["pid"]  # measured together, in one final run


def test_measure_drops_a_crashing_baseline(worker):
    r = measure(worker, {"m": 8, "n": 8, "k": 8, "candidates": _cands("a"),
                         "baselines": ["crashy", "cublas"]})
    assert r["baselines"]["crashy"]["status"] == "run_error"
    assert r["baselines"]["cublas"]["status"] == "ok"
    assert r["candidates"][0]["status"] == "ok"


def test_measure_failure_while_timing_measures_each_alone(worker):
    r = measure(worker, {"m": 8, "n": 8, "k": 8, "candidates": _cands("a", "timecrash"),
                         "baselines": ["cublas"]})
    by = {c["name"]: c for c in r["candidates"]}
    assert by["a"]["status"] == "ok"
    assert by["timecrash"]["status"] == "wrong"
    for c in by.values():  # each was timed with its own baselines
        assert c["baselines"]["cublas"]["status"] == "ok"


def test_measure_single_candidate_fields_on_top(worker):
    r = measure(worker, {"kind": "measure", "m": 8, "n": 8, "k": 8, "library": "/x.so",
                         "entry": "e", "name": "only"})
    assert r["status"] == "ok" and r["time_us"] == 10.0 and r["relerr"] == 1e-4
    r = measure(worker, {"m": 8, "n": 8, "k": 8, "library": "/x.so", "entry": "crash"})
    assert r["status"] == "run_error" and r["time_us"] is None


@pytest.mark.skipif(device_count() > 0, reason="a GPU is present: tests/gpu covers this")
def test_the_real_executor_without_a_gpu_fails_cleanly():
    w = Worker(timeout=120, first_task_grace=0)
    try:
        r = measure(w, {"m": 64, "n": 64, "k": 64, "library": "/nonexistent.so", "entry": "e",
                        "baselines": ["cublas"]})
    finally:
        w.close()
    assert r["status"] == "run_error" and r["time_us"] is None
    assert "CudaError" in r["error"]
    assert r["baselines"]["cublas"]["status"] == "run_error"


# ---- records --------------------------------------------------------------------------


def test_normalize_expands_the_single_candidate_form():
    t = normalize({"m": 1, "n": 2, "k": 8, "library": "/l.so", "entry": "e",
                   "program_text": "kernel x {}", "knobs": {"splits": 2}})
    assert t["kind"] == "measure" and t["baselines"] == []
    assert t["candidates"] == [{"name": "e", "library": "/l.so", "entry": "e",
                                "program_text": "kernel x {}", "knobs": {"splits": 2}}]
    assert "library" not in t
    assert {k: normalize({"shape": "64x128x256"})[k] for k in "mnk"} == {"m": 64, "n": 128, "k": 256}
    assert {k: normalize({"shape": [1, 2, 8]})[k] for k in "mnk"} == {"m": 1, "n": 2, "k": 8}


def test_knobs_round_trip():
    k = Knobs(raster=Raster.ALONG_N, swizzle=3, splits=4, decomposition=Decomposition.STREAM_K)
    assert knobs_from_dict(knobs_to_dict(k)) == k
    assert knobs_from_dict(None) == Knobs()
    assert knobs_from_dict({"splits": 2}) == Knobs(splits=2)
