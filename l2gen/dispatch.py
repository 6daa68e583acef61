"""Dispatch: serve ``C = A @ B`` with the best tuned kernel for the shape, else cuBLAS.

A dispatcher serves one layout of B (``b_layout``): ``kn``, B stored K x N (``a @ b``,
what ``l2gen.matmul`` serves), or ``nk``, B stored N x K (``a @ w.T``, an ``nn.Linear``
weight, launched with ldb = K: no copy), from the programs built for that layout.
For a call with shape (M, N, K) the dispatcher looks up, once per shape, the best
program of its layout the kernel database holds for the exact shape on this GPU; failing that, one
tuned for a *nearby* shape (same bucket of rounded log2 sizes; every program serves any
M, and N and K multiples of 8); failing that, or where the program measured no faster
than cuBLAS-best nor than ``torch.matmul`` itself, it calls ``torch.matmul``. Libraries are built and loaded once per program, workspaces allocated
once per (shape, stream) (a split-K kernel's workspace must not be shared by calls in
flight at once), so the per-call cost is a dict lookup, a few checks and the launch on
torch's current stream (no sync and no allocation: safe inside CUDA graph capture; a
stream first seen while capturing gets a workspace of its own for that call, from the
graph's pool). Only rows measured on this GPU, under the trusted protocol and with this
process's toolchain (nvcc version) are served; simulated rows never are, nor rows that
record another card than this GPU's (a tune for the H200 run on a lent H100). A call whose B has a shape that
no M is served for goes to ``torch.matmul`` after one set lookup, without reading A's shape.

The database is read when a dispatcher is made: if nothing in it beats cuBLAS-best or
``torch.matmul`` on this GPU by more than ``MIN_SPEEDUP`` in every run, every call goes
straight to ``torch.matmul`` after one attribute test.

A dispatcher trusts winners timed under one L2 protocol (:mod:`l2gen.protocol`): ``l2=``,
else ``$L2GEN_TRUST_L2``, else ``clean``, the protocol that times a kernel as a model runs
it. A database timed under another protocol (the shipped one was timed after the written
flush: ``dirty``) serves nothing, whatever its speedups say.

It never returns a wrong result knowingly: if building, loading or launching fails, or
the first result of a shape disagrees with cuBLAS, it logs once and serves that shape
with ``torch.matmul`` from then on.

The GPU-touching part is a small :class:`Launcher`; :class:`TorchLauncher` is the real
one, and tests inject a fake that runs on the CPU.
"""

from __future__ import annotations

import importlib.resources
import logging
import math
import os
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Protocol

from .db import DatabaseError, KernelDB
from .ir import BLayout, Family, Knobs, Program
from .protocol import DEFAULT_L2, L2_PROTOCOLS
from .problem import Shape, program_key, unserved
from .space import cap_grid
from .targets import Gpu, gpu_of_card

log = logging.getLogger("l2gen.dispatch")

# An exact-shape program must have beaten cuBLAS-best, or the fallback it replaces
# (torch.matmul, timed in the same runs), by more than a re-measurement moves it in every
# run (bench/results/ holds the shipped database's re-measures). A tie is not worth
# serving: any winner makes every unserved call pay the lookup on the host, and a win of a
# fraction of a percent cannot repay that. (cuBLAS-best is the bar for a claim that l2gen
# beats cuBLAS; the fallback is the bar for what a user's call gains: torch.matmul does not
# run cuBLASLt's auto-tuned algorithm.)
MIN_SPEEDUP = 1.02
MIN_SPEEDUP_NEARBY = 1.05  # a program tuned for another shape must have beaten it clearly
MAX_RELERR = 1e-3  # the first result per shape is checked against the fallback
PDL_ENV = "L2GEN_PDL"  # 1: dispatchers launch l2gen's own kernel with programmatic dependent launch
GRID_ENV = "L2GEN_GRID"  # N: dispatchers keep every served launch to at most N CTAs (the knob grid)
TRUST_ENV = "L2GEN_TRUST_L2"  # the L2 protocol whose winners a dispatcher serves, if l2= is not given


def own_toolchain() -> dict:
    """What a served row must record of its toolchain: the version of the nvcc this
    process builds with (``"none"`` without one, which no row records)."""
    from .toolchain import found_nvcc_version

    return {"nvcc": found_nvcc_version() or "none"}


def trusted_l2(l2: str | None = None) -> str:
    """The L2 protocol a dispatcher serves winners of: ``l2``, else ``$L2GEN_TRUST_L2``,
    else :data:`~l2gen.protocol.DEFAULT_L2` (an unknown value is logged and ignored)."""
    if l2 is not None:
        if l2 not in L2_PROTOCOLS:
            raise ValueError(f"unknown L2 protocol {l2!r} (known: {', '.join(L2_PROTOCOLS)})")
        return l2
    env = os.environ.get(TRUST_ENV)
    if env and env not in L2_PROTOCOLS:
        log.warning("l2gen: %s=%r is not an L2 protocol (%s); trusting %s", TRUST_ENV, env, ", ".join(L2_PROTOCOLS), DEFAULT_L2)
        env = None
    return env or DEFAULT_L2


class Launcher(Protocol):
    """Everything the dispatcher does to a device, behind one small interface."""

    def load(self, program: Program, gpu: Gpu) -> Any:
        """Build (or fetch from the build cache) and load the library for ``program``'s
        compile-time configuration; raise on failure. Knobs are passed at launch."""

    def workspace(self, kernel: Any, m: int, n: int, k: int, knobs: Knobs, like: Any) -> Any:
        """Allocate the workspace a launch with these knobs needs (None if none), zeroed,
        on the current stream."""

    def stream(self, like: Any) -> Any:
        """A key for the current stream (a workspace serves calls on one stream only)."""

    def eligible(self, a: Any, b: Any, out: Any) -> bool:
        """Whether the operands are what the kernels take (fp16, row-major, contiguous,
        16-byte aligned, one device). The dispatcher has checked their shapes: B 2-D, A
        and the output of 2 or more dimensions, whose leading ones are the rows."""

    def empty(self, like: Any, m: int, n: int) -> Any:
        """An uninitialized output like A (``like``): A's leading dimensions (M rows in
        all) by N."""

    def launch(self, kernel: Any, a: Any, b: Any, out: Any, m: int, n: int, k: int, ldb: int, knobs: Knobs, workspace: Any) -> int:
        """Enqueue the kernel on the current stream; return its status code (0 = ok).
        ``ldb``: B's leading dimension, N for B stored K x N and K for B stored N x K
        (A's is K and C's N)."""

    # Optional: bind(kernel, m, n, k, ldb, knobs) -> run(a, b, out, workspace, stream) -> int,
    # the launch of one shape with what does not change between its calls converted once
    # (``stream``: what stream() returned for the call). A launcher without it is called
    # through launch() (see bound_launch).

    def capturing(self) -> bool:
        """Whether the current stream is capturing a CUDA graph (no checks then)."""

    def relerr(self, out: Any, ref: Any) -> float:
        """||out - ref|| / ||ref||."""


@dataclass(frozen=True)
class Plan:
    """What serves one shape: a program (its knobs are the launch's) and why."""

    program: Program
    speedup: float  # measured over cuBLAS-best, on the shape it was tuned for
    tuned_for: Shape
    exact: bool
    over_fallback: float | None = None  # over torch.matmul (the fallback), same runs; None: not timed


@dataclass
class _Ready:
    """A shape's kernel, and its workspaces: one per stream, because a split-K kernel's
    workspace must not be shared by calls in flight at once (templates/common.cuh.j2);
    calls on one stream run one after another, so they share one."""

    kernel: Any
    knobs: Knobs
    workspaces: dict
    plan: Plan
    m: int = 0
    n: int = 0
    k: int = 0
    verified: bool = False
    run: Callable | None = None  # run(a, b, out, workspace, stream) -> status: see bound_launch


_FALLBACK = object()  # a shape served by the fallback for good
FALLBACK = _FALLBACK  # what Dispatcher.hot returns for such a shape

# How many (A shape, B shape) pairs a dispatcher's hot table holds before it starts over
# (a server whose token counts vary makes many; each is remade on its next call).
HOT_ENTRIES = 4096


def bucket(shape: Shape) -> tuple[int, int, int]:
    """Shapes in one bucket (rounded log2 of each size) count as nearby."""
    return tuple(round(math.log2(v)) for v in (shape.m, shape.n, shape.k))


def _distance(a: Shape, b: Shape) -> float:
    return sum(abs(math.log2(x / y)) for x, y in ((a.m, b.m), (a.n, b.n), (a.k, b.k)))


def bound_launch(launcher: Launcher, kernel: Any, m: int, n: int, k: int, ldb: int, knobs: Knobs) -> Callable:
    """``run(a, b, out, workspace, stream) -> status``: the launch of ``kernel`` on one shape,
    made once per shape. The launcher's own ``bind`` where it has one (the real launcher
    converts the call's constant arguments once there), else a call of its ``launch``."""
    bind = getattr(launcher, "bind", None)
    if bind is not None:
        return bind(kernel, m, n, k, ldb, knobs)

    def run(a, b, out, workspace, stream):
        return launcher.launch(kernel, a, b, out, m, n, k, ldb, knobs, workspace)

    return run


class Dispatcher:
    """A GEMM entry point over a kernel database (see the module docstring).

    ``db``: a :class:`KernelDB`, a path, or None (always the fallback). ``gpu``: the
    device's record (None: always the fallback). ``b_layout``: how B is stored, and so
    which programs serve (:class:`~l2gen.ir.BLayout`; default K x N). ``fallback(a, b,
    out=None)``: the reference GEMM for that layout (default ``torch.matmul``, and for
    B stored N x K ``torch.matmul(a, b.mT)``). ``verify``: check each shape's first
    result against the fallback (skipped while a CUDA graph is being captured). ``l2``:
    the L2 protocol whose winners it serves (:func:`trusted_l2`). ``toolchain``: the
    environment a row must record to be served (default :func:`own_toolchain`: this
    process's nvcc); simulated rows are never served. ``pdl``: launch the programs of
    l2gen's own sm90a kernel with programmatic dependent launch (their knob ``pdl on``:
    each call's set-up overlaps the end of the kernel before it on the stream; it shows
    under CUDA graphs and on a busy stream, and changes no result); default
    ``$L2GEN_PDL`` = 1, else off. ``grid``: keep every served kernel to at most that many
    CTAs, hence SMs (the knob ``grid``, whole clusters), leaving the rest to other streams;
    a shape whose program cannot keep to it (one that launches a CTA per tile) goes to the
    fallback, which does not keep to it either (default ``$L2GEN_GRID``, else 0: no cap).

    Safe to call from several threads and on several streams at once: a shape's plan and
    library are made once (under a lock), and each stream gets its own workspace.
    """

    def __init__(
        self,
        db: KernelDB | str | Path | None,
        gpu: Gpu | None,
        *,
        launcher: Launcher | None = None,
        fallback: Callable | None = None,
        verify: bool = True,
        nearby: bool = True,
        l2: str | None = None,
        toolchain: dict | None = None,
        b_layout: BLayout = BLayout.KN,
        pdl: bool | None = None,
        grid: int | None = None,
    ):
        self.gpu = gpu
        self.pdl = os.environ.get(PDL_ENV, "0") == "1" if pdl is None else bool(pdl)
        self.grid = _grid_setting(grid)
        self.b_layout = BLayout(b_layout)
        self._nk = self.b_layout is BLayout.NK
        self.l2 = trusted_l2(l2)
        # The environment a row must have been measured in to be served (besides this GPU
        # and protocol): measured, not simulated, with this process's nvcc.
        self.toolchain = own_toolchain() if toolchain is None else dict(toolchain)
        self.verify = verify
        self.nearby = nearby
        self._fallback = fallback or (_torch_matmul_nt() if self._nk else _torch_matmul())
        self._launcher = launcher
        self._shapes: dict[tuple[int, int, int], Any] = {}
        self._kernels: dict[str, Any] = {}  # program key (knobs stripped) -> loaded kernel
        self._buckets: dict | None = None
        self._lock = threading.RLock()  # _prepare holds it while _ready makes the first workspace
        self.db: KernelDB | None = None
        if db is not None and gpu is not None:
            try:
                self.db = db if isinstance(db, KernelDB) else KernelDB(db, readonly=True)
                if not self.db.check_gpu(gpu, strict=False):
                    self.db = None  # check_gpu warned: recorded on another GPU
            except DatabaseError as exc:
                log.warning("l2gen: %s; every shape will use the fallback", exc)
                self.db = None
        # Each shape's best (program, speedup, time_us), read once: it decides whether the
        # dispatcher serves anything at all, and the nearby lookup indexes it.
        self._recorded: dict[Shape, tuple] = {}
        # And each best's speedup over the fallback itself (torch.matmul, timed in the same
        # runs), where its rows recorded it: what a call served by it gains over the call it
        # replaces. A shape is served where either speedup clears MIN_SPEEDUP.
        self._over_fallback: dict[Shape, float] = {}
        if self.db is not None:
            try:
                self._recorded = self._trusted_best(gpu)
                if self._recorded:
                    fallback = self.db.fallback_speedups(gpu, l2=self.l2, env=self.toolchain)
                    self._over_fallback = {s: fallback[(s, program_key(p))] for s, (p, _, _) in self._recorded.items()
                                           if (s, program_key(p)) in fallback}
            except DatabaseError as exc:
                log.warning("l2gen: %s; every shape will use the fallback", exc)
        # What plan() can serve, by B's shape alone (see _serves_some_m): the (K, N) of every
        # exact-shape winner, and the rounded log2 sizes (N, K) of every nearby candidate.
        self._winner_kn = {(s.k, s.n) for s, (_, sp, _) in self._recorded.items() if self._wins(s, sp)}
        self._nearby_nk = {bucket(s)[1:] for s, (_, sp, _) in self._recorded.items() if sp > MIN_SPEEDUP_NEARBY}
        # B shapes found to serve no M, as B is stored ((K, N), or (N, K) for nk): call()
        # sends them to the fallback on B's shape alone. Filled as shapes are first called;
        # like ``_shapes`` it holds for the database read here and the ``nearby`` setting
        # of those calls.
        self._unserved_b: set[tuple[int, int]] = set()
        # What the torch op's eager path looks up first (:meth:`hot`): operand shapes as
        # torch gives them (A's, B's as stored) -> the shape's verified _Ready, or _FALLBACK
        # where the shapes alone send it to the fallback. Filled by _serve.
        self._hot: dict = {}
        # Nothing plan() could serve, exactly or nearby: every call goes straight to the fallback.
        self._idle = not (self._winner_kn or self._nearby_nk)
        # What ``l2gen.matmul`` calls when this is its default dispatcher: the fallback
        # itself when idle (no frame of ours between the caller and torch.matmul), else self.
        self.entry: Callable = self._fallback if self._idle else self.call

    def _trusted_best(self, gpu: Gpu) -> dict:
        """The database's bests under the trusted protocol; none from a database of another
        (said once: a warning if that is what keeps its winners from being served)."""
        timed = self.db.l2
        if self.db.evidence == "simulated":
            log.warning("l2gen: %s holds simulated rows (tune --simulate): it serves none of them", self.db.path)
            return {}
        if timed is None or timed == self.l2:
            return self.db.best_all(gpu, b_layout=self.b_layout, l2=self.l2, env=self.toolchain)
        winners = sum(sp > MIN_SPEEDUP for _, sp, _ in self.db.best_all(gpu, b_layout=self.b_layout, l2=timed).values())
        say = log.warning if winners else log.info
        say("l2gen: %s was timed with l2=%s and this dispatcher trusts l2=%s: it serves none of its %d winners "
            "(set %s=%s to serve them)", self.db.path, timed, self.l2, winners, TRUST_ENV, timed)
        return {}

    @property
    def launcher(self) -> Launcher:
        if self._launcher is None:
            self._launcher = TorchLauncher()
        return self._launcher

    # -- lookup --------------------------------------------------------------------------

    def recorded(self, m: int, n: int, k: int) -> tuple[Program, float] | None:
        """The program the database judges best on this very shape, served or not, and its
        speedup over cuBLAS-best (its least favourable run): what :meth:`plan` starts from."""
        found = self._recorded.get(Shape(m, n, k))
        return None if found is None else (found[0], found[1])

    def plan(self, m: int, n: int, k: int) -> Plan | None:
        """The program that would serve a shape, or None for the fallback."""
        shape = Shape(m, n, k)
        if self.db is None or unserved(shape):
            return None
        found = self._recorded.get(shape)
        if found is not None:  # measured on this very shape: trust it either way
            program, speedup, _ = found
            if not self._wins(shape, speedup):
                return None
            return Plan(program, speedup, shape, True, self._over_fallback.get(shape))
        if not self.nearby:
            return None
        candidates = self._bucket_index().get(bucket(shape), [])
        usable = [(_distance(shape, s), -sp, s, p, sp) for s, p, sp in candidates if sp > MIN_SPEEDUP_NEARBY]
        if not usable:
            return None
        _, _, tuned, program, speedup = min(usable, key=lambda t: t[:2])
        return Plan(program, speedup, tuned, False)

    def _wins(self, shape: Shape, speedup: float) -> bool:
        """Whether a shape's own best serves it: it beat cuBLAS-best, or the fallback it
        replaces, by more than MIN_SPEEDUP in every run."""
        return speedup > MIN_SPEEDUP or self._over_fallback.get(shape, 0.0) > MIN_SPEEDUP

    def _serves_some_m(self, k: int, n: int) -> bool:
        """Whether ``plan(m, n, k)`` can return a program for some M. It ignores M, so it may
        say yes for a (K, N) that no M turns out to be served for, but never no for one
        that is: plan() takes an exact-shape winner (its K and N are in ``_winner_kn``) or
        a nearby candidate from the bucket of (M, N, K), whose N and K parts are in
        ``_nearby_nk``; both only for N and K that :func:`unserved` allows."""
        if unserved(Shape(1, n, k)):  # M = 1: the rule on N and K alone
            return False
        if (k, n) in self._winner_kn:
            return True
        return self.nearby and bucket(Shape(1, n, k))[1:] in self._nearby_nk

    def _bucket_index(self) -> dict:
        if self._buckets is None:
            index: dict = {}
            for s, (program, speedup, _) in self._recorded.items():
                index.setdefault(bucket(s), []).append((s, program, speedup))
            self._buckets = index
        return self._buckets

    # -- calls ---------------------------------------------------------------------------

    def __call__(self, a, b, out=None):
        """C = A @ B for row-major fp16 A (M x K) and B (K x N; for ``b_layout`` nk, C = A
        @ B.T for B stored N x K); writes ``out`` if given."""
        return self.call(a, b, out)

    def call(self, a, b, out=None):
        """What ``__call__`` does; ``l2gen.matmul`` calls this bound method directly (a
        call through ``__call__`` costs more in CPython)."""
        # The paths are kept short: a caller whose kernels take a few microseconds is bound
        # by the host, and every step here adds to its time. A database with nothing that
        # beats cuBLAS on this GPU costs one attribute test per call.
        # Fallback calls pass ``out=`` only when given: torch.matmul(a, b, out=None) costs
        # more host time than torch.matmul(a, b).
        if self._idle:
            return self._fallback(a, b) if out is None else self._fallback(a, b, out=out)
        # Most calls that are not served have a B shape that no M is served for: reject
        # them on B's shape alone (a torch.Size hashes like a tuple), before reading A's
        # shape, which costs as much again. A wrong K then gets the fallback's error.
        shape_b = b.shape
        if shape_b not in self._unserved_b:
            c = self._serve(a, b, shape_b, out)
            if c is not None:
                return c
        return self._fallback(a, b) if out is None else self._fallback(a, b, out=out)

    def serve(self, a, b, out=None):
        """What :meth:`call` returns where a program serves the call; None where it would
        call the fallback, which the caller then computes as it likes (a bias of its own
        fused into torch's call, say). Raises as :meth:`call` does on mismatched K."""
        if self._idle or b.shape in self._unserved_b:
            return None
        return self._serve(a, b, b.shape, out)

    def _serve(self, a, b, shape_b, out):
        shape_a = a.shape
        if len(shape_a) == 2:
            m, k = shape_a
            lead = None
        elif len(shape_a) > 2:  # (..., K): the leading dimensions are the rows, served without a view
            lead, k = shape_a[:-1], shape_a[-1]
            m = math.prod(lead)
        else:  # a vector or a scalar: not a matrix product's A
            return None
        try:
            if self._nk:
                n, k2 = shape_b
            else:
                k2, n = shape_b
        except ValueError:  # B not 2-D
            return None
        state = self._shapes.get((m, n, k))
        if state is _FALLBACK:
            self._remember(shape_a, shape_b, _FALLBACK)
            return None
        if k != k2:
            stored = f"{n} x {k2} (N x K)" if self._nk else f"{k2} x {n}"
            raise ValueError(f"matmul: A is {m} x {k} but B is {stored}")
        if state is None and not self._serves_some_m(k, n):  # first call of this shape
            with self._lock:
                self._unserved_b.add((n, k) if self._nk else (k, n))
            self._remember(shape_a, shape_b, _FALLBACK)
            return None
        if out is not None and out.shape != ((m, n) if lead is None else (*lead, n)):  # a torch.Size is a tuple
            return None
        launcher = self.launcher
        if not launcher.eligible(a, b, out):  # before any build: these operands never launch
            return None
        if state is None:
            state = self._prepare(m, n, k, a)
            if state is _FALLBACK:
                return None
        c = out if out is not None else launcher.empty(a, m, n)
        try:
            stream = launcher.stream(a)
            workspace = state.workspaces.get(stream)
            if workspace is None:
                workspace = self._workspace(state, launcher, a, stream)
            rc = state.run(a, b, c, workspace, stream)
        except Exception as exc:
            return self._give_up(m, n, k, f"launch raised {exc!r}")
        if rc != 0:
            return self._give_up(m, n, k, f"kernel returned status {rc}")
        if not state.verified and self.verify and not launcher.capturing():
            err = launcher.relerr(c, self._fallback(a, b))
            if not err <= MAX_RELERR:  # NaN fails too; the caller's fallback writes over c
                return self._give_up(m, n, k, f"first result disagrees with the fallback (relative error {err:.2e})")
            state.verified = True
        if state.verified or not self.verify:
            self._remember(shape_a, shape_b, state)
        return c

    def hot(self, shape_a, shape_b) -> Any:
        """For operands of these shapes (A's and B's as stored, e.g. ``torch.Size``): the
        shape's prepared state if a call served them (its first result checked), the
        ``FALLBACK`` marker if their shapes alone send them to the fallback, None if
        unknown (a call through :meth:`serve` finds out). What the torch op's eager path
        looks up before anything else; a served state still needs operands the kernel
        takes, which that path checks."""
        return self._hot.get((shape_a, shape_b))

    def _remember(self, shape_a, shape_b, state) -> None:
        hot = self._hot
        if len(hot) >= HOT_ENTRIES:
            hot.clear()
        hot[(shape_a, shape_b)] = state

    def _prepare(self, m: int, n: int, k: int, like) -> Any:
        with self._lock:
            state = self._shapes.get((m, n, k))
            if state is not None:
                return state
            plan = self.plan(m, n, k)
            state = _FALLBACK
            if plan is not None:
                try:
                    state = self._ready(plan, m, n, k, like)
                except Exception as exc:
                    log.warning("l2gen: %dx%dx%d: cannot use %s (%s); using the fallback for this shape", m, n, k, plan.program.name, exc)
            self._shapes[(m, n, k)] = state
            return state

    def _ready(self, plan: Plan, m: int, n: int, k: int, like) -> _Ready:
        from .check import check
        from .diagnostics import errors
        from .lower import build_program

        program = cap_grid(plan.program, self.grid) if self.grid else plan.program
        problems = errors(check(program, self.gpu))  # a database is text from outside: checked before lowering
        if problems:
            raise ValueError(f"the checker rejects it: {problems[0]}")
        key = program_key(build_program(program))
        kernel = self._kernels.get(key)
        if kernel is None:
            kernel = self.launcher.load(program, self.gpu)
            self._kernels[key] = kernel
        knobs = program.knobs
        if self.pdl and plan.program.family is Family.SM90_L2GEN:
            knobs = replace(knobs, pdl=True)
        run = bound_launch(self.launcher, kernel, m, n, k, k if self._nk else n, knobs)
        state = _Ready(kernel, knobs, {}, plan, m, n, k, run=run)
        self._workspace(state, self.launcher, like, self.launcher.stream(like))  # the first stream's, before the first launch
        return state

    def _workspace(self, state: _Ready, launcher: Launcher, like, stream) -> Any:
        """The workspace of ``state``'s kernel for ``stream`` (the current one): one per
        stream, made on a stream's first call (outside graph capture). While a CUDA graph is
        captured, a stream with none gets one for that call alone, from the graph's memory
        pool, so it lives as long as the graph that uses it and is never shared with another
        call."""
        ws = state.workspaces.get(stream)
        if ws is not None:
            return ws
        if launcher.capturing():
            return launcher.workspace(state.kernel, state.m, state.n, state.k, state.knobs, like)
        with self._lock:
            ws = state.workspaces.get(stream)
            if ws is None:
                ws = launcher.workspace(state.kernel, state.m, state.n, state.k, state.knobs, like)
                state.workspaces[stream] = ws
        return ws

    def _give_up(self, m: int, n: int, k: int, why: str) -> None:
        """Serve a shape with the fallback from now on, and say why (once)."""
        with self._lock:
            state = self._shapes.get((m, n, k))
            self._shapes[(m, n, k)] = _FALLBACK
            self._hot.clear()  # it may hold the state given up (remade on the next calls)
        name = state.plan.program.name if isinstance(state, _Ready) else "?"
        log.warning("l2gen: %dx%dx%d: %s: %s; using the fallback for this shape from now on", m, n, k, name, why)

    def served_by(self, m: int, n: int, k: int) -> str:
        """'fallback', 'unprepared', or the serving program's name (for logs and tests)."""
        if self._idle or ((n, k) if self._nk else (k, n)) in self._unserved_b:
            return "fallback"
        state = self._shapes.get((m, n, k))
        if state is None:
            return "unprepared"
        return "fallback" if state is _FALLBACK else state.plan.program.name




def _torch_matmul() -> Callable:
    """``torch.matmul`` itself (no wrapper: it takes ``out=None``), resolved when a
    dispatcher is made; without torch, a stand-in that says torch is needed."""
    try:
        import torch
    except ImportError:

        def missing(a, b, out=None):
            raise RuntimeError("l2gen's fallback GEMM is torch.matmul: install torch, or pass fallback=")

        return missing
    return torch.matmul


def _torch_matmul_nt() -> Callable:
    """The fallback for B stored N x K: ``torch.matmul(a, b.mT)`` (a view of B, no copy)."""
    matmul = _torch_matmul()

    def matmul_nt(a, b, out=None):
        return matmul(a, b.mT) if out is None else matmul(a, b.mT, out=out)

    return matmul_nt


# ---------------------------------------------------------------------------------------
# The real launcher: generated libraries through ctypes, on torch's current stream.


class TorchLauncher:
    """Builds through the runner's :class:`~l2gen.runner.Builder` (``build_many``: a
    stand-in for the compiler), loads with :class:`l2gen.runtime.Library`, launches on
    ``torch.cuda.current_stream()``. Entry ABI: ``templates/common.cuh.j2``."""

    def __init__(self, *, build_many=None):
        import torch

        self.torch = torch
        self._build_many = build_many
        # The current stream's handle by device index: torch's raw accessor where its build
        # has one (CUDA builds; what code torch.compile generates calls), else through a
        # torch.cuda.Stream object, which costs more per call.
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        self._raw_stream = raw if raw is not None else (lambda index: torch.cuda.current_stream(index).cuda_stream)

    def load(self, program: Program, gpu: Gpu):
        from .runner import Builder
        from .runtime import Library

        [built] = Builder(gpu, build_many=self._build_many).build([program])
        if not built.ok:
            raise RuntimeError(f"{'build failed' if built.verdict == 'build_error' else 'the checker rejects it'}: {built.error}")
        return Library.load(built.result.library, built.source.entry)

    def workspace(self, kernel, m: int, n: int, k: int, knobs: Knobs, like) -> tuple:
        """(buffer, bytes, address): (None, 0, None) where the launch needs none."""
        nbytes = kernel.workspace_size(m, n, k, knobs)
        if nbytes == 0:
            return (None, 0, None)
        # Zeroed once, on the stream that will use it: a kernel that counts arrivals in its
        # workspace leaves it zeroed again (templates/common.cuh.j2), so it is never cleared
        # per call.
        buf = self.torch.zeros(nbytes, dtype=self.torch.uint8, device=like.device)
        return (buf, nbytes, buf.data_ptr())

    def stream(self, like) -> int:
        return self._raw_stream(like.get_device())

    def eligible(self, a, b, out) -> bool:
        f16 = self.torch.float16
        ok = a.dtype is f16 and b.dtype is f16 and a.is_cuda and b.get_device() == a.get_device()
        ok = ok and a.is_contiguous() and b.is_contiguous()  # dimensions: the dispatcher's
        ok = ok and (a.data_ptr() | b.data_ptr()) & 15 == 0
        if ok and out is not None:
            ok = out.dtype is f16 and out.get_device() == a.get_device() and out.is_contiguous() and out.data_ptr() & 15 == 0
        return bool(ok)

    def empty(self, like, m: int, n: int):
        # like's dtype and device, fewer arguments to parse than torch.empty; the sizes as
        # integers (a torch.Size argument is parsed several times slower)
        return like.new_empty(m, n) if like.dim() == 2 else like.new_empty(*like.shape[:-1], n)

    def launch(self, kernel, a, b, out, m: int, n: int, k: int, ldb: int, knobs: Knobs, workspace) -> int:
        buf, nbytes = workspace[:2]
        stream = self.stream(a)
        return kernel.launch(a, b, out, m, n, k, k, ldb, n, knobs, buf, nbytes, stream, check=False)

    def bind(self, kernel, m: int, n: int, k: int, ldb: int, knobs: Knobs):
        """``launch`` for one shape, made once. Through the bound-call helper
        (:mod:`l2gen.bound`) where it can be built: a record per stream holds every
        argument but the three addresses (remade when the call brings another workspace,
        as each call captured into a CUDA graph does), and a call passes four arguments
        through ctypes. Else the entry itself, its constant arguments converted once."""
        from . import bound

        entry = kernel.entry_for(knobs)
        middle = kernel.constant_args(m, n, k, k, ldb, n, knobs)  # M .. the knobs, in ABI order
        call = bound.caller()
        if call is None:

            def run(a, b, out, workspace, stream):
                return entry(a.data_ptr(), b.data_ptr(), out.data_ptr(), *middle, workspace[2], workspace[1], stream)

            return run

        records: dict = {}  # stream -> (workspace, record, pointer to it)

        def run(a, b, out, workspace, stream):
            r = records.get(stream)
            if r is None or r[0] is not workspace:
                r = records[stream] = (workspace, *bound.bind(entry, middle, workspace[2], workspace[1], stream))
            return call(r[2], a.data_ptr(), b.data_ptr(), out.data_ptr())

        return run

    def capturing(self) -> bool:
        return bool(self.torch.cuda.is_current_stream_capturing())

    def relerr(self, out, ref) -> float:
        ref = ref.float()
        return float((out.float() - ref).norm() / ref.norm().clamp_min(1e-30))


# ---------------------------------------------------------------------------------------
# The module-level entry point.


def detect_gpu() -> Gpu | None:
    """The target record of the current CUDA device (None if unknown or no CUDA)."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        name = torch.cuda.get_device_name()
    except Exception:
        return None
    return gpu_of_card(name)


def default_db_path(gpu: Gpu) -> Path | None:
    """``$L2GEN_DB`` if set, else the database shipped in the package for this GPU."""
    env = os.environ.get("L2GEN_DB")
    if env:
        return Path(env)
    try:
        shipped = importlib.resources.files("l2gen").joinpath("data", f"kernels_{gpu.name}.db")
        if shipped.is_file():
            return Path(str(shipped))
    except (ModuleNotFoundError, FileNotFoundError, NotADirectoryError):
        pass
    return None


_dispatchers: dict = {}  # (database key, B layout) -> its dispatcher; key None: the default
_dispatchers_lock = threading.Lock()
_default_entry: Callable | None = None  # the default K x N dispatcher's entry, once it exists


def _set_default(d: Dispatcher) -> None:
    global _default_entry
    _dispatchers[(None, d.b_layout)] = d
    if d.b_layout is BLayout.KN:
        _default_entry = d.entry


def _new_dispatcher(db, l2: str | None = None, b_layout: BLayout = BLayout.KN, pdl: bool | None = None,
                    grid: int | None = None) -> Dispatcher:
    """A dispatcher for this process's GPU over ``db`` (None: ``$L2GEN_DB`` or the shipped one)."""
    gpu = detect_gpu()
    source = db if db is not None else (default_db_path(gpu) if gpu is not None else None)
    return Dispatcher(source, gpu, l2=l2, b_layout=b_layout, pdl=pdl, grid=grid)


def _grid_setting(grid: int | None) -> int:
    """A dispatcher's cap on CTAs: ``grid``, or ``$L2GEN_GRID`` where None (0: none)."""
    if grid is None:
        text = os.environ.get(GRID_ENV, "0").strip() or "0"
        try:
            grid = int(text)
        except ValueError:
            raise ValueError(f"{GRID_ENV}={text!r}: give the most CTAs a served kernel may launch, an integer (0: no cap)") from None
    if grid < 0:
        raise ValueError(f"grid {grid}: give the most CTAs a served kernel may launch, 0 for no cap")
    return int(grid)


def _dispatcher_for(db, b_layout: BLayout = BLayout.KN) -> Dispatcher:
    key = (db if db is None or isinstance(db, (str, Path)) else id(db), b_layout)
    d = _dispatchers.get(key)
    if d is None:
        with _dispatchers_lock:
            d = _dispatchers.get(key)
            if d is None:
                d = _new_dispatcher(db, b_layout=b_layout)
                if key[0] is None:
                    _set_default(d)
                else:
                    _dispatchers[key] = d
    return d


def dispatcher(db: KernelDB | str | Path | None = None, *, b_layout: BLayout = BLayout.KN) -> Dispatcher:
    """The dispatcher that serves B stored as ``b_layout`` from ``db`` (None: the default
    one, see :func:`use_db`), made on first use and kept."""
    return _dispatcher_for(db, BLayout(b_layout))


_DEFAULT_KEYS = {False: (None, BLayout.KN), True: (None, BLayout.NK)}


def default_dispatcher(b_nk: bool) -> Dispatcher:
    """``dispatcher(b_layout=NK if b_nk else KN)``, the default one, in one dictionary
    look-up once it exists (the torch op asks for it on every call)."""
    d = _dispatchers.get(_DEFAULT_KEYS[b_nk])
    return d if d is not None else _dispatcher_for(None, BLayout.NK if b_nk else BLayout.KN)


def use_db(db: KernelDB | str | Path | None, *, l2: str | None = None, pdl: bool | None = None,
           grid: int | None = None) -> Dispatcher:
    """Make the default dispatchers (those of ``l2gen.matmul`` without ``db=`` and of the
    torch op, one per B layout) serve from ``db`` (None: ``$L2GEN_DB`` or the shipped
    database again) the winners timed under ``l2`` (:func:`trusted_l2`), with
    programmatic dependent launch for l2gen's kernels if ``pdl`` (None: ``$L2GEN_PDL``),
    every served kernel kept to at most ``grid`` CTAs if given (None: ``$L2GEN_GRID``;
    see :class:`Dispatcher`); returns the one for B stored K x N."""
    made = {layout: _new_dispatcher(db, l2, layout, pdl, grid) for layout in BLayout}
    with _dispatchers_lock:
        for d in made.values():
            _set_default(d)
    return made[BLayout.KN]


def matmul(a, b, out=None, *, db: KernelDB | str | Path | None = None):
    """``a @ b`` for 2-D fp16 torch tensors on the GPU, by the best tuned kernel.

    ``b`` is K x N: a row-major tensor, or the transpose of a row-major N x K one
    (``w.t()``, an ``nn.Linear`` weight), which the winners for B stored N x K serve as it
    is stored, without a copy. ``db``: a kernel database (object or path); default
    ``$L2GEN_DB`` or the one shipped for this GPU. Anything not served (other dtypes,
    layouts, devices, shapes with no winning program) goes to ``torch.matmul``.
    """
    try:
        stored = b.mT if not b.is_contiguous() and b.dim() == 2 else None
    except AttributeError:  # not a torch tensor: the dispatcher hands it to the fallback
        stored = None
    if stored is not None and stored.is_contiguous():
        return (default_dispatcher(True) if db is None else _dispatcher_for(db, BLayout.NK)).call(a, stored, out)
    if db is None:
        entry = _default_entry
        if entry is not None:  # out= only when given: see Dispatcher.call
            return entry(a, b) if out is None else entry(a, b, out=out)
    return _dispatcher_for(db)(a, b, out)
