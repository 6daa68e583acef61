"""How well the analytic model (l2gen.search.simulate.model_us) ranks measured programs:
for each shape of each bench results file, the Spearman rank correlation between the
model's predicted times and the measured times of that shape's verified programs.

    python bench/model_rank.py bench/results/2026-12-03-h200-multicast-sweep-clean-935be28.json ...

Prints one line per (file, shape) and the median over shapes (issue target: >= 0.8).
"""

from __future__ import annotations

import statistics
import sys

from l2gen.parse import parse
from l2gen.problem import Shape
from l2gen.schema import read_results
from l2gen.search.simulate import model_us
from l2gen.targets import GPUS


def ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=values.__getitem__)
    out = [0.0] * len(values)
    i = 0
    while i < len(order):  # ties share their mean rank
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for t in range(i, j + 1):
            out[order[t]] = (i + j) / 2
        i = j + 1
    return out


def spearman(a: list[float], b: list[float]) -> float:
    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    var = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return cov / var if var else 0.0


def main(paths: list[str]) -> int:
    gpu = GPUS["h200"]
    per_shape = []
    for path in paths:
        data = read_results(path)  # a results file, checked field by field
        by_shape: dict[tuple, list[tuple[float, float]]] = {}
        for row in data["rows"]:
            if row.get("status") != "ok" or not row.get("program_text"):
                continue
            program = parse(row["program_text"])
            shape = Shape(row["m"], row["n"], row["k"])
            by_shape.setdefault((row["m"], row["n"], row["k"]), []).append((model_us(program, shape, gpu), row["l2gen_us"]))
        for key, pairs in sorted(by_shape.items()):
            if len(pairs) < 3:
                continue
            rho = spearman([p for p, _ in pairs], [t for _, t in pairs])
            per_shape.append(rho)
            print(f"{path.split('/')[-1]:55s} {'x'.join(map(str, key)):>18s} n={len(pairs):3d} spearman {rho:+.2f}")
    if not per_shape:
        print("no shape with 3 or more verified programs", file=sys.stderr)
        return 1
    print(f"median over {len(per_shape)} shapes: {statistics.median(per_shape):+.2f}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    sys.exit(main(sys.argv[1:]))
