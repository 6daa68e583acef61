"""The worker protocol, with fake executors: results, timeouts, crashes, restarts. No GPU:
the executors below are injected (tests/unit/test_runner.py drives the runner's retries
through them)."""

from __future__ import annotations

import ctypes
import os
import time
from pathlib import Path

import pytest

from l2gen.worker import Worker

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
