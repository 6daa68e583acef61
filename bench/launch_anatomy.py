"""Where a tiny GEMM's time goes: launch properties, first loads and the output's stores,
each timed alone, beside torch.matmul, l2gen programs and a bare mma.sync GEMM.

Every setting is one launch timed by events after a clean flush (a 256 MiB read), all of
them round-robin in one loop (rotated, so none is always first), ``--reps`` medians. The
pieces (``bench/launch_anatomy.cu``) are empty kernels that differ from the one-thread
launch floor by one property each (threads, dynamic shared memory, a 384-byte parameter
block, a cluster attribute), kernels that only load a shape's operands (A and B, from a
clean L2), only store its output, or both, in one CTA per 64x64 tile, ``tiny_gemm``: a
64x64-tile mma.sync GEMM with nothing else in it, and, where K <= 128, ``shortk_gemm``: a
128x128-tile one that multiplies and stores each warp's columns in 1, 2 or 4 groups, so
that one group's stores drain while the next is multiplied; and C's bytes stored by few CTAs,
by the threads or by bulk copies from shared memory (the engine TMA stores use); and, where
K <= 256, a short-K GEMM's traffic without its math (``tile_traffic``: each 128x128 or 256x128
tile's A and B loaded, a spin for its MMAs, its rows stored), piece by piece. A tool for
looking, not a benchmark::

    python bench/launch_anatomy.py --shapes 64x64x64,128x128x128 \\
        bench/programs/small/kn_64x64x64_s2.l2 --json out.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
from pathlib import Path

import torch

from l2gen.build import build_helper, build_many
from l2gen.parse import parse_file
from l2gen.runner import source
from l2gen.runtime import Library
from l2gen.targets import GPUS
from l2gen.toolchain import find_nvcc
from l2gen.ir import Knobs

SOURCE = Path(__file__).with_name("launch_anatomy.cu")


def build() -> ctypes.CDLL:
    nvcc = str(find_nvcc())
    path = build_helper("the launch anatomy probes", "bench", "launch_anatomy", SOURCE,
                        lambda out: [nvcc, "-std=c++17", "-O3", "-Xcompiler=-fPIC", "-shared",
                                     "-gencode=arch=compute_90a,code=sm_90a", str(SOURCE), "-o", out],
                        version="5")
    lib = ctypes.CDLL(str(path))
    for name in ("la_empty", "la_empty_smem", "la_empty_params", "la_empty_cluster", "la_load", "la_store",
                 "la_load_store", "la_tiny_gemm", "la_shortk", "la_store_bulk", "la_tile_traffic"):
        getattr(lib, name).restype = ctypes.c_int
    return lib


# tile_traffic variants: (label, load, spin in units of the tile's MMA cycles, store, inflight,
# load buffers: units in flight)
TRAFFIC = (
    ("stores (bulk)", 0, 0.0, 1, -1, 2),
    ("stores (threads)", 0, 0.0, 2, -1, 2),
    ("loads", 1, 0.0, 0, -1, 2),
    ("loads + stores", 1, 0.0, 1, -1, 2),
    ("loads + MMA time + stores", 1, 1.2, 1, -1, 2),
    ("loads + MMA time + stores, 1 staging buffer", 1, 1.2, 1, 0, 2),
    ("loads + MMA time + stores, 2 staging buffers", 1, 1.2, 1, 1, 2),
    ("B resident: loads + stores", 2, 0.0, 1, -1, 2),
    ("B resident: loads + MMA time + stores", 2, 1.2, 1, -1, 2),
) + tuple(
    (f"{what}, {b - 1} units ahead", 1, spin, store, -1, b)
    for b in (3, 4) for what, spin, store in (("loads", 0.0, 0), ("loads + stores", 0.0, 1),
                                              ("loads + MMA time + stores", 1.2, 1)))


def traffic_settings(lib, m: int, n: int, k: int, sp, check) -> list:
    """A short-K GEMM's traffic without its math (bench/launch_anatomy.cu's tile_traffic) on
    a CTA an SM in 128x128 and 256x128 tiles; the MMA time a spin of 1.2x the tile's cycles at
    the tensor cores' peak of 4096 FLOP a cycle. Loads run one unit ahead, or two or three
    where their buffers fit."""
    if k > 256 or k % 8:
        return []
    a = torch.zeros(m * k, dtype=torch.float16, device="cuda")
    b = torch.zeros(n * k, dtype=torch.float16, device="cuda")
    c = torch.empty(m * n, dtype=torch.float16, device="cuda")
    ctas = torch.cuda.get_device_properties(0).multi_processor_count
    out = []
    for tm, tn in ((128, 128), (256, 128)):
        if m % tm or n % tn:
            continue
        cycles = 2 * tm * tn * k / 4096
        for label, load, spin, store, inflight, buffers in TRAFFIC:
            if buffers * (tm + tn) * k * 2 + 2 * tn + 64 > GPUS["h200"].smem_per_block:  # the .cu's count, or more
                continue

            def launch(tm=tm, tn=tn, load=load, spin=int(spin * cycles), store=store, inflight=inflight,
                       buffers=buffers):
                check(lib.la_tile_traffic(ctypes.c_void_p(c.data_ptr()), ctypes.c_void_p(a.data_ptr()),
                                          ctypes.c_void_p(b.data_ptr()), m, n, k, tm, tn, ctas, load, spin, store,
                                          inflight, buffers, sp), "tile_traffic")
            out.append((f"traffic {tm}x{tn}, {ctas} CTAs: {label}", launch))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("programs", nargs="*", help="l2gen programs (K x N B) to time beside the pieces")
    ap.add_argument("--shapes", default="64x64x64,128x128x128,256x256x256,512x512x512")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json", help="write the medians here")
    args = ap.parse_args()
    lib = build()
    programs = [parse_file(p) for p in args.programs]
    results = build_many([source(p, GPUS["h200"]) for p in programs])
    for r in results:
        if not r.ok:
            print(r.error, file=sys.stderr)
            return 1
    libraries = [(p, Library.load(r.library, r.source.entry)) for p, r in zip(programs, results)]

    stream = torch.cuda.current_stream()
    sp = ctypes.c_void_p(stream.cuda_stream)
    flush = torch.empty(256 * 2**20 // 4, dtype=torch.float32, device="cuda")
    sink = torch.zeros(4, dtype=torch.int32, device="cuda")
    sink_p = ctypes.c_void_p(sink.data_ptr())

    def check(rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"{what}: cudaError {rc}")

    rows: dict[str, dict[str, float]] = {}
    for shape in args.shapes.split(","):
        m, n, k = (int(x) for x in shape.lower().split("x"))
        tiles = (m // 64) * (n // 64)
        in_bytes, out_bytes = (m * k + k * n) * 2, m * n * 2
        src = torch.zeros(in_bytes // 2, dtype=torch.float16, device="cuda")  # zeros: the fold stays 0
        dst = torch.empty(out_bytes // 2, dtype=torch.float16, device="cuda")
        a = torch.randn(m, k, dtype=torch.float16, device="cuda")
        b = torch.randn(k, n, dtype=torch.float16, device="cuda")
        c = torch.empty(m, n, dtype=torch.float16, device="cuda")
        ref = a.float() @ b.float()
        settings = [
            ("empty, 1 thread (the launch floor)", lambda: check(lib.la_empty(1, sp), "empty")),
            ("empty_ zero_ (torch's floor)", lambda: torch.empty(0, device="cuda").zero_()),
            ("empty, 256 threads", lambda: check(lib.la_empty(256, sp), "empty")),
            ("empty, 384 threads", lambda: check(lib.la_empty(384, sp), "empty")),
            ("empty, 256 threads, 33 KB dynamic smem", lambda: check(lib.la_empty_smem(256, 33 * 1024, sp), "smem")),
            ("empty, 384 threads, 200 KB dynamic smem", lambda: check(lib.la_empty_smem(384, 200 * 1024, sp), "smem")),
            ("empty, 256 threads, 384 B of parameters", lambda: check(lib.la_empty_params(256, sink_p, sp), "params")),
            ("empty, 256 threads, cluster 1x1x1 launch", lambda: check(lib.la_empty_cluster(256, sp), "cluster")),
            ("load A+B, a 128-thread CTA per 64x64 tile",
             lambda: check(lib.la_load(ctypes.c_void_p(src.data_ptr()), in_bytes, tiles, 128, sink_p, sp), "load")),
            ("store C, a 128-thread CTA per 64x64 tile",
             lambda: check(lib.la_store(ctypes.c_void_p(dst.data_ptr()), out_bytes, tiles, 128, sp), "store")),
            ("load A+B, store C, a CTA per 64x64 tile",
             lambda: check(lib.la_load_store(ctypes.c_void_p(src.data_ptr()), in_bytes, ctypes.c_void_p(dst.data_ptr()),
                                             out_bytes, tiles, 128, sp), "load_store")),
        ]
        for threads in (128, 512):
            settings.append((f"store C, 132 CTAs x {threads} threads",
                             lambda threads=threads: check(lib.la_store(ctypes.c_void_p(dst.data_ptr()), out_bytes,
                                                                        132, threads, sp), "store")))
        for blocks, chunk in ((132, 16384), (132, 32768), (264, 16384), (1056, 4096)):
            if out_bytes % chunk == 0:
                settings.append((f"store C by bulk copies, {blocks} CTAs, {chunk // 1024} KB each",
                                 lambda blocks=blocks, chunk=chunk: check(lib.la_store_bulk(
                                     ctypes.c_void_p(dst.data_ptr()), out_bytes, blocks, chunk, sp), "store_bulk")))
        settings += traffic_settings(lib, m, n, k, sp, check)
        settings.append(("torch.matmul", lambda: torch.matmul(a, b)))
        c_torch = torch.empty(m, n, dtype=torch.float16, device="cuda")
        settings.append(("torch.matmul, out= given", lambda: torch.matmul(a, b, out=c_torch)))
        gemms = [("tiny_gemm (mma.sync 64x64x32, 4 stages)",
                  lambda: check(lib.la_tiny_gemm(ctypes.c_void_p(a.data_ptr()), ctypes.c_void_p(b.data_ptr()),
                                                 ctypes.c_void_p(c.data_ptr()), m, n, k, sp), "tiny_gemm"))]
        if m % 128 == 0 and n % 128 == 0 and k % 16 == 0 and k <= 128:
            for chunks in (1, 2, 4):
                gemms.append((f"shortk_gemm (mma.sync 128x128, whole K, {chunks} column groups)",
                              lambda chunks=chunks: check(lib.la_shortk(
                                  ctypes.c_void_p(a.data_ptr()), ctypes.c_void_p(b.data_ptr()),
                                  ctypes.c_void_p(c.data_ptr()), m, n, k, chunks, sp), "shortk_gemm")))
        for p, lib2 in libraries:
            def launch(lib2=lib2):
                lib2.launch(a, b, c, m, n, k, k, n, n, Knobs(), None, 0, stream.cuda_stream)
            gemms.append((f"l2gen {p.name}", launch))
        for label, launch in gemms:  # verified on NaN-poisoned outputs first
            c.fill_(float("nan"))
            launch()
            torch.cuda.synchronize()
            err = float((c.float() - ref).norm() / ref.norm())
            print(f"{shape} {label}: relerr {err:.1e}")
            if err <= 1e-3:
                settings.append((label, launch))
        for _, launch in settings:  # warm-up: attributes set, modules loaded
            launch()
        torch.cuda.synchronize()
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        times: dict[str, list[float]] = {label: [] for label, _ in settings}
        for rep in range(args.reps):
            for i in range(len(settings)):
                label, launch = settings[(i + rep) % len(settings)]
                flush.sum()
                ev[0].record()
                launch()
                ev[1].record()
                torch.cuda.synchronize()
                times[label].append(ev[0].elapsed_time(ev[1]) * 1e3)
        rows[shape] = {label: statistics.median(t) for label, t in times.items()}

    labels = list(dict.fromkeys(label for r in rows.values() for label in r))
    shapes = list(rows)
    width = max(len(label) for label in labels)
    print(f"{'event time after a clean flush, median us':{width}s}" + "".join(f"{s:>14s}" for s in shapes))
    for label in labels:
        print(f"{label:{width}s}" + "".join(f"{rows[s][label]:14.2f}" if label in rows[s] else f"{'-':>14s}"
                                            for s in shapes))
    if args.json:
        Path(args.json).write_text(json.dumps({"reps": args.reps, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
