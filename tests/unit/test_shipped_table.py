"""bench/shipped_table.py: each suite shape's judged best beside every baseline of the run
it is judged by, the run's floor, and whether the dispatcher serves it."""

from __future__ import annotations

from tests.unit.bench_scripts import RESULTS, ROOT, load

DB = ROOT / "l2gen" / "data" / "kernels_h200.db"


def test_the_table_reads_the_judged_run_of_each_shape():
    files = [str(RESULTS / f"2026-12-04-h200-big2-run{i}-3f9f1d1.json") for i in (1, 2)]
    files += [str(RESULTS / f"2026-12-04-h200-ksplit-run{i}-fe6b98d.json") for i in (1, 2)]
    table = load("shipped_table").table(str(ROOT / "suites" / "public.json"), str(DB), files)
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in table.splitlines()[2:]}
    assert len(rows) == 24  # every shape of the suite, in its order
    big = rows["8192×8192×8192"]
    # the ping-pong program, ahead of cuBLAS-best by no more than it was, served
    assert big[2].startswith("ping_") and big[-1].strip(" |") == "yes"
    assert float(big[3]) < float(big[4])  # faster than torch.matmul in that run
    assert 0.9 < float(big[8]) <= 1.05 and float(big[10]) < float(big[3])  # the floor below the time
    assert rows["512×8192×8192"][2] == "not in the database: torch.matmul serves it" and rows["512×8192×8192"][-1].strip(" |") == "no"
    assert rows["64×64×64"][2].endswith("(no run among the files given)")  # in the database, from a file not given
