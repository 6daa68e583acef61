"""How well the analytic model (l2gen.search.simulate.model_us) ranks measured programs:
for each shape of each bench results file, the Spearman rank correlation between the
model's predicted times and the measured times of that shape's verified programs.

    python bench/model_rank.py bench/results/2026-12-03-h200-multicast-sweep-clean-935be28.json ...

Prints one line per (file, shape) and the median over shapes (issue target: >= 0.8).

``--learned`` also ranks each shape's programs by the learned model
(:class:`l2gen.search.learned.LearnedModel`) fit on every other shape's rows of the files
given (leave-one-shape-out: no row of the shape itself, from any file, is seen), as it
would rank a shape never measured, beside the same regression without its per-program
neighbour correction ("ridge"):

    python bench/model_rank.py --learned bench/results/2026-12-04-h200-decode-run1-c7524d3.json ...
"""

from __future__ import annotations

import statistics
import sys

from l2gen.parse import parse
from l2gen.problem import Shape
from l2gen.schema import read_results
from l2gen.search.learned import LearnedModel, spearman
from l2gen.search.simulate import model_us
from l2gen.targets import GPUS


def _rows(paths: list[str]) -> list[tuple[str, Shape, object, float]]:
    out = []
    for path in paths:
        data = read_results(path)  # a results file, checked field by field
        for row in data["rows"]:
            if row.get("status") == "ok" and row.get("program_text") and row.get("l2gen_us"):
                out.append((path, Shape(row["m"], row["n"], row["k"]), parse(row["program_text"]), row["l2gen_us"]))
    return out


def _groups(rows, least: int):
    """(file, (M, N, K), its [(shape, program, µs)]) of every (file, shape) of ``rows`` with
    at least ``least`` verified programs, in file and shape order."""
    for path, key in sorted({(path, (s.m, s.n, s.k)) for path, s, _, _ in rows}):
        mine = [(s, p, t) for f, s, p, t in rows if f == path and (s.m, s.n, s.k) == key]
        if len(mine) >= least:
            yield path, key, mine


def _left_out(rows, key, models: dict, gpu) -> LearnedModel:
    """The learned model fit on every row of ``rows`` but shape ``key``'s, from any file (one
    per left-out shape, kept in ``models``)."""
    if key not in models:
        models[key] = LearnedModel(gpu).fit((p, s, t) for _, s, p, t in rows if (s.m, s.n, s.k) != key)
    return models[key]


def main(paths: list[str], learned: bool = False) -> int:
    gpu = GPUS["h200"]
    rows = _rows(paths)
    per_shape, per_shape_learned, per_shape_ridge = [], [], []
    models: dict[tuple, LearnedModel] = {}
    for path, key, mine in _groups(rows, 3):
        shape = mine[0][0]
        times = [t for _, _, t in mine]
        rho = spearman([model_us(p, shape, gpu) for _, p, _ in mine], times)
        per_shape.append(rho)
        line = f"{path.split('/')[-1]:55s} {'x'.join(map(str, key)):>18s} n={len(mine):3d} spearman {rho:+.2f}"
        if learned:
            model = _left_out(rows, key, models, gpu)
            lrho = spearman(model.predict_us([p for _, p, _ in mine], shape), times)
            model.neighbours = False
            rrho = spearman(model.predict_us([p for _, p, _ in mine], shape), times)
            model.neighbours = True
            per_shape_learned.append(lrho)
            per_shape_ridge.append(rrho)
            line += f"  learned {lrho:+.2f}  ridge {rrho:+.2f}"
        print(line)
    if not per_shape:
        print("no shape with 3 or more verified programs", file=sys.stderr)
        return 1
    print(f"median over {len(per_shape)} shapes: {statistics.median(per_shape):+.2f}"
          + (f"  learned (leave-one-shape-out): {statistics.median(per_shape_learned):+.3f}"
             f" (ridge alone {statistics.median(per_shape_ridge):+.3f})" if learned else ""))
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    use_learned = "--learned" in args
    args = [a for a in args if a != "--learned"]
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if args else 2)
    sys.exit(main(args, learned=use_learned))
