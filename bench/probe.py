"""Probe one or more programs on one shape under several split counts: event time per call
back to back (L2 warm) and after a 256 MiB read (L2 cold and clean), verified first.

A tool for looking inside a kernel's cost, not a benchmark (``l2gen bench`` is that):

    python bench/probe.py examples/splitk_cluster_l2gen.l2 --shape 1024x256x4096 --splits 1,2,4,8
    ncu --clock-control none --metrics gpu__time_duration.sum -k regex:gemm \\
        python bench/probe.py PROGRAM.l2 --shape ... --once   # one launch per setting, for ncu
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

from l2gen.build import build_many
from l2gen.ir import Knobs
from l2gen.parse import parse_file
from l2gen.runtime import Library
from l2gen.runner import source
from l2gen.targets import GPUS


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("programs", nargs="+")
    ap.add_argument("--shape", required=True)
    ap.add_argument("--splits", default="1")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--once", action="store_true", help="one launch per setting (for ncu)")
    args = ap.parse_args()
    m, n, k = (int(x) for x in args.shape.lower().split("x"))
    programs = [parse_file(p) for p in args.programs]
    results = build_many([source(p, GPUS["h200"]) for p in programs])
    for r in results:
        if not r.ok:
            print(r.error, file=sys.stderr)
            return 1
    flush = torch.empty(256 * 2**20 // 4, dtype=torch.float32, device="cuda")

    def timed(launch) -> tuple[float, float]:
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        warm, cold = [], []
        for _ in range(args.reps):
            for flushed, out in ((False, warm), (True, cold)):
                if flushed:
                    flush.sum()  # a read pass: L2 left holding clean lines of other data
                ev[0].record()
                launch()
                ev[1].record()
                torch.cuda.synchronize()
                out.append(ev[0].elapsed_time(ev[1]) * 1e3)
        return statistics.median(warm), statistics.median(cold)

    a = torch.randn(m, k, dtype=torch.float16, device="cuda")
    b = torch.randn(k, n, dtype=torch.float16, device="cuda")
    if args.once:  # cuBLAS's kernel once too, for ncu to set beside ours
        torch.matmul(a, b)
        torch.cuda.synchronize()
    else:
        w, cl = timed(lambda: torch.matmul(a, b))
        print(f"{'torch.matmul (kn)':40s} splits -: {'':14s}  warm {w:7.2f} us  cold {cl:7.2f} us")
        w, cl = timed(lambda: torch.empty(0, device="cuda").zero_())
        print(f"{'launch floor (empty zero_)':40s} splits -: {'':14s}  warm {w:7.2f} us  cold {cl:7.2f} us")
    for program, result in zip(programs, results):
        lib = Library.load(result.library, result.source.entry)
        nk = program.b_layout.value == "nk"
        a = torch.randn(m, k, dtype=torch.float16, device="cuda")
        b = torch.randn((n, k) if nk else (k, n), dtype=torch.float16, device="cuda")
        c = torch.empty(m, n, dtype=torch.float16, device="cuda")
        ref = a.float() @ (b.float().t() if nk else b.float())
        for s in (int(x) for x in args.splits.split(",")):
            knobs = Knobs(splits=s)
            stream = torch.cuda.current_stream()
            ws_bytes = lib.workspace_size(m, n, k, knobs)
            ws = torch.zeros(max(ws_bytes, 16), dtype=torch.uint8, device="cuda")  # zeroed once

            def launch():
                lib.launch(a, b, c, m, n, k, k, k if nk else n, n, knobs, ws if ws_bytes else None, ws_bytes,
                           stream.cuda_stream)

            try:
                c.fill_(float("nan"))
                launch()
                torch.cuda.synchronize()
            except Exception as e:  # a knob the binary refuses
                print(f"{program.name:40s} splits {s}: {e}")
                continue
            err = float((c.float() - ref).norm() / ref.norm())
            if args.once:
                print(f"{program.name:40s} splits {s}: relerr {err:.1e}")
                continue
            w, cl = timed(launch)
            print(f"{program.name:40s} splits {s}: relerr {err:.1e}  warm {w:7.2f} us  cold {cl:7.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
