"""Where one launch of an ``impl l2gen`` kernel spends its time, block by block.

The program is built a second time with ``-DL2GEN_TRACE`` (its own cache entry; the plain
build is untouched), which makes each block write ``%globaltimer`` and ``%clock64`` at seven
points of its life: entry, its first TMA load issued, its first stage full (the first
tile's latency), the end of its mainloop, its ticket taken (split K: its own partial added
or stored; a cluster's partials all in shared memory), the end of its reduction (split K),
the end of its stores; and, in %clock64 cycles, how long its first unit's math waited for full stages
(the data late) and its loads for free ones (the math late). Each launch runs after a read
pass over 256 MiB (L2 cold and clean, as ``l2gen bench`` times it), on fresh inputs, verified once, between two one-thread kernels
that stamp %globaltimer: ``life`` is the time between them, the GEMM's whole time on the
device (launch and drain included; the same markers around torch.matmul give its
``life`` on the first line, and around empty grids launched as a GEMM is, 384 threads a
block with and without 200 KB of shared memory and in clusters of 2: what the launch
itself costs). Printed per program and split count: life, the span (first block entry to
last store), the lead (first marker to first block entry) and tail (last stamp to second
marker) that make up the rest, and, over blocks, the median and maximum of each phase, in
microseconds (the median launch of ``--reps``); then the mainloop's clock (%clock64 against
%globaltimer) and its cycles a K tile and FLOP a cycle per SM (an H100's or H200's tensor
cores peak at 4096 dense fp16 FLOP a cycle per SM), and the median over blocks of the two
waits as shares of the mainloop; with a split of K, the median of each part of the reduction
(its own partial and ticket, the read-back of the sum) for the blocks that write their tile
and for those that leave it to another split. A persistent launch's blocks also stamp the
end of every unit's mainloop and their consumers' exit: grouped by how many units they ran,
the median of each (where a later unit runs slower than the first, or a group ends late).

    python bench/timeline.py PROGRAM.l2 [...] --shape 1024x256x4096 --splits 1,2,4,8
    python bench/timeline.py PROGRAM.l2 --shape ... --json out.json   # every block, every rep
    python bench/timeline.py PROGRAM.l2 --shape ... --decompositions data_parallel,stream_k

A tool for looking inside a kernel, not a benchmark (``l2gen bench`` is that).
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import statistics
import sys

import torch

from l2gen.build import build_many
from l2gen.ir import Decomposition, Family
from l2gen.lower import define_flags
from l2gen.runner import source as build_source
from l2gen.parse import parse_file
from l2gen.probes import Probes, build_probes
from l2gen.runtime import Library
from l2gen.targets import GPUS

POINTS = ("entry", "first_load", "first_full", "mainloop", "ticketed", "reduced", "stored")
PHASES = (  # (name, from point, to point)
    ("start", None, "entry"),             # entry after the launch's first block entered
    ("issue", "entry", "first_load"),     # setup until the first load is issued
    ("latency", "first_load", "first_full"),  # the first stage's round trip
    ("mainloop", "first_full", "mainloop"),
    ("reduce", "mainloop", "reduced"),
    ("store", "reduced", "stored"),
)
# Split K: the reduction in two parts, for the blocks that write their tile (they reach
# "stored") and those that leave it to another split (they do not).
REDUCE_PARTS = (
    ("own", "mainloop", "ticketed"),  # its partial added or stored and its ticket taken
                                      # (cluster: every partial in shared memory)
    ("sum", "ticketed", "reduced"),   # the writer's read-back of the sum (cluster: its slice)
)
WAITS = ("full_wait", "empty_wait")  # cycles of the first unit's mainloop: data late, math late
SLOTS = 2 * len(POINTS) + 2 + len(WAITS)
MAX_BLOCKS = 4096  # kTraceBlocks in templates/sm90_l2gen_gemm.cu.j2
UNIT_SLOTS = 32  # kTraceUnits + 1: each unit's mainloop end, then the consumers' exit


def traced_library(program, flags: tuple[str, ...] = ()):
    """The program's source built with the trace points (and any extra -D flags)."""
    source = build_source(program, GPUS["h200"])
    return source.with_flags("-DL2GEN_TRACE", *flags)


def blocks_of(raw, n: int, units_raw=None) -> list[dict]:
    out = []
    for b in range(n):
        row = raw[b * SLOTS:(b + 1) * SLOTS]
        if not row[2 * len(POINTS) + 1]:
            continue  # never ran (or over kTraceBlocks)
        ns = {p: row[i] for i, p in enumerate(POINTS) if row[i]}
        cycles = {p: row[len(POINTS) + i] for i, p in enumerate(POINTS) if row[len(POINTS) + i]}
        waits = {w: row[2 * len(POINTS) + 2 + i] for i, w in enumerate(WAITS)}
        block = {"block": b, "sm": int(row[2 * len(POINTS)]), "ns": ns, "cycles": cycles, "waits": waits}
        if units_raw is not None:  # each unit's mainloop end (ns), the consumers' exit
            u = units_raw[b * UNIT_SLOTS:(b + 1) * UNIT_SLOTS]
            block["unit_ns"] = [t for t in u[:UNIT_SLOTS - 1] if t]
            block["exit_ns"] = u[UNIT_SLOTS - 1]
        out.append(block)
    return out


def unit_paces(blocks: list[dict]) -> list[dict]:
    """A persistent launch's blocks grouped by how many units they ran (as traced, at most
    UNIT_SLOTS - 1): how many blocks, and the median over them of when each unit's mainloop
    ended and when the consumers left, in us after the launch's first block entered."""
    if not blocks or "unit_ns" not in blocks[0]:
        return []
    t0 = min(b["ns"]["entry"] for b in blocks)
    groups: dict[int, list[dict]] = {}
    for b in blocks:
        groups.setdefault(len(b["unit_ns"]), []).append(b)
    out = []
    for count, group in sorted(groups.items(), reverse=True):
        ends = [statistics.median((b["unit_ns"][i] - t0) / 1e3 for b in group) for i in range(count)]
        exits = [(b["exit_ns"] - t0) / 1e3 for b in group if b["exit_ns"]]
        out.append({"units": count, "blocks": len(group), "ends_us": ends,
                    "exit_us": statistics.median(exits) if exits else None,
                    "last_exit_us": max(exits) if exits else None})
    return out


def phases(blocks: list[dict]) -> dict:
    t0 = min(b["ns"]["entry"] for b in blocks)
    end = max(max(b["ns"].values()) for b in blocks)
    per = {name: [] for name, _, _ in PHASES}
    for b in blocks:
        ns = b["ns"]
        for name, a, z in PHASES:
            if z not in ns or (a is not None and a not in ns):
                continue
            per[name].append((ns[z] - (t0 if a is None else ns[a])) / 1e3)
    stats = {name: (statistics.median(v), max(v)) for name, v in per.items() if v}
    # The mainloop in its SM's cycles (%clock64) beside its nanoseconds: the clock it ran at.
    loop = [(b["cycles"]["mainloop"] - b["cycles"]["first_full"], b["ns"]["mainloop"] - b["ns"]["first_full"])
            for b in blocks if {"mainloop", "first_full"} <= b["cycles"].keys() & b["ns"].keys()]
    cycles = statistics.median(c for c, _ in loop) if loop else 0.0
    mhz = statistics.median(1e3 * c / ns for c, ns in loop if ns > 0) if loop else 0.0
    # Each wait as a share of its block's mainloop cycles: the median over blocks.
    waited = {}
    for w in WAITS:
        shares = [b["waits"][w] / (b["cycles"]["mainloop"] - b["cycles"]["first_full"]) for b in blocks
                  if {"mainloop", "first_full"} <= b["cycles"].keys()
                  and b["cycles"]["mainloop"] > b["cycles"]["first_full"]]
        if shares:
            waited[w] = statistics.median(shares)
    return {"span_us": (end - t0) / 1e3, "blocks": len(blocks), "phases": stats, "t0_ns": t0, "end_ns": end,
            "mainloop_cycles": cycles, "mainloop_mhz": mhz, "waited": waited, "reduce_parts": reduce_parts(blocks)}


def reduce_parts(blocks: list[dict]) -> dict:
    """Split K: for the blocks that write their tile ("writers") and the others ("leavers"),
    how many there are and the median of each part of their reduction (us). Empty without a
    split (no block reaches "ticketed")."""
    out = {}
    for role, writes in (("writers", True), ("leavers", False)):
        group = [b["ns"] for b in blocks if "ticketed" in b["ns"] and ("stored" in b["ns"]) == writes]
        if not group:
            continue
        out[role] = {"blocks": len(group)}
        for name, a, z in REDUCE_PARTS:
            v = [(ns[z] - ns[a]) / 1e3 for ns in group if a in ns and z in ns]
            if v:
                out[role][name] = statistics.median(v)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("programs", nargs="+")
    ap.add_argument("--shape", required=True)
    ap.add_argument("--splits", default="1")
    ap.add_argument("--decompositions", default="",
                    help="comma-separated, e.g. heuristic,stream_k (default: each program's own)")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--json", help="write every block of every rep here")
    ap.add_argument("--empty-blocks", type=int, default=128,
                    help="blocks of the empty grids timed beside the programs (even; default 128)")
    ap.add_argument("--define", action="append", default=[], metavar="MACRO",
                    help="also time each program built with -DMACRO (repeatable; A=1+B=1 defines both)")
    args = ap.parse_args()
    m, n, k = (int(x) for x in args.shape.lower().split("x"))
    programs = [parse_file(p) for p in args.programs]
    for p in programs:
        if p.family is not Family.SM90_L2GEN:
            print(f"{p.name}: only impl l2gen kernels carry the trace", file=sys.stderr)
            return 2
    # Each program as written, then once per --define (A=1+B=1: both macros): (program, label, flags).
    variants = [(p, p.name, ()) for p in programs]
    variants += [(p, f"{p.name} -D{d}", define_flags(d)) for d in args.define for p in programs]
    results = build_many([traced_library(p, flags) for p, _, flags in variants])
    for r in results:
        if not r.ok:
            print(r.error, file=sys.stderr)
            return 1
    flush = torch.empty(256 * 2**20 // 4, dtype=torch.float32, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream  # every launch of this script
    dump = []
    marker = Library.load(results[0].library, results[0].source.entry)._dll
    mark = getattr(marker, f"{results[0].source.entry}_mark")
    mark.argtypes = [ctypes.c_int, ctypes.c_void_p]
    marks = getattr(marker, f"{results[0].source.entry}_marks")
    marks.argtypes = [ctypes.c_void_p]

    def life(launch) -> tuple[float, int, int]:
        """Device time between two marker kernels around one launch after a flush (us), and
        the two markers' %globaltimer stamps (ns) to place the launch's blocks between them."""
        flush.sum()
        mark(0, stream)
        launch()
        mark(1, stream)
        torch.cuda.synchronize()
        raw = (ctypes.c_ulonglong * 64)()
        if marks(raw) != 0:
            raise RuntimeError("marks read failed")
        return (raw[1] - raw[0]) / 1e3, raw[0], raw[1]

    a = torch.randn(m, k, dtype=torch.float16, device="cuda")
    b = torch.randn(k, n, dtype=torch.float16, device="cuda")
    empty = torch.empty(0, device="cuda")
    probes = Probes(build_probes())
    baselines = [("torch.matmul (kn)", lambda: torch.matmul(a, b)), ("empty kernel", lambda: empty.zero_())]
    # Empty grids shaped like the GEMM's launch: what its grid, shared memory and cluster cost.
    for cluster, smem in ((1, 0), (1, 200 * 1024), (2, 200 * 1024)):
        baselines.append((f"empty {args.empty_blocks}x384 smem {smem // 1024}K cluster {cluster}",
                          lambda c=cluster, sm=smem: probes.empty_grid(args.empty_blocks, c, 384, sm, stream)))
    for name, fn in baselines:
        fn()
        lives = sorted(life(fn)[0] for _ in range(args.reps))
        print(f"{name:40s} {'-':>6s} {'-':>6s} {lives[len(lives) // 2]:7.2f}")
    print(f"{'program':40s} {'splits':>6s} {'blocks':>6s} {'life':>7s} {'span':>7s} {'lead':>6s} {'tail':>6s}  "
          + "  ".join(f"{name:>13s}" for name, _, _ in PHASES) + "   (us: median/max over blocks)")
    for (program, label0, _), result in zip(variants, results):
        lib = Library.load(result.library, result.source.entry)
        dll = lib._dll
        get = getattr(dll, f"{result.source.entry}_trace")
        get.argtypes = [ctypes.c_void_p, ctypes.c_int]
        get_units = getattr(dll, f"{result.source.entry}_trace_units")
        get_units.argtypes = [ctypes.c_void_p, ctypes.c_int]
        reset = getattr(dll, f"{result.source.entry}_trace_reset")
        nk = program.b_layout.value == "nk"
        decompositions = [Decomposition(x) for x in args.decompositions.split(",") if x] or [None]
        for s, d in ((int(x), d) for x in args.splits.split(",") for d in decompositions):
            knobs = dataclasses.replace(program.knobs, splits=s)  # its own decomposition, grid, ...
            if d is not None:
                knobs = dataclasses.replace(knobs, decomposition=d)
                label = f"{label0} {d.value}"
            else:
                label = label0
            ws_bytes = lib.workspace_size(m, n, k, knobs)
            ws = torch.zeros(max(ws_bytes, 16), dtype=torch.uint8, device="cuda")
            a = torch.randn(m, k, dtype=torch.float16, device="cuda")
            b = torch.randn((n, k) if nk else (k, n), dtype=torch.float16, device="cuda")
            c = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")

            def launch():
                lib.launch(a, b, c, m, n, k, k, k if nk else n, n, knobs, ws if ws_bytes else None,
                           ws_bytes, stream)

            try:
                launch()
                torch.cuda.synchronize()
            except Exception as e:  # a knob the binary refuses
                print(f"{label:40s} {s:6d}: {e}")
                continue
            ref = a.float() @ (b.float().t() if nk else b.float())
            err = float((c.float() - ref).norm() / ref.norm())
            if not err <= 1e-3:
                print(f"{label:40s} {s:6d}: wrong result (relerr {err:.2e})")
                continue
            reps = []
            for _ in range(args.reps):
                if reset() != 0:
                    raise RuntimeError("trace reset failed")
                lived, mark0, mark1 = life(launch)
                raw = (ctypes.c_ulonglong * (SLOTS * MAX_BLOCKS))()
                units_raw = (ctypes.c_ulonglong * (UNIT_SLOTS * MAX_BLOCKS))()
                if get(raw, MAX_BLOCKS) != 0 or get_units(units_raw, MAX_BLOCKS) != 0:
                    raise RuntimeError("trace read failed")
                blocks = blocks_of(raw, MAX_BLOCKS, units_raw)
                summary = phases(blocks)
                summary["units"] = unit_paces(blocks)
                summary["life_us"] = lived
                # Life outside the blocks: marker to first entry (launch), last stamp to marker (drain).
                summary["lead_us"] = (summary["t0_ns"] - mark0) / 1e3
                summary["tail_us"] = (mark1 - summary["end_ns"]) / 1e3
                reps.append((summary, blocks))
            reps.sort(key=lambda r: r[0]["span_us"])
            summary, blocks = reps[len(reps) // 2]
            cells = "  ".join(
                f"{summary['phases'][name][0]:6.2f}/{summary['phases'][name][1]:6.2f}"
                if name in summary["phases"] else f"{'-':>13s}" for name, _, _ in PHASES)
            print(f"{label:40s} {s:6d} {summary['blocks']:6d} {summary['life_us']:7.2f} "
                  f"{summary['span_us']:7.2f} {summary['lead_us']:6.2f} {summary['tail_us']:6.2f}  {cells}")
            # The mainloop's rate per SM (first stage full to last wgmma: every K tile of the
            # block's first unit), at the clock it ran.
            tm, tn, tk = program.config.tile.m, program.config.tile.n, program.config.tile.k
            k_tiles = -(-k // (tk * s))
            if summary["mainloop_cycles"]:
                per_tile = summary["mainloop_cycles"] / k_tiles
                waited = summary["waited"]
                print(f"{'':40s} mainloop at {summary['mainloop_mhz']:.0f} MHz: {per_tile:.0f} cycles a K tile, "
                      f"{2 * tm * tn * tk / per_tile:.0f} FLOP a cycle; of its cycles, the math waited "
                      f"{100 * waited.get('full_wait', 0):.0f}% for data, the loads "
                      f"{100 * waited.get('empty_wait', 0):.0f}% for free stages")
            for g in summary["units"]:
                if g["units"] < 2 and len(summary["units"]) == 1:
                    break  # one unit a block: the phases above say it all
                exit_us = f"{g['exit_us']:.1f} (last {g['last_exit_us']:.1f})" if g["exit_us"] is not None else "-"
                print(f"{'':40s} {g['blocks']} blocks of {g['units']} units: mainloops end at "
                      + ", ".join(f"{e:.1f}" for e in g["ends_us"]) + f"; consumers leave at {exit_us} "
                      "(us after the first entry, medians)")
            parts = summary["reduce_parts"]
            if parts:
                print(f"{'':40s} reduction (median us): " + "; ".join(
                    f"{d['blocks']} {role} " + ", ".join(f"{name} {v:.2f}" for name, v in d.items() if name != "blocks")
                    for role, d in parts.items()))
            dump.append({"program": label, "shape": [m, n, k], "splits": s,
                         "reps": [{"summary": r[0], "blocks": r[1]} for r in reps]})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dump, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
