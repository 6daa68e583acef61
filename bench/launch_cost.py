"""What a launch's shape costs before any work: event time, after a clean flush, of empty
grids launched as a GEMM would be (blocks, threads a block, dynamic shared memory, cluster
size) beside the one-thread empty kernel, all round-robin in one process, two rounds.

    python bench/launch_cost.py

A tool for reading a kernel's fixed cost (``bench/timeline.py`` shows the same launches'
life between two marker kernels), not a benchmark.
"""

from __future__ import annotations

from l2gen import runtime
from l2gen.probes import Flush, Probes, build_probes
from l2gen.timing import time_interleaved

# (blocks, cluster, threads, dynamic shared memory)
CONFIGS = [(1, 1, 32, 0), (1, 1, 128, 0), (1, 1, 384, 0), (4, 1, 128, 0), (4, 1, 384, 0), (16, 1, 384, 0),
           (64, 1, 128, 0), (64, 1, 384, 0), (128, 1, 32, 0), (128, 1, 128, 0), (128, 1, 256, 0),
           (128, 1, 384, 0), (132, 1, 384, 0), (264, 1, 384, 0), (128, 1, 384, 200 * 1024),
           (128, 2, 384, 200 * 1024), (4, 1, 384, 200 * 1024), (1, 1, 384, 200 * 1024),
           (128, 1, 128, 100 * 1024)]


def main() -> int:
    probes = Probes(build_probes())
    runtime.call("cudaSetDevice", 0)
    stream = runtime.Stream()
    flush = Flush(probes, "clean", runtime.device_info(0).l2_bytes)
    runners = {"empty (1 thread)": probes.empty}
    for b, c, t, s in CONFIGS:
        runners[f"grid {b:4d} x {t:3d} thr, {s // 1024:3d} KB, cluster {c}"] = (
            lambda st, b=b, c=c, t=t, s=s: probes.empty_grid(b, c, t, s, st))
    try:
        for rnd in range(2):
            res = time_interleaved(runners, stream.handle, flush, reps=100, warmup=5, wall_check=False)
            print(f"-- round {rnd}")
            for name, r in res.items():
                print(f"{name:45s} {r.median_us:7.2f} us")
    finally:
        flush.free()
        stream.destroy()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
