"""Best-so-far curves of tuning runs, read back from their kernel databases.

A database keeps every measurement in the order it landed, so the curve of a shape (the
best speedup over cuBLAS-best after 1, 2, ... measured candidates; 0 until one verifies)
can always be rebuilt from it, also for a run that was interrupted and resumed. Putting
the curves of two policies side by side, at the same number of candidates per shape, is
how they are compared.
"""

from __future__ import annotations

import math
from pathlib import Path

from .problem import Shape
from .targets import Gpu


def curves_from_db(db, gpu: Gpu, *, budget: int | None = None) -> dict[Shape, list[float]]:
    """Each shape's best-so-far curve, cut at ``budget`` candidates if given."""
    out: dict[Shape, list[float]] = {}
    for shape in db.shapes(gpu):
        best, curve = 0.0, []
        for measurement in db.history(gpu, shape, loops=False)[:budget]:
            s = measurement.speedup
            if s is not None and s > best:
                best = s
            curve.append(best)
        out[shape] = curve
    return out


def geomean_curve(curves: dict[Shape, list[float]], length: int) -> list[float | None]:
    """The geometric mean over shapes of the best speedup after i+1 candidates (None while
    some shape has no verified program yet, or has fewer than i+1 candidates)."""
    out: list[float | None] = []
    for i in range(length):
        values = [c[i] for c in curves.values() if len(c) > i]
        if len(values) < len(curves) or any(v <= 0 for v in values):
            out.append(None)
        else:
            out.append(math.exp(sum(math.log(v) for v in values) / len(values)))
    return out


def compare_runs(runs: dict[str, dict[Shape, list[float]]], budget: int) -> dict:
    """Side by side: per shape, each run's best after ``budget`` candidates; per run, the
    geometric-mean curve over the shapes every run has measured ``budget`` times; and how
    many shapes each run won (ties within 0.5% are ties)."""
    shapes = sorted(set().union(*(set(c) for c in runs.values())))
    rows = []
    wins = {name: 0 for name in runs}
    ties = 0
    for shape in shapes:
        finals = {name: (c[shape][budget - 1] if shape in c and len(c[shape]) >= budget else None) for name, c in runs.items()}
        rows.append({"m": shape.m, "n": shape.n, "k": shape.k, "best": finals})
        known = {name: v for name, v in finals.items() if v}
        if len(known) == len(runs):
            top = max(known.values())
            leaders = [name for name, v in known.items() if v >= top * 0.995]
            if len(leaders) == 1:
                wins[leaders[0]] += 1
            else:
                ties += 1
    both = [s for s in shapes if all(s in c and len(c[s]) >= budget for c in runs.values())]
    common = {name: {s: c[s] for s in both} for name, c in runs.items()}
    return {
        "budget": budget,
        "shapes": rows,
        "geomean_shapes": len(both),
        "geomean_curve": {name: geomean_curve(c, budget) for name, c in common.items()},
        "wins": wins,
        "ties": ties,
    }


def format_comparison(result: dict) -> str:
    names = list(result["wins"])
    lines = [f"{'shape':>20}  " + "  ".join(f"{n:>10}" for n in names)]
    for row in result["shapes"]:
        cells = [f"{v:10.3f}" if v else f"{'-':>10}" for v in (row["best"][n] for n in names)]
        lines.append(f"{row['m']}x{row['n']}x{row['k']}".rjust(20) + "  " + "  ".join(cells))
    finals = {n: (c[-1] if c and c[-1] else None) for n, c in result["geomean_curve"].items()}
    lines.append(f"geomean of {result['geomean_shapes']}".rjust(20) + "  " + "  ".join(f"{finals[n]:10.3f}" if finals[n] else f"{'-':>10}" for n in names))
    lines.append(f"after {result['budget']} candidates per shape: " + ", ".join(f"{n} best on {w}" for n, w in result["wins"].items()) + f", {result['ties']} tied (within 0.5%)")
    return "\n".join(lines)


def plot_comparison(runs: dict[str, dict[Shape, list[float]]], result: dict, path: str | Path) -> bool:
    """Geometric-mean curves, and per-shape finals. False (nothing written) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 4.8), gridspec_kw={"width_ratios": [1, 2]})
    for name, curve in result["geomean_curve"].items():
        xs = [i + 1 for i, v in enumerate(curve) if v]
        left.plot(xs, [v for v in curve if v], marker="o", label=name)
    left.set_xlabel("measured candidates per shape")
    left.set_ylabel("geomean best speedup over cuBLAS-best")
    left.set_title("best so far, all shapes")
    left.legend()
    names = list(result["wins"])
    width = 0.8 / max(1, len(names))
    labels = [f"{r['m']}x{r['n']}x{r['k']}" for r in result["shapes"]]
    for j, name in enumerate(names):
        values = [r["best"][name] or 0.0 for r in result["shapes"]]
        right.bar([i + j * width for i in range(len(values))], values, width=width, label=name)
    right.axhline(1.0, color="black", linewidth=0.8)
    right.set_xticks([i + width * (len(names) - 1) / 2 for i in range(len(labels))], labels, rotation=60, ha="right", fontsize=8)
    right.set_ylabel(f"best after {result['budget']} candidates")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def label_of(path: str, db) -> str:
    """A run's name: the policy its measurements were made by, else the file's stem."""
    policies = db.policies()
    return policies[0] if len(policies) == 1 and policies[0] else Path(path).stem
