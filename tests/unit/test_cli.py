"""The command line: exit codes (0 ok, 1 diagnostics or failure, 2 usage), located errors,
no tracebacks, and the LLM policy end to end through ``l2gen tune`` on the simulated GPU."""

from __future__ import annotations

import json

import pytest
from pathlib import Path


from l2gen.cli import main

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.l2"))
GOOD = "kernel k {\n  arch sm80\n  tile 64 x 64 x 32\n}\n"


def write(tmp_path, name, text) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_every_example_checks(capsys):
    assert len(EXAMPLES) >= 6
    assert main(["check", *map(str, EXAMPLES)]) == 0
    out = capsys.readouterr().out
    assert out.count(": ok (") == len(EXAMPLES)


def test_check_reports_location_and_exits_1(tmp_path, capsys):
    bad = write(tmp_path, "bad.l2", "kernel k {\n  arch sm80\n  tile 100 x 64 x 32\n}\n")
    assert main(["check", bad]) == 1
    err = capsys.readouterr().err
    assert f"{bad}:3:3: E-RANGE: tile BM 100" in err
    assert "Traceback" not in err


def test_parse_error_exits_1(tmp_path, capsys):
    bad = write(tmp_path, "bad.l2", "kernel k { arch sm80 tile 64 x 64 }")
    assert main(["check", bad]) == 1
    assert f"{bad}:1:35: E-PARSE" in capsys.readouterr().err


def test_missing_file_exits_1(tmp_path, capsys):
    assert main(["check", str(tmp_path / "nope.l2")]) == 1
    assert "E-IO" in capsys.readouterr().err


def test_usage_errors_exit_2(capsys):
    assert main([]) == 2
    assert main(["check"]) == 2
    assert main(["--gpu", "v100", "check", "x.l2"]) == 2
    assert main(["frobnicate"]) == 2


def test_target_gpu_changes_the_verdict(tmp_path, capsys):
    sm90 = write(tmp_path, "h.l2", "kernel h { arch sm90a tile 128 x 128 x 64 }")
    assert main(["check", sm90]) == 0
    assert main(["--gpu", "a100", "check", sm90]) == 1
    assert "E-ARCH" in capsys.readouterr().err


def test_fmt_prints_canonical_and_keeps_comments(tmp_path, capsys):
    path = write(tmp_path, "k.l2", "# what it is for\n" + GOOD)
    assert main(["fmt", "--check", path]) == 1
    assert main(["fmt", "-w", path]) == 0
    text = Path(path).read_text()
    assert text.startswith("# what it is for\nkernel k {") and "smem_swizzle 2 3 3" in text
    assert main(["fmt", "--check", path]) == 0


def test_compile_writes_source_and_command(tmp_path, capsys):
    path = write(tmp_path, "k.l2", GOOD)
    out = tmp_path / "out"
    assert main(["compile", path, "-o", str(out)]) == 0
    cu = (out / "k.cu").read_text()
    assert 'extern "C"' in cu and "kernel k {" in cu
    command = (out / "k.nvcc.sh").read_text()
    assert "-DNDEBUG" in command and "-gencode=arch=compute_90,code=sm_90" in command


def test_build_failure_prints_log_and_reproduce_command(tmp_path, capsys, failing_nvcc):
    path = write(tmp_path, "k.l2", GOOD)
    assert main(["build", path]) == 1
    err = capsys.readouterr().err
    assert "build failed" in err and "something is wrong" in err
    assert "reproduce with:" in err and str(failing_nvcc) in err
    assert "Traceback" not in err


def test_tune_bad_input_is_a_clear_error(tmp_path, capsys):
    empty = write(tmp_path, "empty.json", json.dumps({"shapes": []}))
    assert main(["tune", "--suite", empty, "--simulate", "--db", str(tmp_path / "k.db")]) == 1
    assert "E-SUITE" in capsys.readouterr().err
    assert main(["tune", "--shape", "64x64x64", "--budget", "0", "--simulate"]) == 2  # an argument out of range
    assert "--budget: must be at least 1" in capsys.readouterr().err
    assert main(["tune", "--shape", "64x64", "--simulate"]) == 2
    assert "E-SHAPE" in capsys.readouterr().err
    garbage = write(tmp_path, "bad.db", "this is not sqlite" * 100)
    assert main(["tune", "--shape", "64x64x64", "--simulate", "--db", garbage]) == 1
    assert "E-DB" in capsys.readouterr().err
    db = tmp_path / "never.db"
    assert main(["tune", "--shape", "64x64x64", "--simulate", "--sustained", "50", "--db", str(db)]) == 2
    assert "back to back on a GPU" in capsys.readouterr().err and not db.exists()


def test_tune_simulated_then_db_show_and_export(tmp_path, capsys):
    db = str(tmp_path / "k.db")
    curves = tmp_path / "curves.json"
    assert main(["tune", "--shape", "64x4096x4096", "--budget", "8", "--simulate", "--db", db, "--curves", str(curves)]) == 0
    assert "64x4096x4096" in capsys.readouterr().out
    assert len(json.loads(curves.read_text())["curves"]["64x4096x4096"]) == 8
    assert main(["db", "show", "--db", db]) == 0
    assert "8 measurements" in capsys.readouterr().out
    assert main(["db", "export", str(tmp_path / "k.json"), "--db", db]) == 0
    assert main(["db", "export", "--db", db, str(tmp_path / "k2.json")]) == 0  # either order
    assert json.loads((tmp_path / "k2.json").read_text()) == json.loads((tmp_path / "k.json").read_text())
    assert main(["db", "export", "--db", db]) == 2  # no file named: a usage error
    assert "required: file" in capsys.readouterr().err
    # a rerun resumes: the budget is already spent, nothing new is measured
    assert main(["tune", "--shape", "64x4096x4096", "--budget", "8", "--simulate", "--db", db]) == 0
    assert main(["db", "show", "--db", db]) == 0
    assert "8 measurements" in capsys.readouterr().out


def test_tune_llm_policy_needs_configuration(tmp_path, monkeypatch, capsys):
    for var in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "L2GEN_LLM_MODEL"):
        monkeypatch.delenv(var, raising=False)
    assert main(["tune", "--shape", "64x4096x4096", "--policy", "llm", "--simulate", "--db", str(tmp_path / "k.db")]) == 1
    err = capsys.readouterr().err
    assert "OPENAI_BASE_URL" in err and "L2GEN_LLM_MODEL" in err


def test_tune_llm_policy_end_to_end_against_a_loopback_server(tmp_path, monkeypatch, capsys):
    from .test_llm import FakeOpenAI, distinct, fenced

    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    server = FakeOpenAI()
    try:
        server.default = distinct(fenced)
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        monkeypatch.setenv("L2GEN_LLM_MODEL", "fake-model")
        db = str(tmp_path / "k.db")
        rc = main(["tune", "--shape", "128x4096x4096", "--budget", "4", "--batch", "2", "--policy", "llm",
                   "--llm-mode", "text", "--simulate", "--db", db])
        assert rc == 0
        out = capsys.readouterr().out
        assert "128x4096x4096" in out and "llm usage:" in out
        assert main(["db", "show", "--db", db]) == 0
        assert "4 measurements" in capsys.readouterr().out
        # each task prompt shows the cost model's first knob settings of the shipped library
        from l2gen.ir import BLayout
        from l2gen.problem import Shape
        from l2gen.search.library import load, predictions
        from l2gen.search.llm_prompt import one_line
        from l2gen.targets import GPUS

        first = predictions(load(GPUS["h200"]), Shape(128, 4096, 4096), GPUS["h200"], 5, b_layout=BLayout.KN)
        prompts = [str(body) for _, body in server.requests]
        assert prompts and all("cost model's first choices" in p and one_line(first[0][0]) in p for p in prompts)
    finally:
        server.close()


def test_bench_without_a_gpu_says_so(monkeypatch, capsys):
    import l2gen.runtime

    monkeypatch.setattr(l2gen.runtime, "device_count", lambda: 0)
    assert main(["bench", str(EXAMPLES[0]), "--shape", "64x64x64"]) == 1
    assert "E-GPU: no CUDA GPU found" in capsys.readouterr().err


def test_bench_db_runs_each_best_on_its_own_shape(tmp_path, monkeypatch, capsys):
    """``l2gen bench --db`` with no shapes: the database's shapes, each with its own best;
    a program best on two shapes runs once per shape under one unique name."""
    import l2gen.bench
    import l2gen.runtime
    from l2gen.db import KernelDB
    from l2gen.parse import parse
    from l2gen.problem import Measurement, Shape
    from l2gen.targets import GPUS

    db = KernelDB(tmp_path / "k.db")
    fast = parse(GOOD.replace("kernel k", "kernel sm80_64x64x32"))
    slow = parse(GOOD.replace("tile 64 x 64 x 32", "tile 128 x 64 x 32").replace("kernel k", "kernel sm80_128x64x32"))
    for shape, program, t in [((64, 64, 64), fast, 5.0), ((64, 64, 64), slow, 9.0), ((128, 64, 64), fast, 6.0), ((256, 64, 64), slow, 7.0)]:
        db.add(Measurement(Shape(*shape), program, "ok", time_us=t, baseline_us=10.0), GPUS["h200"])
    seen = {}

    def fake_bench(programs, shapes, gpu, *, only=None, **kw):
        seen.update(names=[p.name for p in programs], shapes=shapes, only=only)
        return {"rows": [], "shapes": []}

    monkeypatch.setattr(l2gen.runtime, "device_count", lambda: 1)
    monkeypatch.setattr(l2gen.bench, "bench", fake_bench)
    assert main(["bench", "--db", str(tmp_path / "k.db"), "-o", str(tmp_path / "r.json"), "--no-plot"]) == 0
    assert seen["names"] == ["sm80_64x64x32_64x64x64", "sm80_128x64x32_256x64x64"]
    assert seen["shapes"] == [Shape(64, 64, 64), Shape(128, 64, 64), Shape(256, 64, 64)]
    assert seen["only"] == {Shape(64, 64, 64): {"sm80_64x64x32_64x64x64"}, Shape(128, 64, 64): {"sm80_64x64x32_64x64x64"},
                            Shape(256, 64, 64): {"sm80_128x64x32_256x64x64"}}
    # --top 2: the runner-up of 64x64x64 runs there too, under the name it first ranked with
    assert main(["bench", "--db", str(tmp_path / "k.db"), "--top", "2", "-o", str(tmp_path / "r.json"), "--no-plot"]) == 0
    assert seen["names"] == ["sm80_64x64x32_64x64x64", "sm80_128x64x32_64x64x64"]
    assert seen["only"] == {Shape(64, 64, 64): {"sm80_64x64x32_64x64x64", "sm80_128x64x32_64x64x64"},
                            Shape(128, 64, 64): {"sm80_64x64x32_64x64x64"}, Shape(256, 64, 64): {"sm80_128x64x32_64x64x64"}}
    # two knob variants of one name ranking on one shape get distinct names
    from dataclasses import replace

    from l2gen.ir import Knobs, Raster

    db.add(Measurement(Shape(64, 64, 64), replace(fast, knobs=Knobs(raster=Raster.ALONG_M)), "ok", time_us=5.5, baseline_us=10.0), GPUS["h200"])
    assert main(["bench", "--db", str(tmp_path / "k.db"), "--top", "3", "-o", str(tmp_path / "r.json"), "--no-plot"]) == 0
    assert seen["names"][:2] == ["sm80_64x64x32_64x64x64", "sm80_64x64x32_64x64x64_2"]
    # a database rebuilt from such a bench keeps those names: benched again, they do not grow
    db.add(Measurement(Shape(512, 64, 64), replace(slow, name="sm80_128x64x32_512x64x64", knobs=Knobs(raster=Raster.ALONG_M)), "ok", time_us=5.0, baseline_us=10.0),
           GPUS["h200"])
    assert main(["bench", "--db", str(tmp_path / "k.db"), "-o", str(tmp_path / "r.json"), "--no-plot"]) == 0
    assert "sm80_128x64x32_512x64x64" in seen["names"]


def test_embedded_tune_starts_from_the_shipped_policy_unless_told(tmp_path, capsys):
    from l2gen.search.policies import shipped_policy
    from l2gen.targets import GPUS

    if shipped_policy(GPUS["h200"]) is None:
        pytest.skip("no policy state shipped for the H200 in this checkout")
    db = str(tmp_path / "k.db")
    args = ["tune", "--shape", "64x4096x4096", "--budget", "4", "--batch", "4", "--simulate", "--db", db]
    assert main(args) == 0
    assert "starting from the trained state shipped for h200" in capsys.readouterr().err
    assert main([*args[:-1], str(tmp_path / "k2.db"), "--fresh-policy"]) == 0
    assert "shipped" not in capsys.readouterr().err


def test_build_makes_the_shared_library_of_files_and_database_bests(tmp_path, monkeypatch, capsys):
    """``l2gen build`` builds a program's compile-time configuration (knobs at their
    defaults, canonical name): the library bench, tune and the dispatcher load."""
    import l2gen.build
    from l2gen.build import BuildResult
    from l2gen.db import KernelDB
    from l2gen.ir import Knobs
    from l2gen.parse import parse
    from l2gen.problem import Measurement, Shape
    from l2gen.targets import GPUS

    built = []

    def fake_build_many(sources, **kw):
        built.extend(sources)
        return [BuildResult(s, tmp_path / f"{s.entry}.so") for s in sources]

    monkeypatch.setattr(l2gen.build, "build_many", fake_build_many)
    db = KernelDB(tmp_path / "k.db")
    best = parse(GOOD.replace("}", "  raster along_m\n}"))
    db.add(Measurement(Shape(64, 64, 64), best, "ok", time_us=5.0, baseline_us=10.0), GPUS["h200"])
    path = write(tmp_path, "k.l2", GOOD.replace("kernel k", "kernel mine"))
    assert main(["build", path, "--db", str(tmp_path / "k.db")]) == 0
    assert len(built) == 1  # the same configuration: one library, compiled once
    assert all(s.program.knobs == Knobs() and s.program.name == "sm80_64x64x32" for s in built)
    out = capsys.readouterr().out
    assert f"{tmp_path / 'k.db'}:64x64x64" in out
    libraries = {line.rsplit(": ", 1)[1] for line in out.splitlines()}
    assert libraries == {str(tmp_path / f"{built[0].entry}.so")}  # the file's and the database's
    assert main(["build"]) == 1
    assert "nothing to build" in capsys.readouterr().err


# ---- timing protocols on the command line --------------------------------------------


@pytest.mark.parametrize("args, words", [
    (["--mode", "batch"], "invalid choice: 'batch'"),
    (["--l2", "lukewarm"], "invalid choice: 'lukewarm'"),
    (["--mode", "server", "--qps", "0"], "--qps must be a positive number"),
    (["--mode", "server", "--qps", "-5"], "--qps must be a positive number"),
    (["--qps", "100"], "--qps sets the arrival rate of server mode; this is events mode"),
    (["--mode", "graph", "--graph-calls", "0"], "--graph-calls must be a positive"),
])
def test_bench_refuses_bad_protocols_with_exit_2(args, words, capsys):
    assert main(["bench", str(EXAMPLES[0]), "--shape", "64x64x64", *args]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_bench_takes_the_suites_b_layout_and_refuses_a_contradiction(tmp_path, monkeypatch, capsys):
    import l2gen.bench
    import l2gen.runtime

    seen = {}

    def fake_bench(programs, shapes, gpu, *, b_layout="kn", protocol=None, **kw):
        seen.update(programs=programs, b_layout=b_layout, protocol=protocol)
        return {"rows": [], "shapes": []}

    monkeypatch.setattr(l2gen.runtime, "device_count", lambda: 1)
    monkeypatch.setattr(l2gen.bench, "bench", fake_bench)
    suite = write(tmp_path, "llm.json", json.dumps({"shapes": [{"m": 16, "n": 4096, "k": 4096, "b": "nk"}]}))
    assert main(["bench", "--suite", suite, "-o", str(tmp_path / "r.json"), "--no-plot"]) == 0  # the baselines alone
    assert seen["programs"] == [] and seen["b_layout"] == "nk"
    assert (seen["protocol"].mode, seen["protocol"].l2) == ("events", "clean")
    assert main(["bench", "--suite", suite, "--b", "kn", "--no-plot"]) == 2
    assert "--b kn, but" in capsys.readouterr().err
    mixed = write(tmp_path, "mixed.json", json.dumps({"shapes": [{"m": 1, "n": 8, "k": 8, "b": "nk"}, {"m": 1, "n": 8, "k": 8, "b": "kn"}]}))
    assert main(["bench", "--suite", mixed, "--no-plot"]) == 1
    assert "E-SUITE" in capsys.readouterr().err


def test_bench_exits_2_when_graph_mode_cannot_capture_a_program_and_keeps_the_rest(tmp_path, monkeypatch, capsys):
    import l2gen.bench
    import l2gen.runtime

    out = tmp_path / "r.json"

    def fake_bench(programs, shapes, gpu, *, out_json, protocol=None, **kw):
        rows = [{"m": 64, "n": 64, "k": 64, "program": "k", "status": "ok", "error": None, "l2gen_us": 5.0, "tflops": 0.1,
                 "floor_pct": 60.0, "baselines": {}, "speedup_vs_best": None, "relerr": 2e-4},
                {"m": 64, "n": 64, "k": 64, "program": "syncs", "status": "capture_error", "l2gen_us": None, "tflops": None,
                 "floor_pct": None, "baselines": {}, "speedup_vs_best": None, "relerr": None,
                 "error": "cannot be captured in a CUDA graph: the capture was invalidated"}]
        results = {"mode": protocol.mode, "l2": protocol.l2, "rows": rows, "shapes": []}
        Path(out_json).write_text(json.dumps(results))
        return results

    monkeypatch.setattr(l2gen.runtime, "device_count", lambda: 1)
    monkeypatch.setattr(l2gen.bench, "bench", fake_bench)
    assert main(["bench", str(EXAMPLES[0]), "--shape", "64x64x64", "--mode", "graph", "-o", str(out), "--no-plot"]) == 2
    err = capsys.readouterr().err
    assert "cannot run in a CUDA graph (syncs)" in err and f"every other row is in {out}" in err
    assert [r["status"] for r in json.loads(out.read_text())["rows"]] == ["ok", "capture_error"]


def test_tune_and_db_refuse_a_database_of_another_protocol(tmp_path, capsys):
    db = str(tmp_path / "k.db")
    assert main(["tune", "--shape", "64x4096x4096", "--budget", "2", "--simulate", "--db", db]) == 0  # clean
    capsys.readouterr()
    assert main(["tune", "--shape", "64x4096x4096", "--budget", "4", "--simulate", "--db", db, "--l2", "dirty"]) == 2
    err = capsys.readouterr().err
    assert "E-PROTOCOL" in err and "l2=clean, not l2=dirty" in err
    assert main(["db", "show", "--db", db]) == 0
    assert "2 measurements (l2 clean)" in capsys.readouterr().out
    old = Path(__file__).resolve().parents[2] / "bench/results/2026-12-02-h200-examples-public-run1.json"
    assert main(["db", "import-bench", str(old), "--db", db]) == 2  # written-flush rows into a clean database
    assert "l2=clean, not l2=dirty" in capsys.readouterr().err
    assert main(["db", "import-bench", str(old), "--db", str(tmp_path / "old.db")]) == 0
    assert main(["db", "show", "--db", str(tmp_path / "old.db")]) == 0
    assert "(l2 dirty)" in capsys.readouterr().out


def test_the_shipped_suites_load():
    from l2gen.cli.run import load_suite, suite_layout

    root = Path(__file__).resolve().parents[2] / "suites"
    llm = load_suite(str(root / "llm.json"))
    assert len(llm) == 44 and suite_layout(str(root / "llm.json")) == "nk"
    public = set(load_suite(str(root / "public.json")))
    modes = load_suite(str(root / "modes.json"))
    assert len(modes) == 5 and set(modes) <= public and suite_layout(str(root / "public.json")) is None


def test_a_simulated_tune_has_a_database_of_its_own_by_default(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["tune", "--simulate", "--budget", "2", "--shape", "64x4096x4096"]) == 0
    assert (tmp_path / "l2gen-kernels-simulated.db").is_file() and not (tmp_path / "l2gen-kernels.db").exists()
    # and the database of measured rows refuses simulated ones (exit 2, nothing added)
    from l2gen.db import KernelDB
    from l2gen.ir import Family
    from l2gen.problem import Measurement, Shape
    from l2gen.space import assemble

    with KernelDB(tmp_path / "real.db") as db:
        db.add(Measurement(Shape(64, 64, 64), assemble(Family.SM90, dict(bm=128, bn=128, bk=64)), "ok", time_us=1.0, baseline_us=2.0), "h200")
    capsys.readouterr()
    assert main(["tune", "--simulate", "--budget", "2", "--shape", "64x4096x4096", "--db", str(tmp_path / "real.db")]) == 2
    assert "separate databases" in capsys.readouterr().err
    with KernelDB(tmp_path / "real.db") as db:
        assert db.count() == 1


def test_fmt_w_refuses_to_drop_an_inline_comment(tmp_path, capsys):
    path = tmp_path / "k.l2"
    text = "kernel k {\n    arch sm80\n    tile 64 x 128 x 64   # why this tile\n}\n"
    path.write_text(text)
    assert main(["fmt", "-w", str(path)]) == 1
    assert f"{path}:3:26: E-FMT" in capsys.readouterr().err
    assert path.read_text() == text


def test_sample_without_a_compiler_stops_before_its_first_program(monkeypatch, tmp_path, capsys):
    """A sample of any size needs nvcc for every program: without one it ends at once with
    a message, not after failing each program in turn (a huge --count never ends)."""
    monkeypatch.setenv("L2GEN_NVCC", str(tmp_path / "no-nvcc"))
    assert main(["sample", "--count", "100000", "-o", str(tmp_path / "s.json")]) == 1
    assert "E-TOOLCHAIN" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # no report, no partial tally
    assert main(["sample", "--count", "100001"]) == 2  # over the cap: a usage error


def test_a_tune_records_the_card_it_measures_on_and_warns_off_target(capsys):
    from l2gen.cli.tune import measured_on
    from l2gen.runtime import DeviceInfo
    from l2gen.targets import GPUS

    def card(name):
        return lambda device: DeviceInfo(name=name, sm=90, sms=132, l2_bytes=50 << 20)

    assert measured_on(GPUS["h200"], card("NVIDIA H200")) == {"device": "NVIDIA H200"}
    assert capsys.readouterr().err == ""
    assert measured_on(GPUS["h200"], card("NVIDIA H100 80GB HBM3")) == {"device": "NVIDIA H100 80GB HBM3"}
    err = capsys.readouterr().err
    assert "measuring on NVIDIA H100 80GB HBM3, not on the h200" in err

    def no_device(device):
        raise RuntimeError("no CUDA device")

    assert measured_on(GPUS["h200"], no_device) == {}


def test_a_bench_says_when_it_times_another_card_than_its_target():
    """Run on a lent H100 with the default --gpu (h200), a bench's rows name the H200 and no
    database takes them: it says so, and which --gpu would make rows an H100 database takes."""
    from l2gen.cli.common import off_target_card, target_of
    from l2gen.runtime import DeviceInfo
    from l2gen.targets import GPUS

    def card(name):
        return lambda device: DeviceInfo(name=name, sm=90, sms=132, l2_bytes=50 << 20)

    assert off_target_card(GPUS["h200"], card("NVIDIA H200")) is None
    assert off_target_card(GPUS["h200"], card("NVIDIA H100 80GB HBM3")) == "NVIDIA H100 80GB HBM3"
    assert target_of("NVIDIA H100 80GB HBM3") == "h100" and target_of("NVIDIA H200") == "h200"
    assert target_of("NVIDIA GeForce RTX 4090") is None

    def no_device(device):
        raise RuntimeError("no CUDA device")

    assert off_target_card(GPUS["h200"], no_device) is None
