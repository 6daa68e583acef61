"""Host time that l2gen.matmul adds to torch.matmul, per call, on tiny operands.

With 8 x 8 operands the kernels cost next to nothing, so calls back to back measure what
the host spends per call. On a CPU (no GPU needed) this isolates the dispatcher's Python
path; `l2gen bench-dispatch` measures the whole thing on a GPU.

    python bench/host_overhead.py [--device cpu|cuda] [--db PATH | --winner] [--no-out]

``--winner`` times the path a database with winners takes for a shape it does not serve
(the 8 x 8 x 8 calls): it builds a throwaway H200 database whose one winner is 64x256x512,
so it works on a CPU too. Each row's "+" is the median over rounds of its time less
torch.matmul's in the same round (calls interleaved), which a noisy machine moves less.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

import l2gen
from l2gen import dispatch
from l2gen.dispatch import use_db


def per_call_us(fn, calls: int = 5000) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


class _AcceptingLauncher:
    """Takes any operands, as the real launcher takes CUDA fp16 ones, so that on a CPU the
    unserved shape settles on the fallback as it does on a GPU. Nothing serves the timed
    shape, so it is never asked to load or launch."""

    def eligible(self, a, b, out) -> bool:
        return True

    def capturing(self) -> bool:
        return False


def winner_dispatcher(folder: Path) -> dispatch.Dispatcher:
    """A dispatcher over a database with one winner (64x256x512), made l2gen.matmul's default."""
    from l2gen.db import KernelDB
    from l2gen.ir import Family
    from l2gen.problem import Measurement, Shape
    from l2gen.space import assemble
    from l2gen.targets import GPUS

    db = KernelDB(folder / "winner.db")
    program = assemble(Family.SM90, {"bm": 128, "bn": 128, "bk": 64})
    # Recorded with this process's toolchain: the dispatcher serves only rows built with
    # the nvcc it builds with.
    db.add(Measurement(Shape(64, 256, 512), program, "ok", time_us=8.0, baseline_us=10.0), GPUS["h200"],
           "test", dispatch.own_toolchain())
    d = dispatch.Dispatcher(db, GPUS["h200"], launcher=_AcceptingLauncher())
    assert not d._idle
    dispatch._set_default(d)  # use_db would pick this machine's GPU: none on a CPU
    return d


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--db", default=None, help="kernel database (default: none, every call falls back)")
    parser.add_argument("--winner", action="store_true", help="a throwaway H200 database with a winner for another shape")
    parser.add_argument("--no-out", action="store_true", help="call without out=")
    parser.add_argument("--rounds", type=int, default=60)
    args = parser.parse_args()
    dtype = torch.float16 if args.device == "cuda" else torch.float32
    a, b = (torch.randn(8, 8, device=args.device, dtype=dtype) for _ in range(2))
    out = torch.empty(8, 8, device=args.device, dtype=dtype)
    tmp = tempfile.TemporaryDirectory()
    # l2gen.matmul's default from here on
    dispatcher = winner_dispatcher(Path(tmp.name)) if args.winner else use_db(args.db)
    if args.no_out:
        calls = {
            "torch.matmul": lambda: torch.matmul(a, b),
            "Dispatcher": lambda: dispatcher(a, b),
            "l2gen.matmul": lambda: l2gen.matmul(a, b),
        }
    else:
        calls = {
            "torch.matmul": lambda: torch.matmul(a, b, out=out),
            "Dispatcher": lambda: dispatcher(a, b, out=out),
            "l2gen.matmul": lambda: l2gen.matmul(a, b, out=out),
        }
    for fn in calls.values():
        fn()
    times = {name: [] for name in calls}
    for _ in range(args.rounds):
        for name, fn in calls.items():
            if args.device == "cuda":
                torch.cuda.synchronize()
            times[name].append(per_call_us(fn))
    # What a call adds: the median over rounds of its time less torch.matmul's in the same
    # round, which a load that comes and goes during the run moves less than either time.
    base = times["torch.matmul"]
    for name, values in times.items():
        added = statistics.median(t - b for t, b in zip(values, base))
        print(f"{name:>14}: {statistics.median(values):6.3f} us per call (+{added:.3f})")


if __name__ == "__main__":
    main()
