"""Is ``l2gen.matmul`` ever slower than ``torch.matmul``? Both timed per shape, in one process.

For every shape three callers compute the same product: ``l2gen.matmul`` (the dispatcher
over a kernel database), ``torch.matmul``, and ``torch.matmul`` again as a **control**.
With B stored N x K (``b_layout="nk"``, the layout of an ``nn.Linear`` weight ``w``) the
product is ``a @ w.t()``: ``l2gen.torch_ops.mm(a, w.t())`` (what a patched layer and a
user's ``a @ w.t()`` call reach; served as stored, without a copy) against
``torch.matmul(a, w.t())``. The
control is what "noise" means here: two calls of the same function, timed the same way,
differ by about that much. Three times are taken for each, interleaved in rotated order, and
each caller writes to each of three preallocated outputs in turn (a kernel of a few µs runs
measurably faster or slower depending on where its output lies; rotating the buffers
spreads that over all three):

- **device**: CUDA events around one call, the L2 left before it as the L2 protocol says
  (clean by default: :class:`l2gen.probes.Flush`, on torch's current stream); the median
  of ``reps``. Between the flush and the first event the GPU spins for about 100 µs
  (``torch.cuda._sleep``), so that the host's way into the call (Python, the lookup) is
  over before the GPU reaches the event: without it a slow host's time lands inside the
  span of a short kernel, and a caller with more Python in front of its launch reads slower
  on the device than it is.
- **wall per call**: ``calls`` calls back to back, then a synchronize; wall time over
  ``calls``, the median of ``rounds``. This includes the host's cost per call (Python, the
  lookup, the launch), which is what a caller sees once kernels are short.
- **enqueue**: host time spent inside the calls of that loop, per call (the part of the wall
  time the dispatcher adds in Python).

With ``rotate`` the wall-time loops take turns over copies of A and B at other addresses,
as many as keep each copy's operands out of the L2 between its uses
(:func:`l2gen.modes.rotation_copies`, at most the loop's calls): what a model's layers see,
each reading its own weights, where one set of operands called again and again would sit
in the L2 from the call before (and a kernel tuned with the L2 cold would be timed warm).
Each caller then also meets new addresses on every call (the dispatcher's launch cache
and torch's alike).

The dispatcher serves the winners timed under that same L2 protocol (``use_db(db, l2=)``),
and the results record it (``"l2"``, ``"mode": "events"``).

A shape passes when both ratios (dispatcher over torch) are at most ``1 + tolerance``. The
first call of each shape also goes through the dispatcher's own check against torch
(relative error at most 1e-3), and the result of a last call of each is compared at the end.
"""

from __future__ import annotations

import statistics
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence

from .bench import git_commit
from .problem import Shape

WALL_TARGET_US = 20_000.0  # each wall-time loop runs about this long
SPIN_CYCLES = 200_000  # the GPU's wait before each event-timed call: ~100 us at 2 GHz
CALLERS = ("l2gen", "torch", "control")


def bench_dispatch(
    shapes: Sequence[Shape],
    db,
    *,
    reps: int = 200,
    rounds: int = 15,
    tolerance: float = 0.03,
    progress: Callable[[str], None] | None = None,
    l2: str = "clean",
    b_layout: str = "kn",
    rotate: bool = False,
) -> dict:
    """Time the dispatcher against torch.matmul on each shape; returns the results dict
    (``rows`` of per-shape times and ratios, ``ok`` when every shape passed).

    ``db`` becomes ``l2gen.matmul``'s default database for the process (``use_db``), so
    that the call timed is the public one. ``b_layout``: how B is stored, ``"kn"`` or
    ``"nk"`` (see the module docstring). ``rotate``: the wall-time loops over operand
    copies that exceed the L2 (see the module docstring)."""
    import torch

    import l2gen
    from l2gen import torch_ops

    from .dispatch import default_dispatcher, detect_gpu, use_db
    from .probes import Flush, Probes, build_probes
    from .protocol import check_l2
    from .runtime import device_info

    say = progress or (lambda line: None)
    check_l2(l2)
    gpu = detect_gpu()
    if gpu is None:
        raise RuntimeError(f"no l2gen target record for {torch.cuda.get_device_name()}")
    if b_layout not in ("kn", "nk"):
        raise ValueError(f"b_layout {b_layout!r}: kn or nk")
    nk = b_layout == "nk"
    use_db(db, l2=l2)  # what l2gen.matmul and the torch op serve from: the calls timed are the public ones
    dispatcher = default_dispatcher(nk)
    torch.cuda.init()
    l2_bytes = device_info(torch.cuda.current_device()).l2_bytes
    device_flush = Flush(Probes(build_probes()), l2, l2_bytes)

    def flush() -> None:
        device_flush(torch.cuda.current_stream().cuda_stream)
    rows = []
    for i, shape in enumerate(shapes, 1):
        m, n, k = shape.m, shape.n, shape.k
        g = torch.Generator(device="cuda").manual_seed(i)
        a = torch.randn(m, k, generator=g, device="cuda").half()
        # B as the product reads it: K x N, or the transpose of an N x K weight (a view)
        b = torch.randn(n, k, generator=g, device="cuda").half().t() if nk else torch.randn(k, n, generator=g, device="cuda").half()
        outs = [torch.empty(m, n, dtype=torch.half, device="cuda") for _ in CALLERS]
        ours = torch_ops.mm if nk else l2gen.matmul
        callers = {
            "l2gen": lambda out, a=a, b=b: ours(a, b, out=out),
            "torch": lambda out, a=a, b=b: torch.matmul(a, b, out=out),
            "control": lambda out, a=a, b=b: torch.matmul(a, b, out=out),
        }
        callers["l2gen"](outs[0])  # plans, builds or loads, and checks the shape's first result
        torch.cuda.synchronize()
        served = dispatcher.served_by(m, n, k)
        plan = dispatcher.plan(m, n, k) if served != "fallback" else None
        dev = _device_times(callers, outs, flush, reps)
        per_call = max(dev["torch"], 1.0)
        calls = max(10, min(500, int(WALL_TARGET_US / per_call)))
        operands = operand_copies(a, b, l2_bytes, calls) if rotate else None
        copies = len(operands) if operands else 1
        wall, enq = _wall_times(callers, outs, calls, rounds, operands)
        del operands
        callers["l2gen"](outs[0])
        callers["torch"](outs[1])
        torch.cuda.synchronize()
        ref = outs[1].float()
        err = float((outs[0].float() - ref).norm() / ref.norm().clamp_min(1e-30))
        row = {
            "m": m, "n": n, "k": k, "served_by": served,
            "tuned_for": str(plan.tuned_for) if plan else None,
            "recorded_speedup": plan.speedup if plan else None,
            "device_us": dev["l2gen"], "torch_device_us": dev["torch"], "device_ratio": dev["l2gen"] / dev["torch"],
            "wall_us": wall["l2gen"], "torch_wall_us": wall["torch"], "wall_ratio": wall["l2gen"] / wall["torch"],
            "enqueue_us": enq["l2gen"], "torch_enqueue_us": enq["torch"],
            "control_device_ratio": dev["control"] / dev["torch"], "control_wall_ratio": wall["control"] / wall["torch"],
            "calls": calls, "wall_copies": copies, "relerr": err,
        }
        row["ok"] = bool(row["device_ratio"] <= 1 + tolerance and row["wall_ratio"] <= 1 + tolerance and err <= 1e-3)
        rows.append(row)
        say(f"[dispatch] {i}/{len(shapes)} {shape}: {served}: device {dev['l2gen']:.2f} vs {dev['torch']:.2f} us "
            f"({row['device_ratio']:.3f}, control {row['control_device_ratio']:.3f}), wall {wall['l2gen']:.2f} vs "
            f"{wall['torch']:.2f} us ({row['wall_ratio']:.3f}, control {row['control_wall_ratio']:.3f})"
            + ("" if row["ok"] else "  <-- slower"))
    device_flush.free()
    return {
        "gpu": gpu.name, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "commit": git_commit(),
        "db": str(getattr(db, "path", db)), "b_layout": b_layout, "mode": "events", "l2": l2, "reps": reps, "rounds": rounds, "tolerance": tolerance,
        "wall_rotates": rotate,
        "rows": rows, "ok": all(r["ok"] for r in rows),
    }


def rotation(names: Sequence[str], r: int) -> list[tuple[str, int]]:
    """Round ``r``'s (caller, output index) pairs: the callers in an order rotated by ``r``,
    and caller ``j`` on output ``(j + r) % len(names)``, so that over ``len(names)`` rounds
    every caller goes first once and writes every output once."""
    count = len(names)
    return [(names[(t + r) % count], ((t + r) % count + r) % count) for t in range(count)]


def _device_times(callers: dict, outs: list, flush, reps: int) -> dict[str, float]:
    import torch

    names = list(callers)
    events: dict[str, list] = {name: [] for name in names}
    for r in range(3):  # warm-up
        for name, j in rotation(names, r):
            callers[name](outs[j])
    for r in range(reps):
        for name, j in rotation(names, r):
            flush()
            torch.cuda._sleep(SPIN_CYCLES)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            callers[name](outs[j])
            end.record()
            events[name].append((start, end))
    torch.cuda.synchronize()
    return {name: statistics.median(1000.0 * s.elapsed_time(e) for s, e in events[name]) for name in names}


def operand_copies(a, b, l2_bytes: int, calls: int) -> list[tuple]:
    """``(a, b)`` and copies of them at other addresses (B keeps its layout: a transposed
    view stays one), as many as :func:`l2gen.modes.rotation_copies` says keep each copy's
    operands out of the L2 from one use to the next in a loop of ``calls`` calls."""
    from .modes import rotation_copies

    m, k = a.shape
    n = b.shape[1]
    want = rotation_copies(a.element_size() * (m * k + k * n + m * n), l2_bytes, calls)
    out = [(a, b)]
    for _ in range(want - 1):
        out.append((a.clone(), b.clone()))  # (clone keeps the strides: a transposed view stays one)
    return out


def _wall_times(callers: dict, outs: list, calls: int, rounds: int,
                operands: Sequence[tuple] | None = None) -> tuple[dict[str, float], dict[str, float]]:
    """Per caller: the median over ``rounds`` of wall µs per call of ``calls`` back-to-back
    calls (then a synchronize), and of host µs per call spent inside the calls. With
    ``operands`` (several (a, b)), call i reads copy i modulo their number."""
    import torch

    names = list(callers)
    sets = list(operands) if operands else [None]
    wall: dict[str, list[float]] = {name: [] for name in names}
    enqueue: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name, j in rotation(names, r):
            fn, out = callers[name], outs[j]
            turns = [fn if ops is None else (lambda o, f=fn, ab=ops: f(o, *ab)) for ops in sets]
            torch.cuda.synchronize()
            inside = 0.0
            t0 = time.perf_counter()
            for i in range(calls):
                call = turns[i % len(turns)]
                c0 = time.perf_counter()
                call(out)
                inside += time.perf_counter() - c0
            torch.cuda.synchronize()
            wall[name].append(1e6 * (time.perf_counter() - t0) / calls)
            enqueue[name].append(1e6 * inside / calls)
    return ({name: statistics.median(wall[name]) for name in names},
            {name: statistics.median(enqueue[name]) for name in names})


def format_table(results: dict) -> str:
    head = f"{'shape':>20}  {'served by':<34} {'dev us':>9} {'torch':>9} {'ratio':>6}  {'wall us':>9} {'torch':>9} {'ratio':>6}  {'enq us':>6} {'torch':>6}  {'ctl dev':>7} {'ctl wall':>8}"
    lines = [head]
    for r in results["rows"]:
        lines.append(
            f"{r['m']}x{r['n']}x{r['k']}".rjust(20) + f"  {r['served_by'][:34]:<34} {r['device_us']:9.2f} {r['torch_device_us']:9.2f} {r['device_ratio']:6.3f}"
            f"  {r['wall_us']:9.2f} {r['torch_wall_us']:9.2f} {r['wall_ratio']:6.3f}  {r['enqueue_us']:6.2f} {r['torch_enqueue_us']:6.2f}"
            f"  {r['control_device_ratio']:7.3f} {r['control_wall_ratio']:8.3f}"
            + ("" if r["ok"] else "  <-- slower")
        )
    passed = sum(r["ok"] for r in results["rows"])
    lines.append(f"{passed} of {len(results['rows'])} shapes no slower than torch.matmul beyond {100 * results['tolerance']:.0f}% (device and wall time per call)")
    lines.append("ctl: torch.matmul timed against itself the same way, the noise of these ratios")
    return "\n".join(lines)


def write(results: dict, path: str | Path) -> None:
    import json

    Path(path).write_text(json.dumps(results, indent=1) + "\n")
