"""Is ``l2gen.matmul`` ever slower than ``torch.matmul``? Both timed per shape, in one process.

For every shape the dispatcher (over a kernel database) and ``torch.matmul`` compute the same
product into preallocated outputs, and three times are taken for each, interleaved:

- **device**: CUDA events around one call, the L2 flushed before it; the median of ``reps``.
- **wall per call**: ``calls`` calls back to back, then a synchronize; wall time over
  ``calls``, the median of ``rounds``. This includes the host's cost per call (Python, the
  lookup, the launch), which is what a caller sees once kernels are short.
- **enqueue**: host time spent inside the calls of that loop, per call (the part of the wall
  time the dispatcher adds in Python).

A shape passes when both ratios (dispatcher over torch) are at most ``1 + tolerance``. The
first call of each shape also goes through the dispatcher's own check against torch
(relative error at most 1e-3), and the result of the timed calls is compared once more at
the end.
"""

from __future__ import annotations

import statistics
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence

from .search.base import Shape

FLUSH_BYTES = 256 << 20
WALL_TARGET_US = 20_000.0  # each wall-time loop runs about this long


def bench_dispatch(
    shapes: Sequence[Shape],
    db,
    *,
    reps: int = 50,
    rounds: int = 5,
    tolerance: float = 0.03,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Time the dispatcher against torch.matmul on each shape; returns the results dict
    (``rows`` of per-shape times and ratios, ``ok`` when every shape passed)."""
    import torch

    import l2gen

    from .dispatch import detect_gpu, use_db

    say = progress or (lambda line: None)
    gpu = detect_gpu()
    if gpu is None:
        raise RuntimeError(f"no l2gen target record for {torch.cuda.get_device_name()}")
    dispatcher = use_db(db)  # what l2gen.matmul serves from: the call timed is the public one
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    rows = []
    for i, shape in enumerate(shapes, 1):
        m, n, k = shape.m, shape.n, shape.k
        g = torch.Generator(device="cuda").manual_seed(i)
        a = torch.randn(m, k, generator=g, device="cuda").half()
        b = torch.randn(k, n, generator=g, device="cuda").half()
        out_l2, out_torch = torch.empty(m, n, dtype=torch.half, device="cuda"), torch.empty(m, n, dtype=torch.half, device="cuda")
        ours = lambda: l2gen.matmul(a, b, out=out_l2)  # noqa: E731
        theirs = lambda: torch.matmul(a, b, out=out_torch)  # noqa: E731
        ours()  # plans, builds or loads, and checks the shape's first result
        theirs()
        torch.cuda.synchronize()
        served = dispatcher.served_by(m, n, k)
        plan = dispatcher.plan(m, n, k) if served != "fallback" else None
        dev_ours, dev_theirs = _device_times(ours, theirs, flush, reps)
        per_call = max(dev_theirs, 1.0)
        calls = max(10, min(500, int(WALL_TARGET_US / per_call)))
        wall_ours, wall_theirs, enq_ours, enq_theirs = _wall_times(ours, theirs, calls, rounds)
        torch.cuda.synchronize()
        ref = out_torch.float()
        err = float((out_l2.float() - ref).norm() / ref.norm().clamp_min(1e-30))
        row = {
            "m": m, "n": n, "k": k, "served_by": served,
            "tuned_for": str(plan.tuned_for) if plan else None,
            "recorded_speedup": plan.speedup if plan else None,
            "device_us": dev_ours, "torch_device_us": dev_theirs, "device_ratio": dev_ours / dev_theirs,
            "wall_us": wall_ours, "torch_wall_us": wall_theirs, "wall_ratio": wall_ours / wall_theirs,
            "enqueue_us": enq_ours, "torch_enqueue_us": enq_theirs, "calls": calls, "relerr": err,
        }
        row["ok"] = bool(row["device_ratio"] <= 1 + tolerance and row["wall_ratio"] <= 1 + tolerance and err <= 1e-3)
        rows.append(row)
        say(f"[dispatch] {i}/{len(shapes)} {shape}: {served}: device {dev_ours:.2f} vs {dev_theirs:.2f} us "
            f"({row['device_ratio']:.3f}), wall {wall_ours:.2f} vs {wall_theirs:.2f} us ({row['wall_ratio']:.3f})"
            + ("" if row["ok"] else "  <-- slower"))
    return {
        "gpu": gpu.name, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "db": str(getattr(db, "path", db)), "reps": reps, "rounds": rounds, "tolerance": tolerance,
        "rows": rows, "ok": all(r["ok"] for r in rows),
    }


def _device_times(ours, theirs, flush, reps: int) -> tuple[float, float]:
    import torch

    events = {fn: [] for fn in (ours, theirs)}
    for _ in range(3):  # warm-up
        ours(), theirs()
    for r in range(reps):
        order = (ours, theirs) if r % 2 == 0 else (theirs, ours)
        for fn in order:
            flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            events[fn].append((start, end))
    torch.cuda.synchronize()
    med = [statistics.median(1000.0 * s.elapsed_time(e) for s, e in events[fn]) for fn in (ours, theirs)]
    return med[0], med[1]


def _wall_times(ours, theirs, calls: int, rounds: int) -> tuple[float, float, float, float]:
    import torch

    wall = {ours: [], theirs: []}
    enqueue = {ours: [], theirs: []}
    for r in range(rounds):
        for fn in ((ours, theirs) if r % 2 == 0 else (theirs, ours)):
            torch.cuda.synchronize()
            inside = 0.0
            t0 = time.perf_counter()
            for _ in range(calls):
                c0 = time.perf_counter()
                fn()
                inside += time.perf_counter() - c0
            torch.cuda.synchronize()
            wall[fn].append(1e6 * (time.perf_counter() - t0) / calls)
            enqueue[fn].append(1e6 * inside / calls)
    return (statistics.median(wall[ours]), statistics.median(wall[theirs]),
            statistics.median(enqueue[ours]), statistics.median(enqueue[theirs]))


def format_table(results: dict) -> str:
    head = f"{'shape':>20}  {'served by':<34} {'dev us':>9} {'torch':>9} {'ratio':>6}  {'wall us':>9} {'torch':>9} {'ratio':>6}  {'enq us':>6} {'torch':>6}"
    lines = [head]
    for r in results["rows"]:
        lines.append(
            f"{r['m']}x{r['n']}x{r['k']}".rjust(20) + f"  {r['served_by'][:34]:<34} {r['device_us']:9.2f} {r['torch_device_us']:9.2f} {r['device_ratio']:6.3f}"
            f"  {r['wall_us']:9.2f} {r['torch_wall_us']:9.2f} {r['wall_ratio']:6.3f}  {r['enqueue_us']:6.2f} {r['torch_enqueue_us']:6.2f}"
            + ("" if r["ok"] else "  <-- slower")
        )
    passed = sum(r["ok"] for r in results["rows"])
    lines.append(f"{passed} of {len(results['rows'])} shapes no slower than torch.matmul beyond {100 * results['tolerance']:.0f}% (device and wall time per call)")
    return "\n".join(lines)


def write(results: dict, path: str | Path) -> None:
    import json

    Path(path).write_text(json.dumps(results, indent=1) + "\n")
