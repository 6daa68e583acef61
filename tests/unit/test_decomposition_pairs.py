"""bench/decomposition_pairs.py pairs one program's persistent (heuristic) and data-parallel
measurements on one shape, other knobs equal, and leaves grid-capped or split runs out."""

from __future__ import annotations

import sqlite3

from tests.unit.bench_scripts import load

_BODY = """kernel {name} {{
    arch          sm90a
    impl          l2gen
    b             kn
    tile          128 x 128 x 64
    stages        5
    split_k       atomic
{knobs}}}
"""


def _program(name: str, **knobs: str) -> str:
    return _BODY.format(name=name, knobs="".join(f"    {k:<13} {v}\n" for k, v in knobs.items()))


def _db(path, rows) -> None:
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE measurements (gpu TEXT, m INT, n INT, k INT, time_us REAL, program_text TEXT, status TEXT)")
    con.executemany("INSERT INTO measurements VALUES (?, ?, ?, ?, ?, ?, 'ok')", rows)
    con.commit()
    con.close()


def test_pairs_the_two_decompositions_of_one_program_and_skips_capped_and_split_runs(tmp_path, capsys):
    shape = ("h100", 2048, 27648, 5120)
    _db(tmp_path / "a.db", [
        (*shape, 1153.4, _program("a", raster="along_m", swizzle="2", splits="1")),
        (*shape, 1160.0, _program("b", raster="along_m", swizzle="2", splits="1")),  # the slower of two: not the pair's
        (*shape, 998.8, _program("c", raster="along_m", swizzle="2", splits="1", decomposition="data_parallel")),
        (*shape, 900.0, _program("d", raster="along_m", swizzle="2", splits="1", decomposition="data_parallel", grid="112")),
        (*shape, 800.0, _program("e", raster="along_m", swizzle="2", splits="2")),
        (*shape, 1000.0, _program("f", raster="along_m", swizzle="3", splits="1")),  # no data-parallel twin
    ])
    _db(tmp_path / "b.db", [(*shape, 990.0, _program("g", raster="along_m", swizzle="2", decomposition="data_parallel"))])
    script = load("decomposition_pairs")
    found = script.pairs([str(tmp_path / "a.db"), str(tmp_path / "b.db"), str(tmp_path / "missing-table.db")])
    assert len(found) == 1
    gpu, m, n, k, config, order, heuristic, dp = found[0]
    assert (gpu, m, n, k, order) == (*shape, "along_m swizzle 2")
    assert config == "b kn tile 128 x 128 x 64 stages 5 split_k atomic"
    assert (heuristic, dp) == (1153.4, 990.0)
    assert script.main([str(tmp_path / "a.db")]) == 0
    out = capsys.readouterr().out
    assert "heuristic/dp 1.155" in out and out.strip().endswith("1 of 1 pairs shown (heuristic and data_parallel more than 3% apart)")
