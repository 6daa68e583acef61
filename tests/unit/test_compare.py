"""l2gen.compare and ``l2gen compare``: which speedups reproduce between two bench runs, or
between a kernel database's records and a bench run."""

from __future__ import annotations

import json

import pytest

from l2gen.cli import main
from l2gen.compare import Pair, compare_db, compare_results
from l2gen.parse import parse
from l2gen.protocol import ProtocolMismatch
from l2gen.problem import Shape

TEXT = "kernel {name} {{\n  arch sm80\n  tile 64 x 64 x 32\n}}\n"


def row(m, program, speedup, text=None):
    return {"m": m, "n": 64, "k": 64, "program": program, "speedup_vs_best": speedup,
            "program_text": text or TEXT.format(name=program)}


def results(rows, shapes):
    return {"rows": rows, "shapes": [{"m": m, "n": 64, "k": 64, "speedup_vs_best": s} for m, s in shapes]}


def test_pair_change_and_tolerance():
    p = Pair(Shape(1, 8, 8), "a", 1.00, 1.02)
    assert p.change == pytest.approx(0.02) and p.within(0.03) and not p.within(0.01)
    assert Pair(Shape(1, 8, 8), "a", 1.0, None).change is None
    assert not Pair(Shape(1, 8, 8), "a", None, 1.0).within(0.5)  # missing on one side never reproduces


def test_two_runs_pair_rows_and_bests():
    a = results([row(64, "x", 0.90), row(64, "y", 1.10), row(128, "x", 0.50)], [(64, 1.10), (128, 0.50)])
    b = results([row(64, "x", 0.91), row(64, "y", 1.20), row(128, "x", None)], [(64, 1.20), (128, None)])
    c = compare_results(a, b)
    assert len(c.pairs) == 3 + 2
    missed = {(p.shape.m, p.what) for p in c.misses()}
    assert missed == {(64, "y"), (128, "x"), (64, "best"), (128, "best")}
    s = c.summary()
    assert s["program"] == {"pairs": 3, "within": 1, "missing": 1, "max_change": pytest.approx(0.1 / 1.1)}
    assert not c.ok
    table = c.table()
    assert "1 of 3 program x shape speedups within 3%" in table and "0 of 2 per-shape best" in table
    assert compare_results(a, a).ok


def test_database_against_a_bench_matches_programs_by_text_not_name():
    recorded = {Shape(64, 64, 64): (parse(TEXT.format(name="k1")), 1.05, 10.0),
                Shape(128, 64, 64): (parse(TEXT.format(name="k2")), 0.80, 20.0)}
    bench = results([row(64, "k1_64x64x64", 1.04, TEXT.format(name="renamed")), row(128, "other", 0.80, "kernel broken {")], [])
    c = compare_db(recorded, bench)
    assert [(p.shape.m, p.first, p.second) for p in c.pairs] == [(64, 1.05, 1.04), (128, 0.80, None)]
    assert [p.shape.m for p in c.misses()] == [128]


def test_cli_compare_exit_codes_and_json(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(results([row(64, "x", 1.0)], [(64, 1.0)])))
    b.write_text(json.dumps(results([row(64, "x", 1.01)], [(64, 1.01)])))
    out = tmp_path / "cmp.json"
    assert main(["compare", str(a), str(b), "-o", str(out)]) == 0
    assert "1 of 1 per-shape best speedups within 3%" in capsys.readouterr().out
    assert json.loads(out.read_text())["ok"] is True
    assert main(["compare", str(a), str(b), "--tolerance", "0.001"]) == 1
    assert main(["compare", str(a)]) == 1
    assert "give two bench results files" in capsys.readouterr().err
    assert main(["compare", str(a), str(tmp_path / "missing.json")]) == 1
    assert "E-RESULTS" in capsys.readouterr().err


def test_cli_compare_with_a_database(tmp_path, capsys):
    from l2gen.db import KernelDB
    from l2gen.problem import Measurement
    from l2gen.targets import GPUS

    db = KernelDB(tmp_path / "k.db")
    db.add(Measurement(Shape(64, 64, 64), parse(TEXT.format(name="k1")), "ok", time_us=10.0, baseline_us=10.5), GPUS["h200"])
    bench = tmp_path / "r.json"
    bench.write_text(json.dumps(dict(results([row(64, "k1_64x64x64", 1.04, TEXT.format(name="k1"))], [(64, 1.04)]), l2="clean")))
    assert main(["compare", "--db", str(tmp_path / "k.db"), str(bench)]) == 0
    assert "1 of 1 program x shape speedups within 3%" in capsys.readouterr().out
    # a results file without a protocol was timed after the written flush: not against clean records
    legacy = tmp_path / "old.json"
    legacy.write_text(json.dumps(results([row(64, "k1_64x64x64", 1.04, TEXT.format(name="k1"))], [(64, 1.04)])))
    assert main(["compare", "--db", str(tmp_path / "k.db"), str(legacy)]) == 2
    err = capsys.readouterr().err
    assert "E-PROTOCOL" in err and "l2=clean, not l2=dirty" in err
    server = tmp_path / "server.json"
    server.write_text(json.dumps(dict(results([], []), l2="clean", mode="server", qps=100)))
    assert main(["compare", "--db", str(tmp_path / "k.db"), str(server)]) == 2
    assert "timed in server mode at 100 calls/s, l2 clean" in capsys.readouterr().err


def test_two_runs_of_different_protocols_are_not_compared(tmp_path, capsys):
    a, b, c = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    a.write_text(json.dumps(dict(results([row(64, "x", 1.0)], [(64, 1.0)]), l2="clean")))
    b.write_text(json.dumps(results([row(64, "x", 1.0)], [(64, 1.0)])))  # no l2: the written flush
    c.write_text(json.dumps(dict(results([row(64, "x", 1.0)], [(64, 1.0)]), l2="bogus")))
    assert main(["compare", str(a), str(b)]) == 2
    err = capsys.readouterr().err
    assert f"E-PROTOCOL: {a} was timed in events mode, l2 clean, {b} in events mode, l2 dirty" in err
    assert "not comparable" in err and "Traceback" not in err
    assert main(["compare", str(a), str(c)]) == 2
    assert "unknown L2 protocol 'bogus'" in capsys.readouterr().err
    with pytest.raises(ProtocolMismatch):
        compare_results(json.loads(a.read_text()), json.loads(b.read_text()))


def test_two_runs_of_the_baselines_alone_compare_their_ratios():
    def run(torch_us, cublas_us):
        return {"l2": "clean", "rows": [], "shapes": [{"m": 64, "n": 64, "k": 64, "speedup_vs_best": None,
                                                      "cublas_best_us": min(torch_us, cublas_us),
                                                      "baselines": {"torch_matmul_us": torch_us, "cublas_us": cublas_us}}]}
    c = compare_results(run(10.0, 10.5), run(10.0, 10.6))
    assert [(p.what, p.first) for p in c.pairs] == [("baseline:cublas", pytest.approx(10 / 10.5)), ("baseline:torch_matmul", 1.0)]
    assert c.ok and c.summary()["baseline"]["pairs"] == 2
    assert "2 of 2 baseline x shape ratios to cuBLAS-best within 3%" in c.table()
    assert not compare_results(run(10.0, 10.5), run(10.0, 12.0)).ok


def test_two_runs_timed_in_sustained_blocks_pair_their_back_to_back_speedups_too():
    def timed(speedup, own, base):
        return dict(row(64, "x", speedup), sustained_us=own, baseline_sustained_us={"cublas_us": base, "torch_matmul_us": None})

    a = results([timed(1.05, 40.0, 42.0)], [(64, 1.05)])
    b = results([timed(1.05, 40.0, 38.0)], [(64, 1.05)])  # back to back, cuBLAS got 10% faster
    c = compare_results(a, b)
    loop = [p for p in c.pairs if p.what == "x (b2b)"]
    assert len(loop) == 1 and loop[0].first == pytest.approx(1.05) and loop[0].second == pytest.approx(0.95)
    assert not c.ok and c.summary()["sustained"]["within"] == 0
    assert "0 of 1 program x shape speedups back to back" in c.table()
    assert compare_results(a, a).ok
    plain = results([row(64, "x", 1.05)], [(64, 1.05)])  # one run without blocks: nothing to pair back to back
    assert [p.what for p in compare_results(a, plain).pairs] == ["x", "best"]
