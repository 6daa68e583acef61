"""bench/learned_db_gain.py: every shape of the test files is ranked with its own rows left
out of both databases, and the shipped measurements (which hold the M = 256 screens) rank
the M = 256 rows at least as well as the same database without those screens."""

from __future__ import annotations

import re
import sqlite3

from tests.unit.bench_scripts import RESULTS, ROOT, load

MEASURED = ROOT / "l2gen" / "data" / "measured_h200.db"


def test_rows_of_other_m256_shapes_improve_the_ranking_of_an_m256_shape(tmp_path, capsys):
    # The shipped database without the M = 256 rows of the 2026-12-04 screens' tile shapes:
    # every row of a 128 x 96/112/224 or 256-row program leaves.
    old = tmp_path / "old.db"
    with sqlite3.connect(MEASURED) as src, sqlite3.connect(old) as dst:
        src.backup(dst)
    with sqlite3.connect(old) as con:
        tiles = ("128 x 96 x", "128 x 112 x", "128 x 224 x", "256 x 64 x", "256 x 96 x", "256 x 128 x")
        for tile in tiles:
            con.execute("DELETE FROM measurements WHERE m = 256 AND program_text LIKE ?", (f"%{tile}%",))
    test = [str(RESULTS / "2026-12-04-h200-m256deep-run2-5f3fd8a.json")]
    assert load("learned_db_gain").main(str(old), str(MEASURED), test) == 0
    out = capsys.readouterr().out
    shapes = re.findall(r"^\s+256x\d+x\d+ n=\s*\d+", out, flags=re.M)
    assert len(shapes) == 8
    medians = [float(v) for v in re.findall(r"median Spearman ([+-]\d\.\d\d)", out)]
    assert len(medians) == 3 and all(-1.0 <= v <= 1.0 for v in medians)
    analytic, without, shipped = medians
    assert shipped >= without
