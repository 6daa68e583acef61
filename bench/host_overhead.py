"""Host time that l2gen.matmul adds to torch.matmul, per call, on tiny operands.

With 8 x 8 operands the kernels cost next to nothing, so calls back to back measure what
the host spends per call. On a CPU (no GPU needed) this isolates the dispatcher's Python
path; `l2gen bench-dispatch` measures the whole thing on a GPU.

    python bench/host_overhead.py [--device cpu|cuda] [--db PATH | --winner | --served] [--no-out] [--direct]

``--winner`` times the path a database with winners takes for a shape it does not serve
(the 8 x 8 x 8 calls): it builds a throwaway H200 database whose one winner is 64x256x512,
so it works on a CPU too.

``--served`` times calls that an l2gen kernel serves, on fresh tensors every call: a
throwaway database whose one winner is the timed shape (``--shape``, default 8x8x8), and
operands (and outputs) cycled through ``--pool`` distinct tensors, so that no call has the
addresses of the one before it. With ``--device cuda`` the winner is a CUTLASS sm90a program
(``--program FILE``, default a 128x128x64 tile; a program with ``b nk`` is called as
``a @ w.t()``, B stored N x K) built with nvcc and launched for real: the
row ``l2gen.matmul`` less ``torch.matmul`` is the host time the whole served path (Python,
ctypes and the library's C++ launch) adds. With ``--device cpu`` the library is a stub
compiled with the C compiler (``cc``) that exports the entry ABI and returns at once, and
the operands are CPU tensors: the rows then measure the Python and ctypes work per call
(``torch.matmul`` on a CPU is no reference for a GPU's: read the ``Dispatcher`` and
``l2gen.matmul`` rows, and compare them between commits).

Each row's "+" is the median over rounds of its time less torch.matmul's in the same round
(calls interleaved), which a noisy machine moves less.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

import l2gen
from l2gen import dispatch
from l2gen.dispatch import TorchLauncher, use_db


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


# ---- --served ---------------------------------------------------------------------------

_STUB = r"""
#include <stddef.h>
int {entry}(const void* A, const void* B, void* C, int M, int N, int K, int lda, int ldb,
            int ldc, int raster, int swizzle, int splits, int decomposition, int grid,
            void* workspace, size_t workspace_bytes, void* stream) {{ return 0; }}
size_t {entry}_workspace(int M, int N, int K, int raster, int swizzle, int splits,
                         int decomposition, int grid) {{ return 0; }}
const char* {entry}_program(void) {{ return "stub"; }}
int {entry}_abi(void) {{ return {abi}; }}
"""


class StubLauncher(TorchLauncher):
    """The real launcher for CPU tensors, over a stub library: the entry ABI compiled with
    the C compiler, returning L2GEN_OK at once (it writes nothing). What it times is the
    launcher's Python and ctypes work; the stream is 0, as CPU tensors have none."""

    def __init__(self, folder: Path):
        super().__init__()
        self.folder = folder

    def load(self, program, gpu):
        from l2gen.runtime import ABI_VERSION, Library

        entry = "l2gen_stub"
        source = self.folder / "stub.c"
        library = self.folder / "stub.so"
        source.write_text(_STUB.format(entry=entry, abi=ABI_VERSION))
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", str(source), "-o", str(library)], check=True)
        return Library.load(library, entry)

    def stream(self, like) -> int:
        return 0

    def capturing(self) -> bool:
        return False

    def eligible(self, a, b, out) -> bool:
        f16 = torch.float16
        ok = a.dtype is f16 and b.dtype is f16 and a.dim() >= 2 and b.dim() == 2
        ok = ok and a.is_contiguous() and b.is_contiguous() and a.data_ptr() % 16 == 0 and b.data_ptr() % 16 == 0
        return bool(ok and (out is None or (out.dtype is f16 and out.is_contiguous())))


def served_dispatchers(folder: Path, device: str, m: int, n: int, k: int, program_file: str | None, timed):
    """Dispatchers of both B layouts over a database whose one winner (each layout) is the
    timed shape, made the defaults of l2gen.matmul and of the torch op; returns the one of
    the ``timed`` layout."""
    from l2gen.db import KernelDB
    from l2gen.ir import BLayout, Family
    from l2gen.parse import parse
    from l2gen.problem import Measurement, Shape
    from l2gen.space import assemble
    from l2gen.targets import GPUS

    gpu = dispatch.detect_gpu() if device == "cuda" else GPUS["h200"]
    if gpu is None:
        raise SystemExit("--served --device cuda: no l2gen target record for this GPU")
    db = KernelDB(folder / "served.db")
    env = dispatch.own_toolchain()
    programs = []
    for layout in BLayout:
        if program_file:
            program = parse(Path(program_file).read_text(), program_file)
            if program.b_layout is not layout:
                continue
        else:
            program = assemble(Family.SM90, {"bm": 128, "bn": 128, "bk": 64}, b_layout=layout)
        db.add(Measurement(Shape(m, n, k), program, "ok", time_us=8.0, baseline_us=10.0), gpu, "test", env)
        programs.append(program)
    if device == "cuda":  # both layouts' programs built at once, before anything is timed
        from l2gen.build import build_many
        from l2gen.runner import source

        failed = [r.error for r in build_many([source(p, gpu) for p in programs]) if not r.ok]
        if failed:
            raise SystemExit(f"--served: the winner does not build: {failed[0]}")
    launcher = TorchLauncher() if device == "cuda" else StubLauncher(folder)
    if device != "cuda":
        from l2gen import torch_ops

        torch_ops.SERVED_DEVICES = frozenset({"cuda", device})  # the op serves the CPU tensors too
    made = {}
    for layout in BLayout:
        # The stub writes nothing, so on a CPU the first result is not checked.
        d = dispatch.Dispatcher(db, gpu, launcher=launcher, verify=device == "cuda", b_layout=layout)
        dispatch._set_default(d)
        made[layout] = d
    return made[timed]


def _layout(program_file: str | None):
    """The B layout the timed calls use: the winner's (``--program``), else K x N."""
    from l2gen.ir import BLayout
    from l2gen.parse import parse

    return parse(Path(program_file).read_text(), program_file).b_layout if program_file else BLayout.KN


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--db", default=None, help="kernel database (default: none, every call falls back)")
    parser.add_argument("--winner", action="store_true", help="a throwaway H200 database with a winner for another shape")
    parser.add_argument("--served", action="store_true", help="a winner for the timed shape: served calls on fresh tensors")
    parser.add_argument("--shape", default="8x8x8", help="MxNxK of the timed calls (with --served)")
    parser.add_argument("--program", default=None, help="the winner's DSL file (with --served --device cuda)")
    parser.add_argument("--pool", type=int, default=16, help="distinct operand tensors cycled through (with --served)")
    parser.add_argument("--no-out", action="store_true", help="call without out=")
    parser.add_argument("--direct", action="store_true",
                        help="served calls pass all 17 entry arguments through ctypes, as where the bound-call "
                             "helper (l2gen.bound) cannot be built: the baseline the helper is measured against")
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--calls", type=int, default=None,
                        help="calls per round (default 5000; 200 with --served --device cuda, so that the launch "
                             "queue never fills and the time is the host's, not the kernel's)")
    args = parser.parse_args()
    if args.winner + args.served + (args.db is not None) > 1:
        parser.error("--db, --winner and --served are exclusive")
    if args.direct:
        from l2gen import bound

        bound.caller = lambda: None
    m, n, k = (int(v) for v in args.shape.lower().split("x")) if args.served else (8, 8, 8)
    dtype = torch.float16 if args.device == "cuda" or args.served else torch.float32
    pool = max(1, args.pool) if args.served else 1
    # B as the winner stores it: K x N, or N x K called as w.t() (an nn.Linear weight)
    layout = _layout(args.program if args.served else None)
    nk = layout.value == "nk"

    def weight():
        if nk:
            return torch.randn(n, k, device=args.device, dtype=dtype).t()
        return torch.randn(k, n, device=args.device, dtype=dtype)

    operands = [
        (torch.randn(m, k, device=args.device, dtype=dtype), weight(), torch.empty(m, n, device=args.device, dtype=dtype))
        for _ in range(pool)
    ]
    tmp = tempfile.TemporaryDirectory()
    # l2gen.matmul's default from here on
    if args.served:
        dispatcher = served_dispatchers(Path(tmp.name), args.device, m, n, k, args.program, layout)
    elif args.winner:
        dispatcher = winner_dispatcher(Path(tmp.name))
    else:
        dispatcher = use_db(args.db)
    from l2gen import torch_ops

    # Each call takes the next (a, b, out) of the pool; the cycling costs every row alike.
    nxt = itertools.cycle(operands).__next__
    # The N x K dispatcher takes the weight as stored; l2gen.matmul and the op take w.t().
    if nk:
        stored = itertools.cycle([(a, b.t(), c) for a, b, c in operands]).__next__
    else:
        stored = nxt
    # What a user calls: l2gen.matmul serves B stored K x N only; an N x K weight is served
    # through the op's linear, the path a patched nn.Linear takes.
    user, user_fn, user_args = ("torch_ops.linear", torch_ops.linear, stored) if nk else ("l2gen.matmul", l2gen.matmul, nxt)
    if args.no_out:
        calls = {
            "torch.matmul": lambda: torch.matmul(*nxt()[:2]),
            "Dispatcher": lambda: dispatcher(*stored()[:2]),
            user: lambda: user_fn(*user_args()[:2]),
        }
        if args.served:
            calls["torch_ops.mm"] = lambda: torch_ops.mm(*nxt()[:2])
    else:
        calls = {
            "torch.matmul": lambda: torch.matmul(*(t := nxt())[:2], out=t[2]),
            "Dispatcher": lambda: dispatcher(*(t := stored())[:2], out=t[2]),
            user: lambda: user_fn(*(t := user_args())[:2], out=t[2]),
        }
        if args.served:
            calls["torch_ops.mm"] = lambda: torch_ops.mm(*(t := nxt())[:2], out=t[2])
    for fn in calls.values():
        fn()
    if args.served:
        served = dispatcher.served_by(m, n, k)
        if served in ("fallback", "unprepared"):
            raise SystemExit(f"--served: {m}x{n}x{k} is not served by the winner ({served}): see the log above")
        print(f"{m}x{n}x{k} served by {served} on {args.device}, {pool} operand sets cycled")
    calls_per_round = args.calls or (200 if args.served and args.device == "cuda" else 5000)
    times = {name: [] for name in calls}
    for _ in range(args.rounds):
        for name, fn in calls.items():
            if args.device == "cuda":
                torch.cuda.synchronize()
            times[name].append(per_call_us(fn, calls_per_round))
    # What a call adds: the median over rounds of its time less torch.matmul's in the same
    # round, which a load that comes and goes during the run moves less than either time.
    base = times["torch.matmul"]
    added = {}
    for name, values in times.items():
        added[name] = statistics.median(t - b for t, b in zip(values, base))
        print(f"{name:>16}: {statistics.median(values):6.3f} us per call (+{added[name]:.3f})")
    if args.served:
        print(f"{user} on fresh tensors, served on {args.device}: {added[user]:+.3f} us per call "
              f"over torch.matmul ({calls_per_round} calls x {args.rounds} rounds)")


if __name__ == "__main__":
    main()
