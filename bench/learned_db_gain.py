"""What a learned cost model gains from a measurements database's new rows, on shapes it
must rank without their own rows.

For every shape of the TEST files (results JSON), its measured programs are ranked
(Spearman against measured time) by the analytic model and by the learned model fit on
OLD.db and on NEW.db, each with every row of that shape left out, so a gain comes from
rows of other shapes. Medians over the shapes.

    python bench/learned_db_gain.py OLD.db NEW.db TEST.json ...
"""

from __future__ import annotations

import sqlite3
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
if str(HERE.parent) not in sys.path:
    sys.path.insert(1, str(HERE.parent))

from model_rank import _rows  # noqa: E402

from l2gen.parse import parse  # noqa: E402
from l2gen.problem import Shape  # noqa: E402
from l2gen.search.learned import LearnedModel, spearman  # noqa: E402
from l2gen.search.simulate import model_us  # noqa: E402
from l2gen.targets import GPUS  # noqa: E402


def db_rows(path: str) -> list:
    """(program, shape, µs) of a database's clean-L2 measured rows, each program on each
    shape once (its first row)."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
        first: dict = {}
        query = "SELECT m, n, k, program_text, time_us FROM measurements WHERE status = 'ok' AND l2 = 'clean' ORDER BY id"
        for m, n, k, text, t in con.execute(query):
            first.setdefault((text, m, n, k), t)
    return [(parse(text), Shape(m, n, k), t) for (text, m, n, k), t in first.items()]


def main(old_db: str, new_db: str, tests: list[str]) -> int:
    gpu = GPUS["h200"]
    fits = {"old": db_rows(old_db), "new": db_rows(new_db)}
    test = _rows(tests)
    scores: dict[str, list[float]] = {"analytic": [], "old": [], "new": []}
    for key in sorted({(s.m, s.n, s.k) for _, s, _, _ in test}):
        mine: dict = {}
        for _, s, p, t in test:
            if (s.m, s.n, s.k) == key:
                mine.setdefault(p.name, (p, s, t))  # the first file's time of a program
        if len(mine) < 3:
            continue
        programs = [p for p, _, _ in mine.values()]
        shape = next(iter(mine.values()))[1]
        times = [t for _, _, t in mine.values()]
        scores["analytic"].append(spearman([model_us(p, shape, gpu) for p in programs], times))
        for label, rows in fits.items():
            model = LearnedModel(gpu).fit(r for r in rows if (r[1].m, r[1].n, r[1].k) != key)
            scores[label].append(spearman(model.predict_us(programs, shape), times))
        print(f"{'x'.join(map(str, key)):>18s} n={len(programs):3d}  "
              + "  ".join(f"{k} {v[-1]:+.2f}" for k, v in scores.items()))
    for label, values in scores.items():
        name = {"analytic": "analytic", "old": f"learned, {old_db}", "new": f"learned, {new_db}"}[label]
        print(f"{name:60s} median Spearman {statistics.median(values):+.2f}   mean {statistics.mean(values):+.2f}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3:]))
