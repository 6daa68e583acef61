"""Host time that l2gen.matmul adds to torch.matmul, per call, on tiny operands.

With 8 x 8 operands the kernels cost next to nothing, so calls back to back measure what
the host spends per call. On a CPU (no GPU needed) this isolates the dispatcher's Python
path; `l2gen bench-dispatch` measures the whole thing on a GPU.

    python bench/host_overhead.py [--device cpu|cuda] [--db PATH]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import l2gen
from l2gen.dispatch import use_db


def per_call_us(fn, calls: int = 20000) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--db", default=None, help="kernel database (default: none, every call falls back)")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    dtype = torch.float16 if args.device == "cuda" else torch.float32
    a, b = (torch.randn(8, 8, device=args.device, dtype=dtype) for _ in range(2))
    out = torch.empty(8, 8, device=args.device, dtype=dtype)
    dispatcher = use_db(args.db)  # l2gen.matmul's default from here on
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
    base = statistics.median(times["torch.matmul"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:>14}: {median:6.3f} us per call (+{median - base:.3f})")


if __name__ == "__main__":
    main()
