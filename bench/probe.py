"""Probe programs on one shape under several split counts and decompositions: event time
per call back to back (L2 warm) and after a 256 MiB read (L2 cold and clean), every setting
verified first and all of them timed round-robin in one loop, so that clocks and power
move them alike.

A tool for looking inside a kernel's cost, not a benchmark (``l2gen bench`` is that):

    python bench/probe.py examples/splitk_cluster_l2gen.l2 --shape 1024x256x4096 --splits 1,2,4,8
    python bench/probe.py P.l2 --shape 16x1280x8192 --lib old/lib.so:ENTRY   # beside a built library
    python bench/probe.py P.l2 --shape 1x4096x4096 --define MACRO=1   # and built with -DMACRO=1 (e.g. L2GEN_TRACE)
    ncu --clock-control none --metrics gpu__time_duration.sum -k regex:gemm \\
        python bench/probe.py PROGRAM.l2 --shape ... --once   # one launch per setting, for ncu

``--lib PATH:ENTRY`` times a library built elsewhere (for example from an earlier commit's
templates by ``bench/build_at.sh``, its program text read from the library itself) beside
the programs.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import subprocess
import sys
import threading

import torch

from l2gen.build import build_many
from l2gen.ir import Decomposition, Knobs
from l2gen.lower import define_flags
from l2gen.parse import parse, parse_file
from l2gen.runtime import Library
from l2gen.runner import source
from l2gen.targets import GPUS


class ClockLog:
    """The SM clock and board power while each setting's back-to-back block runs: nvidia-smi
    samples them every ``ms`` milliseconds, each sample filed under the setting running then
    (the first 20% of a block left out: the clock settles). Nothing if nvidia-smi is missing."""

    def __init__(self, ms: int = 50):
        self.current: str | None = None
        self.samples: dict[str, list[list[tuple[float, float]]]] = {}
        try:
            self.proc = subprocess.Popen(["nvidia-smi", "-i", str(torch.cuda.current_device()),
                                          "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                                          "-lms", str(ms)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            self.proc = None
            return
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            label = self.current
            try:
                mhz, watts = (float(x) for x in line.split(","))
            except ValueError:
                continue
            if label is not None:
                self.samples[label][-1].append((mhz, watts))

    def start(self, label: str):
        self.samples.setdefault(label, []).append([])
        self.current = label

    def stop(self):
        self.current = None

    def summary(self, label: str) -> str:
        kept = [s for block in self.samples.get(label, []) for s in block[len(block) // 5:]]
        if not kept:
            return ""
        return (f"  {statistics.median(m for m, _ in kept):5.0f} MHz {statistics.median(w for _, w in kept):4.0f} W"
                f" ({len(kept)} samples)")

    def close(self):
        if self.proc is not None:
            self.proc.terminate()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("programs", nargs="*")
    ap.add_argument("--lib", action="append", default=[], metavar="PATH:ENTRY", help="a built library to time too")
    ap.add_argument("--define", action="append", default=[], metavar="MACRO[=VALUE]",
                    help="also time each program built with -DMACRO (repeatable; A=1+B=1 defines both)")
    ap.add_argument("--shape", required=True)
    ap.add_argument("--splits", default="1")
    ap.add_argument("--decompositions", default="heuristic", help="comma-separated, e.g. heuristic,data_parallel")
    ap.add_argument("--grids", default="0", help="comma-separated caps on a persistent launch's CTAs (the knob grid; 0: none)")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--once", action="store_true", help="one launch per setting (for ncu)")
    ap.add_argument("--sustained", type=int, default=0, metavar="CALLS",
                    help="also time CALLS calls back to back per setting, in --reps rotated blocks: the per-call time "
                         "under sustained load (clocks and power as a loop of large GEMMs leaves them), with the "
                         "median SM clock and board power nvidia-smi sampled during each setting's blocks; on one "
                         "set of buffers, so operands that fit in the L2 stay there between calls (l2gen bench "
                         "--sustained rotates copies that exceed it)")
    ap.add_argument("--no-verify", action="store_true",
                    help="time settings whose result is wrong too (builds that skip work on purpose)")
    args = ap.parse_args()
    m, n, k = (int(x) for x in args.shape.lower().split("x"))
    programs = [parse_file(p) for p in args.programs]
    # Each program as written, then once per --define (A=1+B=1: both macros): (label, program, extra nvcc flags).
    variants = [(p.name, p, ()) for p in programs]
    variants += [(f"{p.name} -D{d}", p, define_flags(d)) for d in args.define for p in programs]
    sources = [source(p, GPUS["h200"]) for _, p, _ in variants]
    sources = [s.with_flags(*flags) for s, (_, _, flags) in zip(sources, variants)]
    results = build_many(sources)
    for r in results:
        if not r.ok:
            print(r.error, file=sys.stderr)
            return 1
    libraries = [(label, p, Library.load(r.library, r.source.entry)) for (label, p, _), r in zip(variants, results)]
    for spec in args.lib:
        path, entry = spec.rsplit(":", 1)
        lib = Library.load(path, entry)
        program = parse(lib.program_text())
        libraries.append((f"{program.name} ({path})", program, lib))
    flush = torch.empty(256 * 2**20 // 4, dtype=torch.float32, device="cuda")
    stream = torch.cuda.current_stream()

    # (label, launch) for every setting that verifies
    settings = []
    a = torch.randn(m, k, dtype=torch.float16, device="cuda")
    b_kn = torch.randn(k, n, dtype=torch.float16, device="cuda")
    b_nk = torch.randn(n, k, dtype=torch.float16, device="cuda")
    settings.append(("torch.matmul (kn)", lambda: torch.matmul(a, b_kn)))
    settings.append(("torch linear (nk)", lambda: torch.nn.functional.linear(a, b_nk)))
    settings.append(("launch floor (empty zero_)", lambda: torch.empty(0, device="cuda").zero_()))
    c_floor = torch.empty(m, n, dtype=torch.float16, device="cuda")
    settings.append(("C write floor (fill_ of an M x N fp16)", lambda: c_floor.fill_(1.0)))
    for name, program, lib in libraries:
        nk = program.b_layout.value == "nk"
        b = torch.randn((n, k) if nk else (k, n), dtype=torch.float16, device="cuda")
        c = torch.empty(m, n, dtype=torch.float16, device="cuda")
        ref = a.float() @ (b.float().t() if nk else b.float())
        for s, d, g in itertools.product((int(x) for x in args.splits.split(",")),
                                         [Decomposition(x) for x in args.decompositions.split(",")],
                                         [int(x) for x in args.grids.split(",")]):
            knobs = Knobs(splits=s, decomposition=d, grid=g)
            ws_bytes = lib.workspace_size(m, n, k, knobs)
            ws = torch.zeros(max(ws_bytes, 16), dtype=torch.uint8, device="cuda")  # zeroed once

            def launch(lib=lib, b=b, c=c, knobs=knobs, ws=ws, ws_bytes=ws_bytes, nk=nk):
                lib.launch(a, b, c, m, n, k, k, k if nk else n, n, knobs, ws if ws_bytes else None, ws_bytes,
                           stream.cuda_stream)

            label = f"{name} splits {s} {d.value}" + (f" grid {g}" if g else "")
            try:
                c.fill_(float("nan"))
                launch()
                torch.cuda.synchronize()
            except Exception as e:  # a knob the binary refuses
                print(f"{label}: {e}")
                continue
            err = float((c.float() - ref).norm() / ref.norm())
            print(f"{label}: relerr {err:.1e}")
            if err <= 1e-3 or args.no_verify:
                settings.append((label, launch))
    if args.once:  # the programs ran once each above (verified); now the torch calls
        for label, launch in settings[:2]:
            flush.sum()
            launch()
        torch.cuda.synchronize()
        return 0

    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    warm = {label: [] for label, _ in settings}
    cold = {label: [] for label, _ in settings}
    for rep in range(args.reps):
        for i in range(len(settings)):
            label, launch = settings[(i + rep) % len(settings)]  # rotated: no setting always first
            for flushed, out in ((True, cold), (False, warm)):  # warm: right after its own cold run
                if flushed:
                    flush.sum()  # a read pass: L2 left holding clean lines of other data
                ev[0].record()
                launch()
                ev[1].record()
                torch.cuda.synchronize()
                out[label].append(ev[0].elapsed_time(ev[1]) * 1e3)
    sustained = {label: [] for label, _ in settings}
    clocks = ClockLog() if args.sustained > 0 else None
    for rep in range(args.reps if args.sustained > 0 else 0):
        for i in range(len(settings)):
            label, launch = settings[(i + rep) % len(settings)]
            torch.cuda.synchronize()
            clocks.start(label)
            ev[0].record()
            for _ in range(args.sustained):
                launch()
            ev[1].record()
            torch.cuda.synchronize()
            clocks.stop()
            sustained[label].append(ev[0].elapsed_time(ev[1]) * 1e3 / args.sustained)
    if clocks is not None:
        clocks.close()
    for label, _ in settings:
        line = f"{label:60s}  warm {statistics.median(warm[label]):7.2f} us  cold {statistics.median(cold[label]):7.2f} us"
        if sustained[label]:
            line += f"  sustained {statistics.median(sustained[label]):7.2f} us ({args.sustained} back to back)"
            line += clocks.summary(label)
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
