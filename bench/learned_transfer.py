"""How the learned cost model ranks shapes it has no rows of, by what it was fit on.

For every shape of the OTHERS files that the SERVING files do not hold, each shape's
measured programs are ranked (Spearman against measured time) by: the analytic model; the
learned model fit on the SERVING files' rows (what the serving database holds), all of
them and those of the shape's B layout; and the learned model fit on every row of both
sets but that shape's, all and of the layout. Medians over the shapes.

    python bench/learned_transfer.py SERVING.json ... --others OTHER.json ...
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

from l2gen.search.learned import LearnedModel, spearman  # noqa: E402
from l2gen.search.simulate import model_us  # noqa: E402
from l2gen.targets import GPUS  # noqa: E402


def main(serving: list[str], others: list[str]) -> int:
    gpu = GPUS["h200"]
    serving_rows, other_rows = _rows(serving), _rows(others)
    every = serving_rows + other_rows
    held = {(s.m, s.n, s.k) for _, s, _, _ in serving_rows}
    fit_serving = LearnedModel(gpu).fit((p, s, t) for _, s, p, t in serving_rows)
    by_layout = {}
    scores: dict[str, list[float]] = {k: [] for k in ("analytic", "serving", "serving, layout", "every other", "every other, layout")}
    for path, key in sorted({(f, (s.m, s.n, s.k)) for f, s, _, _ in other_rows}):
        mine = [(s, p, t) for f, s, p, t in other_rows if f == path and (s.m, s.n, s.k) == key]
        if len(mine) < 3 or key in held:
            continue
        shape, programs, times = mine[0][0], [p for _, p, _ in mine], [t for _, _, t in mine]
        layout = programs[0].b_layout
        if layout not in by_layout:
            by_layout[layout] = LearnedModel(gpu).fit((p, s, t) for _, s, p, t in serving_rows if p.b_layout is layout)
        rest = [(p, s, t) for _, s, p, t in every if (s.m, s.n, s.k) != key]
        models = {
            "serving": fit_serving,
            "serving, layout": by_layout[layout],
            "every other": LearnedModel(gpu).fit(rest),
            "every other, layout": LearnedModel(gpu).fit(r for r in rest if r[0].b_layout is layout),
        }
        scores["analytic"].append(spearman([model_us(p, shape, gpu) for p in programs], times))
        for name, model in models.items():
            scores[name].append(spearman(model.predict_us(programs, shape), times) if len(model) else 0.0)
    print(f"{len(scores['analytic'])} shapes of the other files that the serving files do not hold")
    for name, values in scores.items():
        print(f"  {name:22s} median Spearman {statistics.median(values):+.2f}   mean {statistics.mean(values):+.2f}")
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    if "--others" not in args:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    cut = args.index("--others")
    sys.exit(main(args[:cut], args[cut + 1:]))
