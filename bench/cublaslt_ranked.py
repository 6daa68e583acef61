"""Which of cuBLASLt's algorithms win on a shape: the auto-tuner's ranking (the heuristic's
first 16 algorithms timed round-robin after a clean flush, as ``l2gen bench`` tunes its
``cublaslt_autotuned`` baseline), then the heuristic's first pick and the tuner's fastest
``--top`` timed again side by side, and each launched once inside an NVTX range named
``ranked`` so that ncu can name their kernels (an nvjet kernel's name gives its tile, K
tile x stages, cluster and split):

    python bench/cublaslt_ranked.py --shape 256x4096x14336 --b nk
    ncu --nvtx --nvtx-include "ranked/" --metrics gpu__time_duration.sum,launch__grid_size \\
        python bench/cublaslt_ranked.py --shape 256x4096x14336 --b nk

The once-launches run in the order printed (heuristic, then rank 1, 2, ...). A tool for
learning what cuBLAS runs where it is fast, not a benchmark.
"""

from __future__ import annotations

import argparse

import torch

from l2gen import runtime
from l2gen.baselines import AUTOTUNE_REPS, Shim, build_shim
from l2gen.probes import Flush, Probes, build_probes
from l2gen.timing import time_interleaved


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", required=True, action="append", help="MxNxK (repeatable)")
    ap.add_argument("--b", choices=("kn", "nk"), default="nk", help="B's layout (default nk: nn.Linear's)")
    ap.add_argument("--top", type=int, default=4, help="the tuner's fastest to time again (default 4)")
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    shim = Shim(build_shim())
    probes = Probes(build_probes())
    runtime.call("cudaSetDevice", 0)
    flush = Flush(probes, "clean", runtime.device_info(0).l2_bytes)
    stream = torch.cuda.current_stream().cuda_stream
    nk = args.b == "nk"
    try:
        for spec in args.shape:
            m, n, k = (int(x) for x in spec.lower().split("x"))
            a = torch.randn(m, k, dtype=torch.float16, device="cuda")
            b = torch.randn((n, k) if nk else (k, n), dtype=torch.float16, device="cuda")
            c = torch.empty(m, n, dtype=torch.float16, device="cuda")
            pa, pb, pc = a.data_ptr(), b.data_ptr(), c.data_ptr()
            tried, chosen, best = shim.autotune(pa, pb, pc, m, n, k, nk, flush.function, flush.context,
                                                AUTOTUNE_REPS, stream)
            ranks = [0] + list(range(1, min(args.top, tried) + 1))
            runners = {r: (lambda s, r=r: shim.cublaslt(r, pa, pb, pc, m, n, k, nk, s)) for r in ranks}
            times = time_interleaved(runners, stream, flush, reps=args.reps, warmup=3, wall_check=False)
            print(f"{m}x{n}x{k} ({args.b}): {tried} algorithms timed, the fastest is the heuristic's "
                  f"#{chosen} at {best:.2f} us")
            for r in ranks:
                print(f"  {'heuristic first' if r == 0 else f'tuned rank {r}':16s} {times[r].median_us:8.2f} us")
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_push("ranked")
            for r in ranks:
                flush(stream)
                runners[r](stream)
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()
    finally:
        flush.free()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
