"""Train the embedded policy from measured rewards: every verified row of the given bench
results files (each row a program timed on a shape against cuBLAS-best in the same run)
is replayed through :meth:`EmbeddedPolicy.update`, shape by shape, for a few epochs, and
the state is saved where ``l2gen tune --policy embedded`` starts from.

    python bench/train_policy.py bench/results/2026-12-04-h200-decode-run1-0e0ce6a.json ... \\
        --start l2gen/data/policy_h200.json -o l2gen/data/policy_h200.json [--evaluate]

The rows are logged, not drawn by the policy: each update is a reward-weighted step
toward the programs that beat the shape's mean and away from the rest (REINFORCE's step
on someone else's samples), so the policy learns which decisions win on which shape
features without a GPU in the loop. Rows of the held-out suites (suites/heldout-*.json)
are refused: no training sees them.

``--evaluate`` first reports, leaving each shape out in turn, how the policy trained on
the others ranks that shape's measured programs (Spearman of log-probability against
measured speedup), beside the untrained start: what the training transfers to a shape
it has not seen.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from l2gen.cli.run import load_suite  # noqa: E402
from l2gen.parse import parse  # noqa: E402
from l2gen.problem import Measurement, Shape  # noqa: E402
from l2gen.schema import read_results  # noqa: E402
from l2gen.search.base import Proposal  # noqa: E402
from l2gen.search.learned import spearman  # noqa: E402
from l2gen.search.policies import EmbeddedPolicy  # noqa: E402
from l2gen.targets import GPUS  # noqa: E402


def heldout_shapes() -> set[tuple[int, int, int]]:
    return {(s.m, s.n, s.k) for path in sorted((ROOT / "suites").glob("heldout-*.json")) for s in load_suite(str(path))}


def load_rows(paths: list[str]) -> dict[Shape, list[Measurement]]:
    """Verified measurements per shape, from bench results files timed under a clean L2
    (one row per program and shape of each file; a program measured in several files
    counts once per file, as a shape re-measured is more evidence)."""
    held = heldout_shapes()
    by_shape: dict[Shape, list[Measurement]] = {}
    parsed: dict[str, object] = {}
    for path in paths:
        doc = read_results(path)
        if doc.get("l2", "dirty") != "clean":
            raise SystemExit(f"{path}: timed under a {doc.get('l2', 'dirty')} L2; train on clean-L2 results only")
        for row in doc["rows"]:
            if row.get("status") != "ok" or not row.get("l2gen_us") or not row.get("cublas_best_us"):
                continue
            if (row["m"], row["n"], row["k"]) in held:
                raise SystemExit(f"{path}: {row['m']}x{row['n']}x{row['k']} is a held-out shape: no training may see it")
            text = row["program_text"]
            if text not in parsed:
                parsed[text] = parse(text, path)
            shape = Shape(row["m"], row["n"], row["k"])
            by_shape.setdefault(shape, []).append(
                Measurement(shape, parsed[text], "ok", row["l2gen_us"], row["cublas_best_us"], l2="clean"))
    return by_shape


def train(policy: EmbeddedPolicy, data: dict[Shape, list[Measurement]], epochs: int, seed: int) -> EmbeddedPolicy:
    rng = random.Random(seed)
    shapes = sorted(data, key=str)
    for _ in range(epochs):
        rng.shuffle(shapes)
        for shape in shapes:
            rows = data[shape]
            policy.update(shape, [(Proposal(m.program, meta={"kind": "sample"}), m) for m in rows])
    return policy


def evaluate(start, data, epochs: int, seed: int) -> list[tuple[str, float, float]]:
    """Leave one shape out: (shape, Spearman of the untrained start, of the trained)."""
    out = []
    for shape in sorted(data, key=str):
        rest = {s: rows for s, rows in data.items() if s != shape}
        trained = train(start(), rest, epochs, seed)
        rows = data[shape]
        speedups = [m.speedup for m in rows]
        untrained = start()
        out.append((str(shape),
                    spearman([untrained.log_probability(m.program, shape) for m in rows], speedups),
                    spearman([trained.log_probability(m.program, shape) for m in rows], speedups)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", help="l2gen bench results files (clean L2)")
    ap.add_argument("--gpu", default="h200")
    ap.add_argument("--start", help="a saved policy state to start from (default: untrained)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--evaluate", action="store_true", help="leave-one-shape-out ranking before training")
    ap.add_argument("-o", "--output", help="where to save the trained state")
    args = ap.parse_args()
    gpu = GPUS[args.gpu]
    data = load_rows(args.results)
    n_rows = sum(len(v) for v in data.values())
    print(f"{n_rows} verified rows on {len(data)} shapes from {len(args.results)} files")

    def start() -> EmbeddedPolicy:
        if args.start:
            return EmbeddedPolicy.load(args.start, gpu=gpu, seed=args.seed, cost_model=False)
        return EmbeddedPolicy(gpu, seed=args.seed, cost_model=False)

    if args.evaluate:
        rows = evaluate(start, data, args.epochs, args.seed)
        print(f"{'shape':>16}  {'start':>6}  {'trained':>7}   (Spearman: log-probability against measured speedup, shape left out)")
        for name, before, after in rows:
            print(f"{name:>16}  {before:6.2f}  {after:7.2f}")
        print(f"median over {len(rows)} shapes: start {np.median([b for _, b, _ in rows]):.2f}, "
              f"trained {np.median([a for _, _, a in rows]):.2f}")
    policy = train(start(), data, args.epochs, args.seed)
    if args.output:
        policy.save(args.output)
        print(f"saved {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
