"""What a learned cost model gains from a measurements database's new rows, on shapes it
must rank without their own rows.

For every shape of the TEST files (results JSON), its measured programs are ranked
(Spearman against measured time) by the analytic model and by the learned model fit on
OLD.db and on NEW.db, each with every row of that shape left out, so a gain comes from
rows of other shapes. Medians over the shapes.

    python bench/learned_db_gain.py OLD.db NEW.db TEST.json ...
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
if str(HERE.parent) not in sys.path:
    sys.path.insert(1, str(HERE.parent))

from model_rank import _rows  # noqa: E402

from l2gen.db import KernelDB  # noqa: E402
from l2gen.search.learned import LearnedModel, db_rows, spearman  # noqa: E402
from l2gen.search.simulate import model_us  # noqa: E402
from l2gen.targets import GPUS  # noqa: E402


def rows_of(path: str) -> list:
    """What the tuner's learned model fits on from one database: its verified clean-L2 rows."""
    with KernelDB(Path(path), readonly=True) as db:
        return db_rows([db], GPUS["h200"], l2="clean")


def main(old_db: str, new_db: str, tests: list[str]) -> int:
    gpu = GPUS["h200"]
    fits = {"old": rows_of(old_db), "new": rows_of(new_db)}
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
