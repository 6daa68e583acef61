"""How fast a ranking finds a shape's best program, replayed on committed measurements.

For every (file, shape) of the results files given with at least ``--min`` verified
programs, the programs are taken in the order a ranking puts them, and the script counts
the picks until one within ``--within`` (default 2%) of the shape's fastest measured time is
taken. Rankings: the learned cost model (``l2gen.search.learned.LearnedModel``) fit on every
other shape's rows of the files (leave-one-shape-out, as ``bench/model_rank.py --learned``),
the analytic model (``l2gen.search.simulate.model_us``), and a random order (the exact
expectation over all orders, not a sample). A replay over programs already measured, not a
search: it says how many of a shape's candidates a tuner that measures in the model's order
would have spent, on candidate sets a person chose.

    python bench/replay_ranking.py bench/results/2026-12-04-h200-decode-run1-fe6b98d.json ...
"""

from __future__ import annotations

import argparse
import statistics
import sys

from model_rank import _groups, _left_out, _rows

from l2gen.search.learned import LearnedModel
from l2gen.search.simulate import model_us
from l2gen.targets import GPUS


def picks_until(order: list[int], good: set[int]) -> int:
    """1-based position of the first index of ``order`` that is in ``good``."""
    return next(i for i, j in enumerate(order, 1) if j in good)


def random_expectation(n: int, g: int) -> float:
    """Expected picks until the first of ``g`` good items among ``n``, in a uniformly random
    order: (n + 1) / (g + 1)."""
    return (n + 1) / (g + 1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--within", type=float, default=0.02, help="a pick within this fraction of the best counts (0.02)")
    ap.add_argument("--min", type=int, default=6, help="shapes with fewer verified programs are left out (6)")
    args = ap.parse_args(argv)
    gpu = GPUS["h200"]
    rows = _rows(args.files)
    models: dict[tuple, LearnedModel] = {}
    results = {"learned": [], "analytic": [], "random": []}
    sizes = []
    for path, key, mine in _groups(rows, args.min):
        shape = mine[0][0]
        times = [t for _, _, t in mine]
        best = min(times)
        good = {i for i, t in enumerate(times) if t <= best * (1 + args.within)}
        predicted = _left_out(rows, key, models, gpu).predict_us([p for _, p, _ in mine], shape)
        analytic = [model_us(p, shape, gpu) for _, p, _ in mine]
        learned_k = picks_until(sorted(range(len(mine)), key=predicted.__getitem__), good)
        analytic_k = picks_until(sorted(range(len(mine)), key=analytic.__getitem__), good)
        random_k = random_expectation(len(mine), len(good))
        results["learned"].append(learned_k)
        results["analytic"].append(analytic_k)
        results["random"].append(random_k)
        sizes.append(len(mine))
        print(f"{path.split('/')[-1]:55s} {'x'.join(map(str, key)):>18s} n={len(mine):3d} within {len(good):2d}  "
              f"learned {learned_k:3d}  analytic {analytic_k:3d}  random {random_k:5.1f}")
    if not sizes:
        print(f"no shape with {args.min} or more verified programs", file=sys.stderr)
        return 1
    print(f"{len(sizes)} shapes, {statistics.median(sizes):.0f} programs each (median): picks until one within "
          f"{100 * args.within:g}% of the best, mean / median: "
          + ", ".join(f"{name} {statistics.mean(v):.2f} / {statistics.median(v):.1f}" for name, v in results.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
