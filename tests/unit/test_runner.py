"""The runner: programs x shapes through a fake compiler and a worker process running a fake
executor (no GPU, no nvcc). Results come in program order; a build failure, a crash and a
hang each become a result of their own, and the runner's retries measure the rest; the
records cross the worker boundary through their one wire form."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from l2gen.build import BuildResult
from l2gen.ir import BLayout, Decomposition, Family, Knobs, Program, Raster, Sm80Config, Tile
from l2gen.lower import KernelSource
from l2gen.problem import Shape, Status
from l2gen.protocol import Protocol
from l2gen.runner import Builder, Settings, measure, run, source
from l2gen.runtime import device_count
from l2gen.targets import GPUS
from l2gen.tasks import Candidate, MeasureTask, ProbeTask, RunResult, TaskResult, knobs_from_dict, knobs_to_dict
from l2gen.worker import Worker

HERE = Path(__file__).resolve().parent
H200 = GPUS["h200"]
STAGES = {"fast": 2, "slow": 3, "crash": 4, "hang": 5, "broken": 6, "odd": 7}  # a fake's behaviour: its pipeline depth


# ---- fakes ------------------------------------------------------------------------------


def fake_executor(task: dict, note) -> dict:
    """Runs in the worker process: a candidate's entry says how it behaves."""
    for name in task["baselines"]:
        note({"phase": "verify", "baseline": name})
    for cand in task["candidates"]:
        note({"phase": "verify", "candidate": cand["name"]})
        if cand["entry"] == "e_crash":
            os._exit(4)
        if cand["entry"] == "e_hang":
            time.sleep(3600)
    note({"phase": "time", "runners": [c["name"] for c in task["candidates"]]})
    cands = [{"name": c["name"], "status": "ok", "time_us": {"e_fast": 8.0}.get(c["entry"], 20.0), "relerr": 1e-4,
              "error": None, "knobs": c["knobs"], "pid": os.getpid()} for c in task["candidates"]]
    return {"status": "ok", "error": None, "device": {"name": "fake"}, "protocol": {"mode": task["mode"], "l2": task["l2"]},
            "candidates": cands, "baselines": {b: {"name": b, "status": "ok", "time_us": 10.0} for b in task["baselines"]}}


def _program(name: str, layout: BLayout = BLayout.KN, knobs: Knobs = Knobs()) -> Program:
    return Program(name, Family.SM80, layout, Sm80Config(Tile(128, 128, 32), stages=STAGES[name]), knobs=knobs)


def _behaviour(program: Program) -> str:
    return {v: k for k, v in STAGES.items()}[program.config.stages]


class FakeCompiler:
    """Stands in for l2gen.build.build_many: "broken" fails, the rest build."""

    def __init__(self):
        self.calls: list[list] = []

    def __call__(self, sources, jobs=None, timeout=600, progress=None):
        self.calls.append(list(sources))
        out = []
        for i, s in enumerate(sources, 1):
            if _behaviour(s.program) == "broken":
                r = BuildResult(s, None, error="kernel.cu(1): error: nope", command="nvcc kernel.cu")
            else:
                r = BuildResult(s, Path(f"/fake/{s.entry}.so"))
            if progress:
                progress(i, len(sources), r)
            out.append(r)
        return out


def fake_lower(program, gpu):
    entry = f"e_{_behaviour(program)}"
    return KernelSource(program, gpu.name, entry, f"// {entry}", "-gencode=x")


@pytest.fixture
def worker():
    w = Worker(f"{Path(__file__).stem}:fake_executor", pythonpath=[HERE], timeout=30, first_task_grace=0)
    yield w
    w.close()


def _builder(compiler=None):
    return Builder(H200, build_many=compiler or FakeCompiler(), lower=fake_lower)


SETTINGS = Settings(("cublas",), reps=30, rounds=1, shim="/fake/shim.so", probes="/fake/probes.so")


# ---- programs x shapes ------------------------------------------------------------------


def test_results_come_in_program_order_per_shape_as_they_land(worker):
    programs = [_program("slow"), _program("fast"), _program("odd", BLayout.NK)]
    builds = _builder().build(programs)
    shapes = [Shape(64, 64, 64), Shape(128, 64, 64)]
    started = []
    landed = run(worker, builds, shapes, SETTINGS, gpu=H200, on_task=lambda i, shape, task: started.append((i, shape)))
    first = next(landed)
    assert started == [(1, shapes[0])]  # the second shape's task waits until it is asked for
    rest = list(landed)
    assert [r.shape for r in [first, *rest]] == shapes
    for measured in (first, *rest):
        # the nk program serves no C = A @ B shape
        assert [r.program.name for r in measured.results] == ["slow", "fast"]
        assert [r.run.time_us for r in measured.results] == [20.0, 8.0]
        assert all(r.status is Status.OK and r.baseline_us == 10.0 for r in measured.results)
        assert measured.task.device == {"name": "fake"} and measured.baselines["cublas"].time_us == 10.0


def test_knob_variants_share_one_build_and_launch_with_their_own_knobs(worker):
    compiler = FakeCompiler()
    builder = _builder(compiler)
    base = _program("fast")
    variant = Program("fast_m", base.family, base.b_layout, base.config, knobs=Knobs(raster=Raster.ALONG_M, swizzle=2))
    builds = builder.build([base, variant])
    assert len(compiler.calls) == 1 and len(compiler.calls[0]) == 1 and builder.requested == 1
    assert compiler.calls[0][0].program.knobs == Knobs()  # the build program: knobs at their defaults
    [measured] = run(worker, builds, [Shape(64, 64, 64)], SETTINGS, gpu=H200)
    assert [r.run.figures["knobs"]["raster"] for r in measured.results] == ["heuristic", "along_m"]
    builder.build([Program("again", base.family, base.b_layout, base.config, knobs=Knobs(swizzle=3))])
    assert len(compiler.calls) == 1  # a configuration it has built is not compiled again


def test_a_rejected_or_broken_build_is_a_result_and_the_rest_are_measured(worker):
    invalid = Program("bad", Family.SM80, BLayout.KN, Sm80Config(Tile(100, 128, 32), stages=2))
    builds = _builder().build([_program("broken"), invalid, _program("fast")])
    assert [b.verdict for b in builds] == [Status.BUILD_ERROR, Status.REJECTED, None]
    assert "error: nope" in builds[0].error and "nvcc kernel.cu" in builds[0].error  # the command reproduces it
    assert "E-" in builds[1].error and builds[1].result is None
    [measured] = run(worker, builds, [Shape(64, 64, 64)], SETTINGS, gpu=H200)
    assert [(r.program.name, r.run.verdict) for r in measured.results] == [("broken", "build_error"), ("bad", "rejected"),
                                                                           ("fast", "ok")]
    assert measured.results[0].run.time_us is None and measured.results[0].baseline_us == 10.0


def test_a_crash_fails_its_candidate_alone_and_the_rest_are_measured_again(worker):
    builds = _builder().build([_program("fast"), _program("crash"), _program("slow")])
    [measured] = run(worker, builds, [Shape(64, 64, 64)], SETTINGS, gpu=H200)
    fast, crash, slow = measured.results
    assert crash.status is Status.RUN_ERROR and "exit status 4" in crash.run.error and crash.run.time_us is None
    assert fast.status is Status.OK and slow.status is Status.OK
    assert fast.run.figures["pid"] == slow.run.figures["pid"]  # measured together, after the retry
    assert worker.restarts == 1


def test_a_hang_is_a_timeout_record_and_the_worker_is_replaced(worker):
    builds = _builder().build([_program("hang"), _program("fast")])
    task, _ = SETTINGS.task(Shape(64, 64, 64), [b.candidate(b.program.name) for b in builds], None)
    t0 = time.monotonic()
    result = measure(worker, task, timeout=1.5)
    assert time.monotonic() - t0 < 30
    hang, fast = result.candidates
    assert hang.verdict == "timeout" and hang.status is Status.TIMEOUT and "no result within" in hang.error
    assert fast.ok and fast.time_us == 8.0 and result.ok
    assert worker.restarts == 1


def test_a_failure_while_timing_measures_each_candidate_alone():
    """No culprit (the worker died while timing all of them): each is timed on its own,
    against baselines of its own."""
    seen = []

    class DiesWhenInterleaved:
        def run(self, task, timeout=None):
            seen.append([c["name"] for c in task["candidates"]])
            if len(task["candidates"]) > 1:
                return {"status": "run_error", "error": "worker died", "last_note": {"phase": "time"}}
            [c] = task["candidates"]
            return {"status": "ok", "candidates": [{"name": c["name"], "status": "ok", "time_us": 5.0}],
                    "baselines": {"cublas": {"status": "ok", "time_us": 9.0}}}

    task = MeasureTask(Shape(8, 8, 8), (Candidate("a", "/a.so", "a"), Candidate("b", "/b.so", "b")), ("cublas",))
    result = measure(DiesWhenInterleaved(), task)
    assert seen == [["a", "b"], ["a"], ["b"]]
    assert [c.time_us for c in result.candidates] == [5.0, 5.0]
    assert all(c.baselines["cublas"].time_us == 9.0 for c in result.candidates)


def test_a_crashing_baseline_is_dropped_and_the_task_run_again():
    class CrashesOnCublas:
        def run(self, task, timeout=None):
            if "crashy" in task["baselines"]:
                return {"status": "run_error", "error": "worker died (exit status 5)",
                        "last_note": {"phase": "verify", "baseline": "crashy"}}
            return {"status": "ok", "candidates": [{"name": c["name"], "status": "ok", "time_us": 5.0} for c in task["candidates"]],
                    "baselines": {b: {"status": "ok", "time_us": 9.0} for b in task["baselines"]}}

    task = MeasureTask(Shape(8, 8, 8), (Candidate("a", "/a.so", "a"),), ("crashy", "cublas"))
    result = measure(CrashesOnCublas(), task)
    assert result.baselines["crashy"].verdict == "run_error" and "exit status 5" in result.baselines["crashy"].error
    assert result.baselines["cublas"].ok and result.candidates[0].ok


def test_a_worker_that_cannot_start_fails_every_runner():
    w = Worker(f"{Path(__file__).stem}:no_such_executor", pythonpath=[HERE], first_task_grace=0)
    try:
        result = measure(w, MeasureTask(Shape(8, 8, 8), (Candidate("a", "/a.so", "a"),), ("cublas",)))
    finally:
        w.close()
    assert result.verdict == "run_error" and "failed to start" in result.error
    assert result.candidates[0].verdict == "run_error" and result.baselines["cublas"].verdict == "run_error"


@pytest.mark.skipif(device_count() > 0, reason="a GPU is present: tests/gpu covers this")
def test_the_real_executor_without_a_gpu_fails_cleanly():
    w = Worker(timeout=120, first_task_grace=0)
    try:
        r = measure(w, MeasureTask(Shape(64, 64, 64), (Candidate("e", "/nonexistent.so", "e"),), ("cublas",)))
    finally:
        w.close()
    assert r.verdict == "run_error" and r.candidates[0].time_us is None
    assert "CudaError" in r.error
    assert r.baselines["cublas"].verdict == "run_error"


# ---- the settings of a shape's task -----------------------------------------------------


def test_a_shapes_task_takes_the_runs_settings_and_the_shapes_size():
    settings = Settings(("cublas", "torch_matmul"), "nk", Protocol("graph"), "/s.so", "/p.so", seeds=2, reps=50, rounds=3)
    cand = Candidate("a", "/a.so", "e", "kernel a {}\n", Knobs(splits=2))
    small, timeout = settings.task(Shape(64, 64, 64), [cand], H200)
    assert small.reps == 200 and small.protocol.graph_calls == 100  # a few-µs shape: more runs
    assert (small.b_layout, small.baselines, small.seeds, small.rounds) == ("nk", ("cublas", "torch_matmul"), 2, 3)
    big, big_timeout = settings.task(Shape(8192, 8192, 8192), [cand], H200)
    assert big.reps == 50 and big.protocol.graph_calls < 100 and big_timeout > timeout
    plain, none = settings.task(Shape(64, 64, 64), [cand], None)  # no GPU record: the settings as they are
    assert plain.reps == 50 and none is None
    from l2gen.timing import SUSTAINED_BLOCKS

    blocks = Settings(("cublas",), reps=50, rounds=1, sustained_us=1e5)  # 100 ms blocks
    task, longer = blocks.task(Shape(64, 64, 64), [cand], H200)
    without = Settings(("cublas",), reps=50, rounds=1).task(Shape(64, 64, 64), [cand], H200)[1]
    assert task.sustained_us == 1e5 and longer - without == pytest.approx(2 * 3 * SUSTAINED_BLOCKS * 0.1)  # 2 runners, 3x their blocks
    assert MeasureTask.from_wire(task.to_wire()) == task
    assert "sustained_us" not in plain.to_wire()


# ---- the wire form ----------------------------------------------------------------------


def test_a_task_survives_its_wire_form():
    task = MeasureTask(Shape(64, 128, 256), (Candidate("a", "/a.so", "e", "kernel a {}\n", Knobs(raster=Raster.ALONG_N, splits=3)),),
                       ("cublas",), "nk", Protocol("server", qps=50.0, seed=7), "/s.so", "/p.so", 2, 40, 3, 2)
    wire = task.to_wire()
    assert (wire["kind"], wire["m"], wire["mode"], wire["qps"], wire["seeds"]) == ("measure", 64, "server", 50.0, 2)
    assert wire["candidates"][0]["knobs"] == {"raster": "along_n", "swizzle": 0, "splits": 3, "decomposition": "heuristic"}
    assert MeasureTask.from_wire(wire) == task
    assert "seeds" not in MeasureTask(Shape(8, 8, 8)).to_wire()  # the executor's default
    assert ProbeTask(Protocol(), "/s.so", "/p.so", 30).to_wire() == {"kind": "probe", "mode": "events", "l2": "clean",
                                                                      "shim": "/s.so", "probes": "/p.so", "reps": 30}


def test_the_wire_shorthands_expand():
    t = MeasureTask.from_wire({"m": 1, "n": 2, "k": 8, "library": "/l.so", "entry": "e",
                               "program_text": "kernel x {}", "knobs": {"splits": 2}})
    assert t.baselines == () and t.protocol == Protocol()
    assert t.candidates == (Candidate("e", "/l.so", "e", "kernel x {}", Knobs(splits=2)),)
    assert MeasureTask.from_wire({"shape": "64x128x256"}).shape == Shape(64, 128, 256)
    assert MeasureTask.from_wire({"shape": [1, 2, 8]}).shape == Shape(1, 2, 8)


def test_knobs_round_trip():
    k = Knobs(raster=Raster.ALONG_N, swizzle=3, splits=4, decomposition=Decomposition.STREAM_K)
    assert knobs_from_dict(knobs_to_dict(k)) == k
    # every knob reaches the worker: pdl picks the entry, grid caps the launch
    for k in (Knobs(pdl=True), Knobs(grid=96), Knobs(splits=2, pdl=True, grid=64)):
        assert knobs_from_dict(knobs_to_dict(k)) == k
        c = Candidate("c", "/l.so", "e", None, k)
        assert Candidate.from_wire(c.to_wire()) == c
    assert "pdl" not in knobs_to_dict(Knobs()) and "grid" not in knobs_to_dict(Knobs())
    assert knobs_from_dict(None) == Knobs()
    assert knobs_from_dict({"splits": 2}) == Knobs(splits=2)


def test_a_result_survives_its_wire_form_and_single_candidates_come_on_top():
    wire = {"status": "ok", "error": None, "device": {"name": "x"}, "protocol": {"mode": "events", "l2": "clean"},
            "candidates": [{"name": "a", "status": "escaped", "time_us": None, "relerr": 1e-4, "error": "escaped",
                            "escaped": True, "event_vs_wall": {"event_us": 1.0}, "baselines": {"cublas": {"name": "cublas",
                            "status": "ok", "time_us": 9.0, "relerr": None, "error": None}}}],
            "baselines": {"cublas": {"name": "cublas", "status": "unavailable", "time_us": None, "relerr": None, "error": "no shim"}}}
    result = TaskResult.from_wire(wire)
    [a] = result.candidates
    assert a.verdict == "escaped" and a.status is Status.RUN_ERROR and a.figures["event_vs_wall"] == {"event_us": 1.0}
    assert a.baselines["cublas"].ok and not result.baselines["cublas"].ok
    back = result.to_wire()
    assert back["candidates"] == wire["candidates"] and back["baselines"] == wire["baselines"]
    assert back["status"] == "escaped" and back["escaped"] is True  # the one candidate's fields on top
    assert RunResult.from_wire({"status": "capture_error"}, "b").name == "b"


def test_statuses_come_from_one_table():
    assert [Status.of(w) for w in ("ok", "wrong", "timeout", "rejected", "build_error")] == [
        Status.OK, Status.WRONG, Status.TIMEOUT, Status.REJECTED, Status.BUILD_ERROR]
    assert {Status.of(w) for w in ("escaped", "capture_error", "unavailable", None, "weird")} == {Status.RUN_ERROR}


def test_the_source_of_a_program_is_its_build_programs():
    seen = []
    fast = _program("fast", knobs=Knobs(splits=2))
    source(fast, H200, lower=lambda p, gpu: seen.append(p))
    assert seen[0].knobs == Knobs() and seen[0].name == "sm80_128x128x32"
