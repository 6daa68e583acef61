"""The bench's rows, results file and table; and a whole bench run with lowering, building
and the GPU worker faked (programs' names say how they behave)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from l2gen import bench as bench_mod
from l2gen.baselines import BASELINES, cublas_best, result_key
from l2gen.diagnostics import Diagnostic, DiagnosticError
from l2gen.ir import BLayout, Family, Program, Sm80Config, Tile
from l2gen.problem import Shape
from l2gen.protocol import Floors, Protocol
from l2gen.targets import GPUS
from l2gen.tasks import RunResult
from l2gen.worker import Worker

HERE = Path(__file__).resolve().parent
H200 = GPUS["h200"]
FLOORS = Floors.from_gpu(H200)
ROW_KEYS = {"m", "n", "k", "program", "program_text", "l2gen_us", "relerr", "status", "error",
            "tflops", "floor_pct", "baselines", "cublas_best_us", "speedup_vs_best"}
BASELINE_KEYS = {result_key(b) for b in BASELINES}
BASE_TIMES = {"torch_matmul": 10.0, "cublas": 11.0, "cublas_tt": 12.0,
              "cublaslt_heuristic": 10.5, "cublaslt_autotuned": 9.5}


def ok_baselines(**override):
    times = dict(BASE_TIMES, **override)
    return {n: {"name": n, "status": "ok", "time_us": t, "relerr": 2e-4} for n, t in times.items()}


def make_row(shape, program, text, cand: dict, base: dict, floors, *names):
    """bench.make_row of a candidate and baselines in the worker's wire form."""
    return bench_mod.make_row(shape, program, text, RunResult.from_wire(cand), _runs(base), floors, *names)


def shape_summary(shape, rows, base: dict, *names):
    return bench_mod.shape_summary(shape, rows, _runs(base), *names)


def _runs(base: dict) -> dict:
    return {n: RunResult.from_wire(b, n) for n, b in base.items()}


class FakeWorker:
    """Answers each task the runner sends with ``answer(worker, wire task, timeout)``."""

    def __init__(self, answer):
        self.answer = answer

    def run(self, task, timeout=None):
        return self.answer(self, task, timeout)


# ---- rows -----------------------------------------------------------------------------


def test_cublas_best_is_the_fastest_measured():
    assert cublas_best({"a_us": 3.0, "b_us": None, "c_us": 2.5}) == 2.5
    assert cublas_best({"a_us": None}) is None


def test_row_of_a_measured_program():
    shape = Shape(64, 4096, 4096)
    row = make_row(shape, "p", "kernel p {}\n",
                             {"status": "ok", "time_us": 8.0, "relerr": 3e-4, "error": None},
                             ok_baselines(), FLOORS)
    assert set(row) == ROW_KEYS
    assert set(row["baselines"]) == BASELINE_KEYS
    assert row["l2gen_us"] == 8.0 and row["status"] == "ok" and row["error"] is None
    assert row["cublas_best_us"] == 9.5
    assert row["speedup_vs_best"] == pytest.approx(9.5 / 8.0)
    assert row["tflops"] == pytest.approx(2 * 64 * 4096 * 4096 / 8e-6 / 1e12)
    assert row["floor_pct"] == pytest.approx(100 * H200.floor_us(64, 4096, 4096) / 8.0)
    measured = Floors(3.0, 2.0, 500.0, "l", "s", "p")  # the run's own floors decide floor%
    slow = make_row(shape, "p", "", {"status": "ok", "time_us": 8.0}, ok_baselines(), measured)
    assert slow["floor_pct"] == pytest.approx(100 * measured.floor_us(64, 4096, 4096) / 8.0)


def test_row_of_a_failed_program_has_no_time():
    row = make_row(Shape(8, 8, 8), "p", "", {"status": "wrong", "time_us": 5.0,
                             "relerr": float("inf"), "error": "seed 0: relerr 0.5 > 0.001"},
                             ok_baselines(), FLOORS)
    assert row["status"] == "wrong" and row["error"].startswith("seed 0")
    assert row["l2gen_us"] is None and row["tflops"] is None and row["floor_pct"] is None
    assert row["speedup_vs_best"] is None and row["relerr"] is None  # inf is not JSON
    assert row["cublas_best_us"] == 9.5  # the baselines still say what the shape costs


def test_row_with_failed_baselines():
    base = ok_baselines()
    base["cublaslt_autotuned"] = {"status": "unavailable", "time_us": None, "error": "no shim"}
    base["torch_matmul"] = {"status": "wrong", "time_us": 1.0, "error": "bad"}
    row = make_row(Shape(8, 8, 8), "p", "", {"status": "ok", "time_us": 10.0}, base, FLOORS)
    assert row["baselines"]["cublaslt_autotuned_us"] is None
    assert row["baselines"]["torch_matmul_us"] is None  # a wrong baseline has no time either
    assert row["cublas_best_us"] == 10.5


def test_shape_summary_picks_the_fastest_passing_program():
    shape = Shape(8, 8, 8)
    rows = [make_row(shape, name, "", cand, ok_baselines(), FLOORS) for name, cand in [
        ("slow", {"status": "ok", "time_us": 20.0}),
        ("fast", {"status": "ok", "time_us": 8.0}),
        ("bad", {"status": "escaped", "time_us": None}),
    ]]
    s = shape_summary(shape, rows, ok_baselines())
    assert s["best_program"] == "fast" and s["l2gen_us"] == 8.0
    assert s["speedup_vs_best"] == pytest.approx(9.5 / 8.0)
    none = shape_summary(shape, rows[2:], ok_baselines())
    assert none["best_program"] is None and none["speedup_vs_best"] is None


def test_results_file_is_strict_json(tmp_path):
    path = tmp_path / "sub" / "r.json"
    bench_mod.write_results({"rows": [{"x": 1.5, "y": None}]}, path)
    assert json.loads(path.read_text()) == {"rows": [{"x": 1.5, "y": None}]}
    with pytest.raises(ValueError):
        bench_mod.write_results({"x": float("nan")}, path)
    assert json.loads(path.read_text()) == {"rows": [{"x": 1.5, "y": None}]}  # untouched
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]  # no temporary left


def _results():
    shape = Shape(64, 4096, 4096)
    rows = [
        make_row(shape, "fast", "", {"status": "ok", "time_us": 8.0, "relerr": 2.5e-4},
                           ok_baselines(), FLOORS),
        make_row(shape, "broken", "", {"status": "run_error", "time_us": None,
                           "error": "worker died (killed by SIGSEGV)\nmore"}, ok_baselines(), FLOORS),
    ]
    return {"gpu": "h200", "rows": rows,
            "shapes": [shape_summary(shape, rows, ok_baselines())]}


def test_table_shows_time_rate_floor_speedups_and_relerr():
    table = bench_mod.format_table(_results())
    lines = table.splitlines()
    header = lines[0].split()
    assert header[:6] == ["shape", "program", "status", "us", "TFLOP/s", "floor%"]
    assert header[6:] == ["xtorch", "xcublas", "xcublasTT", "xlt", "xlt_auto", "xbest", "relerr"]
    fast = next(l for l in lines if " fast " in l).split()
    assert fast[:4] == ["64x4096x4096", "fast", "ok", "8.00"]
    assert fast[6:] == ["1.25", "1.38", "1.50", "1.31", "1.19", "1.19", "2.5e-04"]
    broken = next(l for l in lines if " broken " in l and "run_error" in l).split()
    assert broken[3:] == ["-"] * 10
    assert "broken: run_error: worker died (killed by SIGSEGV)" in table
    assert "more" not in table  # first line of an error only
    summary = lines[lines.index("") + 1:]
    assert summary[0].split()[:2] == ["shape", "torch"]
    assert summary[2].split()[-3:] == ["9.50", "fast", "1.19"]


def test_table_columns_line_up():
    lines = bench_mod.format_table(_results()).split("\n\n")[0].splitlines()
    assert len({len(l) for l in lines[:3]}) == 1


def test_plot_without_matplotlib_is_skipped(tmp_path):
    png = tmp_path / "p.png"
    made = bench_mod.plot_speedups(_results(), png)
    assert made == png.exists()
    if made:
        assert png.stat().st_size > 1000


# ---- a whole run, faked ---------------------------------------------------------------


def fake_gpu(task: dict, note) -> dict:
    """Stands in for the GPU executor; a program's name says what it does."""
    assert task["shim"] == "/fake/shim.so" and task["probes"] == "/fake/probes.so"
    assert (task["mode"], task["l2"]) == ("events", "clean")
    if task["kind"] == "probe":
        return {"status": "ok", "launch_floor_us": 3.0, "launch_source": "measured: fake", "stream_tbs": 4.0,
                "stream_source": "measured: fake", "peak_tflops": None, "peak_error": "no cuBLAS in the fake"}
    cands = []
    for cand in task["candidates"]:
        name = cand["name"]
        note({"phase": "verify", "candidate": name})
        # the program a library is built from: knobs at their defaults, the canonical name
        assert cand["program_text"].startswith("kernel sm80_128x128x32 {")
        assert cand["library"] == f"/fake/{name}.so"
        if name == "crash":
            os._exit(9)
        if name == "wrong":
            cands.append({"name": name, "status": "wrong", "time_us": None, "relerr": 0.5,
                          "error": "seed 0: relerr 0.5 > 0.001"})
        else:
            cands.append({"name": name, "status": "ok", "time_us": {"fast": 8.0}.get(name, 20.0),
                          "relerr": 3e-4, "error": None})
    return {"status": "ok", "device": {"name": "Fake H200"}, "candidates": cands,
            "baselines": {n: b for n, b in ok_baselines().items() if n in task["baselines"]}}


# Each fake program has its own pipeline depth: bench builds a program under its canonical
# name, so the fakes tell the programs apart by configuration.
STAGES = {"fast": 2, "slow": 3, "wrong": 4, "crash": 5, "rejectme": 6, "brokenbuild": 7, "weights": 8}


def _program(name, layout=BLayout.KN):
    return Program(name, Family.SM80, layout, Sm80Config(Tile(128, 128, 32), stages=STAGES[name]))


def _behaviour(program) -> str:
    return {v: k for k, v in STAGES.items()}[program.config.stages]


def test_bench_end_to_end_with_fakes(tmp_path, monkeypatch, capsys):
    import l2gen.build
    import l2gen.lower
    from l2gen.build import BuildResult
    from l2gen.lower import KernelSource

    def fake_lower(program, gpu):
        name = _behaviour(program)
        if name == "rejectme":
            raise DiagnosticError([Diagnostic("E-TILE", "tile too big")])
        return KernelSource(program, gpu.name, f"e_{name}", f"// {name}", "-gencode=x")

    def fake_build_many(sources, jobs=None, timeout=600, progress=None):
        out = []
        for i, s in enumerate(sources, 1):
            if _behaviour(s.program) == "brokenbuild":
                r = BuildResult(s, None, error="kernel.cu(1): error: nope", command="nvcc ...")
            else:
                r = BuildResult(s, Path(f"/fake/{_behaviour(s.program)}.so"))
            if progress:
                progress(i, len(sources), r)
            out.append(r)
        return out

    monkeypatch.setattr(l2gen.lower, "lower", fake_lower)
    monkeypatch.setattr(l2gen.build, "build_many", fake_build_many)
    monkeypatch.setattr(bench_mod, "build_shim", lambda timeout=600: "/fake/shim.so")
    monkeypatch.setattr(bench_mod, "build_probes", lambda timeout=600: "/fake/probes.so")
    programs = [_program(n) for n in ("fast", "slow", "wrong", "crash", "rejectme", "brokenbuild")]
    programs.append(_program("weights", BLayout.NK))
    shapes = [Shape(64, 4096, 4096), Shape(37, 53, 64)]
    out = tmp_path / "bench.json"
    worker = Worker(f"{Path(__file__).stem}:fake_gpu", pythonpath=[HERE], first_task_grace=0)
    try:
        res = bench_mod.bench(programs, shapes, H200, out_json=out, plot_png=tmp_path / "s.png",
                              reps=30, seeds=2, worker=worker)
    finally:
        worker.close()

    on_disk = json.loads(out.read_text())
    assert on_disk == res
    assert {"gpu", "date", "commit", "nvcc", "rows"} <= set(on_disk)
    assert on_disk["gpu"] == "h200" and on_disk["device"] == "Fake H200"
    assert on_disk["reps"] == 30 and on_disk["seeds"] == 2
    assert (on_disk["mode"], on_disk["l2"], on_disk["b_layout"]) == ("events", "clean", "kn")
    assert on_disk["floors"]["launch_floor_us"] == 3.0 and on_disk["floors"]["stream_tbs"] == 4.0
    assert on_disk["floors"]["peak_source"] == "h200 constant in targets.py (no cuBLAS in the fake)"
    rows = on_disk["rows"]
    assert len(rows) == 6 * 2  # the nk program serves no C = A @ B shape
    for row in rows:
        assert set(row) == ROW_KEYS and set(row["baselines"]) == BASELINE_KEYS
    by = {(r["program"], r["m"]): r for r in rows}
    assert by[("fast", 64)]["status"] == "ok" and by[("fast", 64)]["l2gen_us"] == 8.0
    assert by[("fast", 64)]["speedup_vs_best"] == pytest.approx(9.5 / 8)
    assert by[("slow", 37)]["floor_pct"] == pytest.approx(100 * 3.0 / 20.0)  # 37x53x64: the launch floor
    assert by[("slow", 37)]["l2gen_us"] == 20.0
    assert by[("wrong", 64)]["status"] == "wrong" and by[("wrong", 64)]["l2gen_us"] is None
    assert by[("crash", 64)]["status"] == "run_error" and "exit status 9" in by[("crash", 64)]["error"]
    assert by[("rejectme", 64)]["status"] == "rejected" and "E-TILE" in by[("rejectme", 64)]["error"]
    assert by[("brokenbuild", 37)]["status"] == "build_error"
    assert "error: nope" in by[("brokenbuild", 37)]["error"]
    assert all(r["cublas_best_us"] == 9.5 for r in rows)
    assert by[("fast", 64)]["program_text"].startswith("kernel fast {")
    assert [s["best_program"] for s in on_disk["shapes"]] == ["fast", "fast"]

    captured = capsys.readouterr()
    assert captured.out == ""  # bench() reports on stderr; the CLI prints the table
    table = bench_mod.format_table(on_disk)
    assert "64x4096x4096" in table and "fast" in table
    assert "[bench] 1/2 64x4096x4096" in captured.err  # progress
    assert "weights: B layout nk" in captured.err


def test_knob_variants_share_a_build_and_only_limits_the_shapes(tmp_path, monkeypatch):
    """Two programs that differ only in run-time knobs build one library (the one tune
    built) and each launches with its own knobs; ``only`` runs a program on its shapes."""
    import dataclasses

    import l2gen.build
    import l2gen.lower
    from l2gen.build import BuildResult
    from l2gen.ir import Knobs, Raster
    from l2gen.lower import KernelSource

    built, launched = [], []

    def fake_lower(program, gpu):
        return KernelSource(program, gpu.name, "e_fast", "// one build", "-gencode=x")

    def fake_build_many(sources, jobs=None, timeout=600, progress=None):
        built.extend(s.key for s in sources)
        return [BuildResult(s, Path("/fake/fast.so")) for s in sources]

    def fake_measure(worker, task, timeout=None):
        launched.extend((task["m"], c["name"], c["knobs"]["raster"]) for c in task["candidates"])
        return {"status": "ok", "candidates": [{"name": c["name"], "status": "ok", "time_us": 8.0, "relerr": 1e-4}
                                               for c in task["candidates"]],
                "baselines": {n: b for n, b in ok_baselines().items() if n in task["baselines"]}}

    monkeypatch.setattr(l2gen.lower, "lower", fake_lower)
    monkeypatch.setattr(l2gen.build, "build_many", fake_build_many)
    monkeypatch.setattr(bench_mod, "build_shim", lambda timeout=600: "/fake/shim.so")
    monkeypatch.setattr(bench_mod, "build_probes", lambda timeout=600: "/fake/probes.so")
    monkeypatch.setattr(bench_mod, "probe_floors", lambda *a, **kw: FLOORS)
    a = _program("fast")
    b = dataclasses.replace(a, name="fast_along_m", knobs=Knobs(raster=Raster.ALONG_M))
    s1, s2 = Shape(64, 64, 64), Shape(128, 64, 64)
    res = bench_mod.bench([a, b], [s1, s2], H200, out_json=tmp_path / "r.json", worker=FakeWorker(fake_measure),
                          only={s2: {"fast_along_m"}}, progress=None)
    assert len(set(built)) == 1
    assert launched == [(64, "fast", "heuristic"), (64, "fast_along_m", "along_m"), (128, "fast_along_m", "along_m")]
    assert [(r["m"], r["program"]) for r in res["rows"]] == [(64, "fast"), (64, "fast_along_m"), (128, "fast_along_m")]
    assert "raster       along_m" in res["rows"][2]["program_text"]


def test_rounds_reach_the_task_and_each_rounds_median_reaches_the_row(tmp_path, monkeypatch):
    """``rounds`` goes to the worker task; the per-round medians it reports, the program's
    and the baselines', are kept in the row (and absent with one round)."""
    import l2gen.build
    import l2gen.lower
    from l2gen.build import BuildResult
    from l2gen.lower import KernelSource

    tasks = []

    def fake_measure(worker, task, timeout=None):
        tasks.append(task)
        base = {n: dict(b, round_us=[b["time_us"]] * task["rounds"])
                for n, b in ok_baselines().items() if n in task["baselines"]}
        return {"status": "ok", "baselines": base,
                "candidates": [{"name": c["name"], "status": "ok", "time_us": 8.0, "relerr": 1e-4,
                                "round_us": [7.9, 8.0, 8.1]} for c in task["candidates"]]}

    monkeypatch.setattr(l2gen.lower, "lower", lambda p, gpu: KernelSource(p, gpu.name, "e", "//", "-gencode=x"))
    monkeypatch.setattr(l2gen.build, "build_many", lambda sources, **kw: [BuildResult(s, Path("/fake/x.so")) for s in sources])
    monkeypatch.setattr(bench_mod, "build_shim", lambda timeout=600: "/fake/shim.so")
    monkeypatch.setattr(bench_mod, "build_probes", lambda timeout=600: "/fake/probes.so")
    monkeypatch.setattr(bench_mod, "probe_floors", lambda *a, **kw: FLOORS)
    res = bench_mod.bench([_program("fast")], [Shape(64, 64, 64)], H200, out_json=tmp_path / "r.json",
                          worker=FakeWorker(fake_measure), rounds=3, progress=None)
    assert tasks[0]["rounds"] == 3 and res["rounds"] == 3
    row = res["rows"][0]
    assert set(row) == ROW_KEYS | {"round_us", "baseline_round_us"}
    assert row["round_us"] == [7.9, 8.0, 8.1]
    assert row["baseline_round_us"]["cublas_us"] == [11.0] * 3
    plain = make_row(Shape(64, 64, 64), "p", "", {"status": "ok", "time_us": 8.0}, ok_baselines(), FLOORS)
    assert set(plain) == ROW_KEYS


def _fake_build(monkeypatch):
    import l2gen.build
    import l2gen.lower
    from l2gen.build import BuildResult
    from l2gen.lower import KernelSource

    monkeypatch.setattr(l2gen.lower, "lower", lambda p, gpu: KernelSource(p, gpu.name, "e", "//", "-gencode=x"))
    monkeypatch.setattr(l2gen.build, "build_many", lambda sources, **kw: [BuildResult(s, Path("/fake/x.so")) for s in sources])
    monkeypatch.setattr(bench_mod, "build_shim", lambda timeout=600: "/fake/shim.so")
    monkeypatch.setattr(bench_mod, "build_probes", lambda timeout=600: "/fake/probes.so")
    monkeypatch.setattr(bench_mod, "probe_floors", lambda *a, **kw: FLOORS)


def test_server_mode_reaches_the_task_and_its_medians_and_means_reach_the_file(tmp_path, monkeypatch):
    tasks = []
    figures = {"calls": 30, "event_median_us": 8.0, "event_mean_us": 9.0, "wall_median_us": 20.0, "wall_mean_us": 25.0}

    def fake_measure(worker, task, timeout=None):
        tasks.append((task, timeout))
        base = {n: dict(b, server=dict(figures, event_median_us=b["time_us"])) for n, b in ok_baselines().items()}
        return {"status": "ok", "baselines": base,
                "candidates": [{"name": c["name"], "status": "ok", "time_us": 8.0, "relerr": 1e-4, "server": figures}
                               for c in task["candidates"]]}

    _fake_build(monkeypatch)
    protocol = Protocol("server", qps=50.0, seed=7)
    res = bench_mod.bench([_program("fast")], [Shape(64, 64, 64)], H200, out_json=tmp_path / "r.json",
                          worker=FakeWorker(fake_measure), protocol=protocol, progress=None, reps=30)
    task, timeout = tasks[0]
    assert (task["mode"], task["l2"], task["qps"], task["seed"]) == ("server", "clean", 50.0, 7)
    assert timeout >= 7 * 120 * 2 / 50  # 7 runners x 120 calls (a short shape: 4 x 30) at 50 per second, twice over
    assert (res["mode"], res["qps"], res["seed"], res["rounds"]) == ("server", 50.0, 7, 1)
    row = res["rows"][0]
    assert row["server"] == figures and row["baseline_server"]["cublas_us"]["event_median_us"] == 11.0
    assert res["shapes"][0]["baseline_server"]["torch_matmul_us"]["wall_mean_us"] == 25.0
    table = bench_mod.format_table(res)
    assert "event med" in table and "timed in server mode at 50 calls/s, l2 clean" in table
    server_lines = [line.split() for line in table.splitlines() if line.startswith("64x64x64") and len(line.split()) == 7]
    assert ["64x64x64", "fast", "30", "8.00", "9.00", "20.00", "25.00"] in server_lines


def test_graph_mode_gives_each_shape_its_calls_and_keeps_uncapturable_rows(tmp_path, monkeypatch):
    tasks = []

    def fake_measure(worker, task, timeout=None):
        tasks.append(task)
        cands = [{"name": "fast", "status": "ok", "time_us": 8.0, "relerr": 1e-4,
                  "graph": {"calls": task["graph_calls"], "copies": 3, "replays": 20}},
                 {"name": "slow", "status": "capture_error", "time_us": None, "relerr": 1e-4,
                  "error": "cannot be captured in a CUDA graph: the capture was invalidated"}]
        return {"status": "ok", "baselines": ok_baselines(), "candidates": cands}

    _fake_build(monkeypatch)
    shapes = [Shape(64, 64, 64), Shape(8192, 8192, 8192)]
    res = bench_mod.bench([_program("fast"), _program("slow")], shapes, H200, out_json=tmp_path / "r.json",
                          worker=FakeWorker(fake_measure), protocol=Protocol("graph"), progress=None)
    assert [t["graph_calls"] for t in tasks] == [100, 10]  # a slow shape's graph holds fewer calls
    assert res["graph_calls"] == 100 and res["mode"] == "graph"
    by = {(r["program"], r["m"]): r for r in res["rows"]}
    assert by[("fast", 64)]["graph"]["copies"] == 3
    assert by[("slow", 64)]["status"] == "capture_error" and "CUDA graph" in by[("slow", 64)]["error"]
    assert json.loads((tmp_path / "r.json").read_text()) == res  # nothing lost


def test_the_baselines_alone(tmp_path, monkeypatch):
    tasks = []

    def fake_measure(worker, task, timeout=None):
        tasks.append(task)
        return {"status": "ok", "baselines": ok_baselines(), "candidates": []}

    _fake_build(monkeypatch)
    lines = []
    res = bench_mod.bench([], [Shape(16, 4096, 4096)], H200, out_json=tmp_path / "r.json", worker=FakeWorker(fake_measure),
                          b_layout="nk", progress=lines.append)
    assert tasks[0]["candidates"] == [] and tasks[0]["b_layout"] == "nk" and res["b_layout"] == "nk"
    assert res["rows"] == [] and res["shapes"][0]["cublas_best_us"] == 9.5
    assert "[bench] no programs: timing the baselines alone" in lines
    assert "9.50" in bench_mod.format_table(res)


def test_a_row_carries_each_back_to_back_batchs_time_per_call():
    def batch(us):
        return {"event_vs_wall": {"event_us": 1.0, "wall_us": us, "host_us": 1.0, "batch": 10, "batch_event_us": us}}

    base = ok_baselines()
    for name, us in (("torch_matmul", 12.0), ("cublas", 11.5)):
        base[name].update(batch(us))
    row = make_row(Shape(64, 4096, 4096), "p", "", {"status": "ok", "time_us": 8.0, **batch(9.0)}, base, FLOORS)
    assert row["batch_us"] == 9.0
    assert row["baseline_batch_us"]["torch_matmul_us"] == 12.0 and row["baseline_batch_us"]["cublas_us"] == 11.5
    assert row["baseline_batch_us"]["cublaslt_autotuned_us"] is None  # it timed no batch
    plain = make_row(Shape(64, 4096, 4096), "p", "", {"status": "ok", "time_us": 8.0}, ok_baselines(), FLOORS)
    assert "batch_us" not in plain and "baseline_batch_us" not in plain


def test_row_of_a_run_timed_in_sustained_blocks():
    """With sustained blocks the row carries the program's and every baseline's back-to-back
    time per call, and the program's blocks; without them, neither."""
    base = ok_baselines()
    for name, b in base.items():
        b["sustained_us"] = 2.0 * b["time_us"]
    base["torch_matmul"] = {"status": "wrong", "time_us": 1.0, "error": "bad", "sustained_us": 1.0}
    cand = {"status": "ok", "time_us": 8.0, "sustained_us": 9.0, "sustained_blocks_us": [8.9, 9.0, 9.4]}
    row = make_row(Shape(64, 4096, 4096), "p", "", cand, base, FLOORS)
    assert row["sustained_us"] == 9.0 and row["sustained_blocks_us"] == [8.9, 9.0, 9.4]
    assert row["baseline_sustained_us"]["cublas_us"] == 2.0 * base["cublas"]["time_us"]
    assert row["baseline_sustained_us"]["torch_matmul_us"] is None  # a failed baseline has no time
    plain = make_row(Shape(64, 4096, 4096), "p", "", {"status": "ok", "time_us": 8.0}, ok_baselines(), FLOORS)
    assert "sustained_us" not in plain and "baseline_sustained_us" not in plain
