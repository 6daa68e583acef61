"""The tuning loop: propose, measure, persist, learn; shape by shape, resumable.

Every measurement goes into the kernel database the moment it lands, so an interrupted
run loses nothing: the next run with the same database loads each shape's history,
counts it against the budget and goes on from there.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable

from ..console import Columns, Reporter, as_reporter, plain
from ..ir import BLayout, Program
from ..problem import Measurement, Shape, program_key, unserved
from ..protocol import DEFAULT_L2
from ..space import without_idle_cap
from ..targets import Gpu
from .base import REWARD_FAILED, REWARD_REJECTED, Policy, Proposal, reward
from .evaluate import Evaluator

__all__ = ["REWARD_FAILED", "REWARD_REJECTED", "reward", "tune", "ShapeResult", "TuneError", "TuneSummary"]

MAX_STALLS = 3  # batches in a row with nothing new to measure before a shape gives up


class TuneError(RuntimeError):
    """The loop cannot go on (the evaluator broke); everything measured so far is stored."""


@dataclass
class ShapeResult:
    """What tuning one shape found. ``curve[i]`` is the best speedup after ``i + 1``
    measured candidates (0.0 before the first verified one), resumed ones included."""

    shape: Shape
    best_program: Program | None = None
    best_speedup: float | None = None
    best_time_us: float | None = None
    # the best speedup over torch.matmul (timed in the same run: the dispatcher's fallback),
    # of any verified candidate; None where no run timed it
    best_vs_torch: float | None = None
    curve: list[float] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)
    resumed: int = 0  # measurements loaded from the database at the start
    dropped: int = 0  # measured here but already stored by another run on the database
    note: str = ""

    @property
    def measured(self) -> int:
        return len(self.curve)

    def record(self, m: Measurement) -> None:
        self.counts[m.status] += 1
        s = m.speedup
        if s is not None and (self.best_speedup is None or s > self.best_speedup):
            self.best_program, self.best_speedup, self.best_time_us = m.program, s, m.time_us
        if s is not None and m.fallback_us and m.time_us:
            vs_torch = m.fallback_us / m.time_us
            self.best_vs_torch = max(vs_torch, self.best_vs_torch or 0.0)
        self.curve.append(self.best_speedup or 0.0)


@dataclass
class TuneSummary:
    gpu: str
    policy: str
    budget: int
    results: dict[Shape, ShapeResult] = field(default_factory=dict)
    interrupted: bool = False
    seconds: float = 0.0

    def table(self) -> str:
        """A plain-text table, one line per shape, then the geomeans."""
        return plain(self.blocks())

    def blocks(self) -> list:
        """:meth:`table` as :func:`l2gen.console.show` prints it (a rich table on a terminal):
        per shape its best speedup over cuBLAS-best ("best") and over torch.matmul ("xtorch"),
        each the best of its verified candidates, then their geomeans over the shapes with one."""
        lines = [f"{'shape':>20}  {'measured':>8}  {'best':>7}  {'xtorch':>7}  {'time_us':>9}  statuses"]
        rows = []
        for r in self.results.values():
            best = f"{r.best_speedup:.3f}x" if r.best_speedup else "-"
            torch = f"{r.best_vs_torch:.3f}x" if r.best_vs_torch else "-"
            t = f"{r.best_time_us:.2f}" if r.best_time_us else "-"
            lines.append(f"{str(r.shape):>20}  {r.measured:>8}  {best:>7}  {torch:>7}  {t:>9}  {_counts(r.counts)}")
            rows.append([str(r.shape), str(r.measured), best, torch, t, _counts(r.counts)])
        blocks = [Columns(["shape", "measured", "best", "xtorch", "time_us", "statuses"], rows, frozenset({5}),
                          plain="\n".join(lines))]
        means = [f"{what} geomean {value:.3f}x over {n} shapes" for what, value, n in (
            ("cuBLAS-best", *_geomean(r.best_speedup for r in self.results.values())),
            ("torch.matmul", *_geomean(r.best_vs_torch for r in self.results.values()))) if n]
        if means:
            blocks.append("best per shape against " + "; against ".join(means))
        if self.seconds > 0 and self.results:
            measured = sum(r.measured - r.resumed for r in self.results.values())
            blocks.append(f"{measured} candidates measured in {self.seconds:.0f} s of wall time "
                          f"(compiles included): {self.seconds / len(self.results):.0f} s a shape")
        return blocks


def _geomean(values) -> tuple[float, int]:
    """(geometric mean, count) of the positive values among ``values`` (None and 0 skipped)."""
    kept = [v for v in values if v]
    return (statistics.geometric_mean(kept), len(kept)) if kept else (0.0, 0)


def _counts(counts: Counter) -> str:
    return " ".join(f"{k} {v}" for k, v in sorted(counts.items()))


def tune(
    shapes: Iterable[Shape | str],
    policy: Policy,
    evaluator: Evaluator,
    db,
    *,
    budget: int,
    batch: int = 8,
    gpu: Gpu,
    progress: bool | Callable[[str], None] | Reporter | None = True,
    parallel: int = 1,
    b_layout: BLayout | str = BLayout.KN,
) -> TuneSummary:
    """Tune each shape until ``budget`` candidates are measured for it (across runs).

    ``db`` is a :class:`l2gen.db.KernelDB`; every measurement is written to it as it
    lands, and the history already there for a shape counts against the budget (and is
    shown to the policy first), so rerunning an interrupted command resumes it. Rewards:
    log(speedup) for a verified program, :data:`REWARD_FAILED` for a build, launch or
    verification failure or a timeout, :data:`REWARD_REJECTED` for a checker rejection.
    ``progress``: True prints a line per batch on stderr, a callable gets the lines, a
    :class:`~l2gen.console.Reporter` gets them and draws a bar per shape (its best so far).
    Ctrl-C ends the run cleanly (the summary says ``interrupted``).

    Every measurement is filed under the evaluator's L2 protocol (its ``l2``; default
    clean), the only one whose history and bests the run reads: a database of another
    protocol is refused (:class:`l2gen.db.ProtocolMismatchError`) before anything runs.

    ``parallel`` shapes are tuned at once, each in its own thread, in suite order: while
    one shape's batch compiles, another's is measured, so the build pool and the GPU are
    both kept busy. The policy, the database and the progress lines are shared under one
    lock; the evaluator is called outside it (it must be safe to call from several
    threads: :class:`~l2gen.search.evaluate.DeviceEvaluator` is). With ``parallel > 1``
    the order in which shapes' results reach the policy depends on timing, so a seeded
    run is no longer exactly repeatable.

    ``b_layout`` is how the tuned GEMMs store B (``nk``: an ``nn.Linear`` weight, N x K):
    the run measures programs of that layout only. A proposal of the other layout (a
    policy that does not know the run's, a program transferred from an earlier run) is
    measured as the same decisions in the run's layout; the history, the bests the
    policy starts from and a shape's budget count that layout's programs alone.
    """
    shapes = list(dict.fromkeys(Shape.parse(s) if isinstance(s, str) else s for s in shapes))
    if not shapes:
        raise ValueError("nothing to tune: the shape suite is empty")
    if not isinstance(budget, int) or budget <= 0:
        raise ValueError(f"budget must be a positive number of measured candidates per shape, got {budget!r}")
    if not isinstance(batch, int) or batch <= 0:
        raise ValueError(f"batch must be a positive number of candidates, got {batch!r}")
    if not isinstance(parallel, int) or parallel <= 0:
        raise ValueError(f"parallel must be a positive number of shapes, got {parallel!r}")
    for shape in shapes:
        why = unserved(shape)
        if why:
            raise ValueError(f"cannot tune {shape}: {why}")
    if evaluator.gpu.name != gpu.name:
        raise ValueError(f"the evaluator measures on {evaluator.gpu.name} but tuning targets {gpu.name}")
    db.check_gpu(gpu)
    l2 = getattr(evaluator, "l2", DEFAULT_L2)
    db.check_l2(l2)
    check_evidence = getattr(db, "check_evidence", None)
    if check_evidence is not None:  # simulated rows never share a database with measured ones
        check_evidence("simulated" if getattr(evaluator, "simulated", False) else "measured")
    b_layout = BLayout(b_layout)
    prime = getattr(policy, "prime", None)
    if prime is not None:  # a policy that transfers between shapes starts from the database's bests
        prime(db.best_all(gpu, l2=l2, b_layout=b_layout))
    lock = threading.RLock()
    report = as_reporter(progress)

    def say(line: str) -> None:
        with lock:
            report.say(line)

    env = dict(getattr(evaluator, "env", None) or {})
    summary = TuneSummary(gpu.name, policy.name, budget)
    summary.results = {shape: ShapeResult(shape) for shape in shapes}
    start = time.monotonic()
    stop = threading.Event()
    run = _ShapeRun(policy, evaluator, db, budget, batch, gpu, env, say, start, lock, stop, report, b_layout)
    say(f"[tune] {len(shapes)} shape(s) on {gpu.name}, B {b_layout.value}, policy {policy.name}, budget {budget} per shape, batch {batch}, "
        f"{parallel} at once, db {getattr(db, 'path', db)}")
    where = getattr(db, "path", "the database")
    try:
        if parallel == 1:
            for shape in shapes:
                run(shape, summary.results[shape])
        else:
            _run_parallel(run, summary, parallel, stop, say)
    except KeyboardInterrupt:
        summary.interrupted = True
        kept = sum(r.measured for r in summary.results.values())
        say(f"[tune] interrupted: all {kept} measurements so far are in {where}; run the same command again to resume")
    summary.seconds = time.monotonic() - start
    return summary


def _run_parallel(run: "_ShapeRun", summary: TuneSummary, parallel: int, stop: threading.Event, say) -> None:
    """Tune the shapes ``parallel`` at a time. On Ctrl-C (or a shape's error) no new batch
    starts; the batches in flight land in the database, then the interrupt (or the error)
    goes on up."""
    pool = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="l2gen-tune")
    futures = [pool.submit(run, shape, result) for shape, result in summary.results.items()]
    try:
        for future in futures:
            future.result()
    except BaseException as exc:
        stop.set()
        for future in futures:
            future.cancel()
        if isinstance(exc, KeyboardInterrupt):
            say("[tune] interrupted: letting the batches in flight land in the database ...")
        wait(futures)
        raise
    finally:
        pool.shutdown(wait=True)


class _ShapeRun:
    """Tunes one shape (a thread's whole job when shapes run in parallel)."""

    def __init__(self, policy: Policy, evaluator: Evaluator, db, budget: int, batch: int, gpu: Gpu, env: dict, say, start: float, lock,
                 stop: threading.Event, report: Reporter, b_layout: BLayout = BLayout.KN):
        self.policy, self.evaluator, self.db, self.report = policy, evaluator, db, report
        self.b_layout = b_layout
        self.l2 = getattr(evaluator, "l2", DEFAULT_L2)
        self.budget, self.batch, self.gpu, self.env = budget, batch, gpu, env
        self.say, self.start, self.lock, self.stop = say, start, lock, stop

    def _store(self, m: Measurement) -> bool:
        """Persist one measurement; False if the database already had it (or the shape's
        budget was filled) by another run on it. Plain ``add`` for a database without
        ``add_new`` (a test double). A measurement also timed back to back is judged there
        too (:meth:`l2gen.db.KernelDB.add_back_to_back`)."""
        add_new = getattr(self.db, "add_new", None)
        if add_new is None:
            self.db.add(m, self.gpu, self.policy.name, self.env)
            return True
        if add_new(m, self.gpu, self.policy.name, self.env, budget=self.budget, per_layout=True) is None:
            return False
        if m.sustained is not None:  # timed back to back too (tune --sustained): judged by the worse of the two
            self.db.add_back_to_back(m, self.gpu, self.env)
        return True

    def __call__(self, shape: Shape, result: ShapeResult) -> None:
        policy, db, gpu, batch, budget, say, lock = self.policy, self.db, self.gpu, self.batch, self.budget, self.say, self.lock
        if self.stop.is_set():
            return
        with lock:
            history: list[Measurement] = [m for m in db.history(gpu, shape, l2=self.l2, loops=False) if m.program.b_layout is self.b_layout]
            for m in history:
                result.record(m)
            result.resumed = len(history)
            # Show the policy what earlier runs measured, as if it had proposed it.
            for i in range(0, len(history), batch):
                chunk = history[i : i + batch]
                policy.update(shape, [(Proposal(m.program, "from the database", {"kind": "history"}), m) for m in chunk])
        if history:
            say(f"[tune] {shape}: resuming with {len(history)} measurement(s) from the database")
        bar = self.report.bar(str(shape), budget, completed=min(len(history), budget))
        bar.event(note=self._best(result))
        self._batches(shape, result, history, bar)  # (an error or a stop leaves the bar on screen, marked by the reporter)
        if len(history) >= budget or result.note:
            bar.done(f"[tune] {str(shape):>18} {len(history):>4}/{budget}  {self._best(result)}  "
                     f"{result.note or _counts(result.counts)}")

    @staticmethod
    def _best(result: ShapeResult) -> str:
        return f"best {result.best_speedup:.3f}x" if result.best_speedup else "best -"

    def _batches(self, shape: Shape, result: ShapeResult, history: list, bar) -> None:
        policy, db, gpu, batch, budget, say, lock = self.policy, self.db, self.gpu, self.batch, self.budget, self.say, self.lock
        seen = {program_key(m.program) for m in history}
        stalls = 0
        while len(history) < budget and not self.stop.is_set():
            want = min(batch, budget - len(history))
            fresh: list[Proposal] = []
            with lock:
                proposals = policy.propose(shape, list(history), want)
            for p in proposals:
                if p.program.b_layout is not self.b_layout and not p.meta.get("rejected"):
                    p = replace(p, program=replace(p.program, b_layout=self.b_layout))
                # a cap over the CTAs the launch uses: the uncapped launch, measured once, as that
                p = replace(p, program=without_idle_cap(p.program, shape.m, shape.n, shape.k))
                if len(fresh) >= want:
                    break
                if p.meta.get("rejected"):  # already diagnosed by the policy (e.g. an unparsable LLM answer)
                    fresh.append(p)
                    continue
                key = program_key(p.program)
                if key not in seen:
                    seen.add(key)
                    fresh.append(p)
            if not fresh:
                stalls += 1
                if stalls >= MAX_STALLS:
                    stop_note = getattr(policy, "stop_note", None)  # a wrapper that held proposals back says why
                    why = stop_note(shape) if callable(stop_note) else None
                    result.note = f"stopped at {len(history)}/{budget}: {why or 'the policy proposed nothing new'}"
                    say(f"[tune] {shape}: {result.note}")
                    return
                continue
            stalls = 0
            landed: dict[int, Measurement] = {}

            def land(i: int, m: Measurement) -> None:
                with lock:
                    if i in landed:
                        return
                    m = replace(m, l2=self.l2)  # what this run timed it under (or would have)
                    landed[i] = m
                    if self._store(m):
                        history.append(m)
                        result.record(m)
                    else:  # another run on this database measured it (or filled the budget) first
                        result.dropped += 1

            diagnosed = [i for i, p in enumerate(fresh) if p.meta.get("rejected")]
            for i in diagnosed:
                text = "\n".join(fresh[i].meta.get("diagnostics") or [fresh[i].note or "rejected by the policy"])
                land(i, Measurement(shape, fresh[i].program, "rejected", error=text))
            pending = [i for i in range(len(fresh)) if i not in landed]
            try:
                measured = self.evaluator.evaluate(shape, [fresh[i] for i in pending], lambda j, m: land(pending[j], m))
            except Exception as exc:  # the evaluator itself broke (not a candidate): stop, keep what landed
                from ..db import DatabaseError

                if isinstance(exc, (DatabaseError, TuneError)):  # a database error from land(): as it is
                    raise
                raise TuneError(f"{shape}: measuring a batch failed ({type(exc).__name__}: {exc}); the {len(landed)} "
                                f"result(s) of this batch that landed and every measurement before are in "
                                f"{getattr(db, 'path', 'the database')}: run the same command again to resume") from exc
            for j, m in enumerate(measured):
                land(pending[j], m)
            with lock:
                policy.update(shape, [(fresh[i], landed[i]) for i in range(len(fresh))])
                if result.dropped:  # another run is tuning this shape too: go on from what is stored
                    history[:] = db.history(gpu, shape, l2=self.l2, loops=False)
                    seen |= {program_key(m.program) for m in history}
            best = f"{result.best_speedup:.3f}x" if result.best_speedup else "-"
            with lock:
                bar.advance(f"[tune] {str(shape):>18} {len(history):>4}/{budget}  best {best:>7}  {_counts(result.counts)}  "
                            f"({time.monotonic() - self.start:.1f} s)", completed=min(len(history), budget), note=self._best(result))
