"""What the tune's model gate (``--model-gate``) would have left uncompiled, replayed on the
measurements a database holds: for each shape, its candidates in the order they were
measured; each one predicted more than ``slack`` above the prediction for the best measured
before it is skipped (its compile and launches saved, the best unchanged), the rest count as
measured. The model is fit on every other shape's rows (the shape itself unseen, as a
held-out shape is), or is the analytic model (``--analytic``). With ``--library`` a candidate that is a knob setting of
the shipped kernel library is never gated (``tune --library`` measures those without a
compile, as the tune's gate does).

A replay, not a tune: the candidates after a skipped one were proposed by a policy that had
seen it. It estimates how many compiles the gate saves and how much of each shape's best it
would have lost. CPU only:

    python bench/gate_replay.py l2gen/data/measured_h200.db --slack 0.05 [--library] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics

from l2gen.db import KernelDB
from l2gen.lower import build_key
from l2gen.problem import program_key
from l2gen.search import library
from l2gen.search.learned import LearnedModel, db_rows
from l2gen.search.simulate import model_us
from l2gen.targets import GPUS


def replay(times: list[float], preds: list[float], free: list[bool], slack: float) -> tuple[float, float, int, int]:
    """One shape's candidates in measurement order: their measured and predicted µs, and
    whether each is measured without a compile (never gated). A candidate that needs a
    compile is skipped where its prediction is more than ``slack`` above the prediction for
    the best measured before it. Returns (best µs, best µs of the gated run, candidates
    skipped, candidates that needed a compile)."""
    gated_best_i, skipped = None, 0
    for i, t in enumerate(times):
        if not free[i] and gated_best_i is not None and preds[i] > preds[gated_best_i] * (1 + slack):
            skipped += 1
            continue
        if gated_best_i is None or t < times[gated_best_i]:
            gated_best_i = i
    return min(times), times[gated_best_i], skipped, len(free) - sum(free)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("db")
    ap.add_argument("--gpu", default="h200", choices=sorted(GPUS))
    ap.add_argument("--l2", default="clean")
    ap.add_argument("--slack", type=float, default=0.05)
    ap.add_argument("--min-rows", type=int, default=12, help="shapes with fewer verified candidates are left out")
    ap.add_argument("--analytic", action="store_true", help="the analytic model, not one learned from the other shapes")
    ap.add_argument("--library", action="store_true",
                    help="knob settings of the shipped kernel library are measured without a compile: never gated")
    ap.add_argument("--json")
    args = ap.parse_args()
    gpu = GPUS[args.gpu]
    built = {build_key(p) for p in library.load(gpu)} if args.library else set()
    with KernelDB(args.db, readonly=True) as db:
        everything = db_rows([db], gpu, l2=args.l2)
        shapes = {s: [m for m in db.history(gpu, s, l2=args.l2, loops=False) if m.status == "ok" and m.time_us] for s in db.shapes(gpu)}
    out = []
    print(f"{'shape':>18} {'rows':>5} {'skipped':>8} {'best':>8} {'gated best':>10} {'kept':>6}")
    for shape, rows in sorted(shapes.items(), key=lambda kv: (kv[0].m, kv[0].n, kv[0].k)):
        seen, ordered = set(), []
        for m in rows:  # history is in measurement order; a repeat of a program is not a new candidate
            if program_key(m.program) not in seen:
                seen.add(program_key(m.program))
                ordered.append(m)
        if len(ordered) < args.min_rows:
            continue
        programs = [m.program for m in ordered]
        if args.analytic:
            preds = [model_us(p, shape, gpu) for p in programs]
        else:
            preds = LearnedModel(gpu).fit([r for r in everything if r[1] != shape]).predict_us(programs, shape)
        free = [build_key(m.program) in built for m in ordered]
        best, gated, skipped, compiles = replay([m.time_us for m in ordered], preds, free, args.slack)
        out.append({"shape": str(shape), "rows": len(ordered), "compiles": compiles, "skipped": skipped, "best_us": best, "gated_best_us": gated})
        print(f"{str(shape):>18} {len(ordered):>5} {skipped:>8} {best:8.2f} {gated:10.2f} {best / gated:6.3f}")
    if not out:
        print("no shape with enough rows")
        return 1
    rows = sum(o["rows"] for o in out)
    skipped = sum(o["skipped"] for o in out)
    compiles = sum(o["compiles"] for o in out)
    kept = math.exp(statistics.fmean(math.log(o["best_us"] / o["gated_best_us"]) for o in out))
    worst = min(out, key=lambda o: o["best_us"] / o["gated_best_us"])
    print(f"{len(out)} shapes, {rows} candidates, {compiles} of them compiled ({rows - compiles} library settings): "
          f"{skipped} skipped ({skipped / max(compiles, 1):.0%} of the compiles); "
          f"best kept at geomean {kept:.3f} of the ungated best, worst {worst['best_us'] / worst['gated_best_us']:.3f} ({worst['shape']})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"db": args.db, "gpu": gpu.name, "slack": args.slack, "analytic": args.analytic, "library": args.library, "shapes": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
