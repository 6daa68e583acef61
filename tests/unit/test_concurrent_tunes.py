"""Two ``l2gen tune`` processes on one database at once (simulated: no GPU) lose and
duplicate nothing: every shape ends with exactly its budget of rows, each program
measured once per shape, and every row either process reported is in the file."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

SHAPES = ["64x4096x4096", "128x4096x4096", "256x2048x8192", "1024x1024x1024"]
BUDGET = 12


def tune(db, seed: int, policy: str = "random") -> subprocess.Popen:
    args = [sys.executable, "-m", "l2gen.cli", "tune", "--simulate", "--db", str(db), "--budget", str(BUDGET), "--batch", "3",
            "--policy", policy, "--seed", str(seed)]
    for s in SHAPES:
        args += ["--shape", s]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def rows(db) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT m, n, k, program_key, status FROM measurements ORDER BY id").fetchall()


def test_two_tunes_on_one_database_count_rows_exactly(tmp_path):
    db = tmp_path / "shared.db"
    first, second = tune(db, 1), tune(db, 2, "embedded")
    for p in (first, second):
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        assert "Traceback" not in err
    stored = rows(db)
    per_shape: dict = {}
    for m, n, k, key, status in stored:
        per_shape.setdefault(f"{m}x{n}x{k}", []).append((key, status))
    assert sorted(per_shape) == sorted(SHAPES)
    for shape, found in per_shape.items():
        assert len(found) == BUDGET, f"{shape}: {len(found)} rows, budget {BUDGET}"
        measured = [key for key, status in found if status != "rejected"]
        assert len(measured) == len(set(measured)), f"{shape}: a program stored twice"
    # Run again: the budget is spent, nothing is added.
    again = tune(db, 3)
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    assert len(rows(db)) == len(SHAPES) * BUDGET


def test_two_tunes_on_disjoint_shapes_keep_every_row(tmp_path):
    db = tmp_path / "shared.db"
    procs = []
    for seed, shapes in ((1, SHAPES[:2]), (2, SHAPES[2:])):
        args = [sys.executable, "-m", "l2gen.cli", "tune", "--simulate", "--db", str(db), "--budget", str(BUDGET), "--policy", "random",
                "--seed", str(seed)] + [a for s in shapes for a in ("--shape", s)]
        procs.append(subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    assert len(rows(db)) == len(SHAPES) * BUDGET
