"""The runner: programs x shapes -> verified, timed results, every failure kept as data.

Three steps, each in one place, shared by ``l2gen bench``, the tuner's evaluator and the
dispatcher's loader (and ``l2gen build``):

- :class:`Builder` checks each program, lowers its build program (its knobs at their
  defaults, its name canonical: :func:`source`, the one place a program becomes CUDA
  source) and builds the libraries (nvcc's content-hash cache, in parallel, bundled when
  asked); a program refused by the checker is ``rejected``, one that fails to lower or to
  compile a ``build_error``, as a :class:`Build` record. Knob variants share a library.
- :func:`measure` runs one shape's :class:`~l2gen.tasks.MeasureTask` in the isolated
  worker to the end: a runner that crashes or hangs the worker fails alone and the others
  are measured again without it (the only retries there are).
- :func:`run` does both for programs x shapes and yields a :class:`ShapeResult` per shape
  as it lands: one :class:`Result` per program that serves the shape, in program order.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Callable, Collection, Iterator, Mapping, Sequence

from .baselines import BASELINES, cublas_best
from .check import check
from .diagnostics import DiagnosticError, errors
from .ir import Program
from .lower import build_program
from .modes import GRAPH_REPLAYS, graph_calls_for
from .printer import format_program
from .problem import Shape, Status
from .protocol import Protocol
from .targets import Gpu
from .tasks import Candidate, MeasureTask, RunResult, TaskResult
from .timing import DEFAULT_ROUNDS, SUSTAINED_BLOCKS

if TYPE_CHECKING:
    from .build import BuildResult
    from .console import Reporter
    from .lower import KernelSource


# ---- build ----------------------------------------------------------------------------


def source(program: Program, gpu: Gpu, *, lower: Callable | None = None) -> "KernelSource":
    """The kernel source of a program's library: its build program (knobs at their
    defaults, name canonical) lowered for ``gpu``. Raises DiagnosticError if the checker
    rejects it. ``lower``: a stand-in for :func:`l2gen.lower.lower` (tests)."""
    if lower is None:
        from . import lower as lowering

        lower = lowering.lower
    return lower(build_program(program), gpu)


@dataclass(frozen=True)
class Build:
    """What building one program gave. ``verdict`` is None when it built, else
    ``rejected`` or ``build_error`` with ``error``; ``result`` is nvcc's (log, command,
    seconds, cached), None when nothing was compiled."""

    program: Program
    source: "KernelSource | None" = None
    result: "BuildResult | None" = None
    verdict: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.verdict is None

    def candidate(self, name: str) -> Candidate:
        """The worker's record of this build, launched with the program's own knobs."""
        return Candidate(name, str(self.result.library), self.source.entry, format_program(self.source.program),
                         self.program.knobs)


class Builder:
    """Checks, lowers and builds programs for one GPU, remembering every library it built
    (or failed to build) by source key, so a later batch rebuilds nothing it has seen.

    ``bundle`` > 1 compiles that many new programs to an nvcc run
    (:func:`l2gen.build.build_bundle`). ``flags``: nvcc flags added to every source (such
    as ``-DMACRO=1``, a macro a template reads; part of each library's key). ``build_many``
    and ``lower`` stand in for
    :func:`l2gen.build.build_many` and :func:`l2gen.lower.lower` (tests); by default they
    are looked up when used."""

    def __init__(self, gpu: Gpu, *, jobs: int | None = None, timeout: float = 600, force: bool = False,
                 bundle: int = 1, flags: Sequence[str] = (), build_many: Callable | None = None,
                 lower: Callable | None = None):
        self.gpu, self.jobs, self.timeout, self.force, self.bundle = gpu, jobs, timeout, force, bundle
        self.flags = tuple(flags)
        self._build_many, self._lower = build_many, lower
        self._results: dict[str, object] = {}  # source key -> BuildResult (or a failure)
        self.requested = 0  # sources handed to the compiler (for tests and logs)

    def build(self, programs: Sequence[Program], *, report: "Reporter | None" = None,
              line: Callable | None = None, summary: Callable | None = None,
              progress: Callable | None = None) -> list[Build]:
        """One :class:`Build` per program, in order. Progress: a "building" bar on
        ``report`` (each build's line by ``line(done, total, result)``, default
        :func:`l2gen.console.build_line`; ``summary(builds) -> (text, ok)`` what the bar
        gives way to), or the raw ``progress(done, total, result)``."""
        out: list[Build | None] = [None] * len(programs)
        sources: dict[int, KernelSource] = {}
        for i, program in enumerate(programs):
            problems = errors(check(program, self.gpu))
            if problems:
                out[i] = Build(program, verdict=Status.REJECTED.value, error="\n".join(str(d) for d in problems))
                continue
            try:
                sources[i] = source(program, self.gpu, lower=self._lower).with_flags(*self.flags)
            except DiagnosticError as exc:
                out[i] = Build(program, verdict=Status.REJECTED.value, error=str(exc))
            except Exception as exc:  # a checker/template disagreement: a bug, but data here
                out[i] = Build(program, verdict=Status.BUILD_ERROR.value, error=f"lowering failed: {type(exc).__name__}: {exc}")
        todo: dict[str, KernelSource] = {}
        for s in sources.values():
            if s.key not in self._results:
                todo.setdefault(s.key, s)
        bar = self._compile(todo, report, line, progress) if todo else None
        for i, s in sources.items():
            result = self._results[s.key]
            if getattr(result, "ok", False) and getattr(result, "library", None) is not None:
                out[i] = Build(programs[i], s, result)
            else:
                error = (getattr(result, "error", None) or "build failed")
                nvcc = None if isinstance(result, _FailedBuild) else result  # the compiler never ran
                out[i] = Build(programs[i], s, nvcc, Status.BUILD_ERROR.value, f"{error}\n{getattr(result, 'command', '')}".strip())
        if bar is not None:
            text, ok = summary(out) if summary is not None else (None, True)
            bar.done(text, ok=ok)
        return out

    def _compile(self, todo: dict, report, line, progress):
        """Compile the new sources, remembering each result; returns the bar, if any."""
        from . import build as building
        from .console import build_line, build_progress

        bar = None
        if progress is None and report is not None:
            bar = report.bar("building", len(todo))
            progress = build_progress(bar, line or (lambda done, total, r: build_line(r, done, total)))
        kw = {"jobs": self.jobs, "timeout": self.timeout, "progress": progress}
        if self.force:
            kw["force"] = True
        compile_ = self._build_many
        if compile_ is None and self.bundle > 1:  # several programs per nvcc run: headers parsed once
            kw["max_size"] = self.bundle
            compile_ = building.build_bundle
        self.requested += len(todo)
        try:
            results = list((compile_ or building.build_many)(list(todo.values()), **kw))
        except Exception as exc:
            results = [_FailedBuild(f"the build raised: {exc!r}")] * len(todo)
        results += [None] * (len(todo) - len(results))
        for key, result in zip(todo, results):
            self._results[key] = result if result is not None else _FailedBuild("the build gave no result")
        return bar


class _FailedBuild:
    ok = False
    library = None
    command = ""

    def __init__(self, error: str):
        self.error = error


# ---- one shape's task -----------------------------------------------------------------


SHORT_KERNEL_US = 5.0  # shapes whose floor is below this get SHORT_REPS_FACTOR times the reps
SHORT_REPS_FACTOR = 4


def reps_for(shape: Shape, gpu: Gpu, reps: int) -> int:
    """Timed runs per median for a shape: launch jitter is a larger share of a few-µs
    kernel (a few-µs shape's ratio moved several percent between two runs at 50 reps),
    so short shapes get more runs; they cost little."""
    return reps * SHORT_REPS_FACTOR if gpu.floor_us(shape.m, shape.n, shape.k) < SHORT_KERNEL_US else reps


def task_timeout(shape: Shape, gpu: Gpu, runners: int, protocol: Protocol = Protocol(), reps: int = 50,
                 sustained_us: float = 0.0) -> float:
    """Seconds a shape's task may take: setup, plus per runner about 70 runs (verify,
    warm-up, timed, escape batch) of a kernel up to 50x slower than the floor, plus
    building the inputs and the reference; in graph mode the replays, in server mode the
    gaps of its schedule (at least twice their expected length); with sustained blocks,
    three times their length (a block is at least 10 calls)."""
    per_run = 50 * gpu.floor_us(shape.m, shape.n, shape.k) / 1e6
    extra = 3.0 * SUSTAINED_BLOCKS * max(sustained_us / 1e6, 10 * per_run) if sustained_us > 0 else 0.0
    if protocol.mode == "graph":
        extra += GRAPH_REPLAYS * protocol.graph_calls * per_run
    elif protocol.mode == "server":
        extra += reps * (2.0 / protocol.qps + per_run)
    return 120.0 + runners * (20.0 + 100 * per_run + extra)


def shape_protocol(protocol: Protocol, shape: Shape, gpu: Gpu) -> Protocol:
    """The protocol of one shape's task: in graph mode, as many calls per graph as make a
    replay of about 10 ms of the shape's floor, at most the run's ``graph_calls``."""
    if protocol.mode != "graph":
        return protocol
    return replace(protocol, graph_calls=graph_calls_for(gpu.floor_us(shape.m, shape.n, shape.k), protocol.graph_calls))


@dataclass(frozen=True)
class Settings:
    """How every shape of a run is measured: the baselines timed beside the programs, the
    B layout, the timing protocol, the shim and probes libraries (None: the worker builds
    or finds them), input sets verified (None: the executor's default), timed runs per
    median and rounds."""

    baselines: tuple[str, ...] = BASELINES
    b_layout: str = "kn"
    protocol: Protocol = Protocol()
    shim: str | None = None
    probes: str | None = None
    seeds: int | None = None
    reps: int = 50
    rounds: int = DEFAULT_ROUNDS
    sustained_us: float = 0.0  # > 0: each runner also timed in blocks of this long back to back

    def task(self, shape: Shape, candidates: Sequence[Candidate], gpu: Gpu | None) -> tuple[MeasureTask, float | None]:
        """A shape's task and its timeout (None: the worker's). Knowing the GPU, short
        shapes get more runs (:func:`reps_for`), graph mode calls per graph to suit the
        shape, and the timeout the shape's size."""
        protocol, reps, timeout = self.protocol, self.reps, None
        if gpu is not None:
            protocol, reps = shape_protocol(self.protocol, shape, gpu), reps_for(shape, gpu, self.reps)
            timeout = task_timeout(shape, gpu, len(candidates) + len(self.baselines), protocol, reps,
                                   self.sustained_us)
        return MeasureTask(shape, tuple(candidates), tuple(self.baselines), self.b_layout, protocol, self.shim,
                           self.probes, self.seeds, reps, rounds=self.rounds,
                           sustained_us=self.sustained_us), timeout


# ---- measuring through the worker, despite faulty runners -----------------------------


def measure(worker, task: MeasureTask, timeout: float | None = None) -> TaskResult:
    """Run a measure task to the end in ``worker`` (:class:`l2gen.worker.Worker`, or
    anything with its ``run(wire, timeout) -> dict``): a runner that crashes or hangs the
    worker fails alone, and the others are measured again without it.

    The worker's last note says which candidate (or baseline) was being verified when it
    died; that one gets the failure and the task is re-run without it. A failure while
    timing (all runners interleaved, so no culprit) re-runs each candidate on its own with
    the baselines; those candidates then carry their own ``baselines``.
    """
    order = [c.name for c in task.candidates]
    done: dict[str, RunResult] = {}
    dropped: dict[str, RunResult] = {}
    pending, baselines = list(task.candidates), list(task.baselines)
    for _ in range(len(pending) + len(baselines) + 2):  # each retry drops a runner
        attempt = replace(task, candidates=tuple(pending), baselines=tuple(baselines))
        result = TaskResult.from_wire(worker.run(attempt.to_wire(), timeout))
        if result.ok:
            done.update((c.name, c) for c in result.candidates)
            return _assemble(result, order, done, {**result.baselines, **dropped})
        note = result.last_note or {}
        if note.get("phase") == "verify" and note.get("candidate") in {c.name for c in pending}:
            done[note["candidate"]] = RunResult.failed(note["candidate"], result.verdict, result.error)
            pending = [c for c in pending if c.name != note["candidate"]]
            continue
        if note.get("phase") == "verify" and note.get("baseline") in baselines:
            dropped[note["baseline"]] = RunResult.failed(note["baseline"], result.verdict, result.error)
            baselines = [b for b in baselines if b != note["baseline"]]
            continue
        if note.get("phase") in ("time", "sustained") and len(pending) > 1:
            for cand in pending:
                alone = measure(worker, replace(task, candidates=(cand,), baselines=tuple(baselines)), timeout)
                one = alone.candidates[0] if alone.candidates else RunResult.failed(cand.name, alone.verdict, alone.error)
                done[cand.name] = replace(one, baselines=MappingProxyType({**alone.baselines, **dropped}))
            return _assemble(TaskResult(Status.OK.value), order, done, dropped)
        # No culprit to blame: everything still pending fails with the task.
        for cand in pending:
            done[cand.name] = RunResult.failed(cand.name, result.verdict, result.error)
        for name in baselines:
            dropped[name] = RunResult.failed(name, result.verdict, result.error)
        return _assemble(result, order, done, dropped)
    raise AssertionError("measure: retry bound exceeded")


def _assemble(result: TaskResult, order: list[str], done: dict, baselines: dict) -> TaskResult:
    return replace(result, error=None if result.ok else result.error, candidates=tuple(done[n] for n in order),
                   baselines=MappingProxyType(dict(baselines)), last_note=None if result.ok else result.last_note)


# ---- programs x shapes ----------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    """One program on one shape: how its run went (a build's verdict where it never ran)
    and the baselines it was timed against."""

    program: Program
    shape: Shape
    run: RunResult
    baselines: Mapping[str, RunResult] = field(default_factory=dict)

    @property
    def status(self) -> Status:
        return self.run.status

    @property
    def baseline_us(self) -> float | None:
        """cuBLAS-best: the fastest baseline that verified and was timed beside it."""
        return cublas_best({n: b.time_us for n, b in self.baselines.items() if b.ok})


@dataclass(frozen=True)
class ShapeResult:
    """A shape's results: one per program that serves it, in program order; the task's
    baselines and outcome (its device and protocol)."""

    shape: Shape
    results: tuple[Result, ...]
    task: TaskResult

    @property
    def baselines(self) -> Mapping[str, RunResult]:
        return self.task.baselines


def candidate_names(programs: Sequence[Program]) -> list[str]:
    """The worker's names of a batch's candidates: the programs' names where they are
    unique, else ``c0``, ``c1``, ..."""
    names = [p.name for p in programs]
    return names if len(set(names)) == len(names) else [f"c{i}" for i in range(len(names))]


def run(worker, builds: Sequence[Build], shapes: Sequence[Shape], settings: Settings, *, gpu: Gpu | None,
        only: Mapping[Shape, Collection[str]] | None = None,
        on_task: Callable[[int, Shape, MeasureTask], None] | None = None) -> Iterator[ShapeResult]:
    """Measure built programs on shapes, one worker task per shape, yielding each shape's
    results as they land. A program serves the shapes of its B layout (the settings'),
    limited by ``only`` (shape -> program names; all for a shape it does not name); one
    that did not build gets its build's verdict on every shape it serves. ``on_task(i,
    shape, task)`` is called before the i-th shape's task is run."""
    names = candidate_names([b.program for b in builds])
    serving = [i for i, b in enumerate(builds) if b.program.b_layout.value == settings.b_layout]
    for number, shape in enumerate(shapes, 1):
        here = [i for i in serving if only is None or shape not in only or builds[i].program.name in only[shape]]
        task, timeout = settings.task(shape, [builds[i].candidate(names[i]) for i in here if builds[i].ok], gpu)
        if on_task is not None:
            on_task(number, shape, task)
        outcome = measure(worker, task, timeout)
        ran = {c.name: c for c in outcome.candidates}
        results = []
        for i in here:
            if not builds[i].ok:
                one = RunResult.failed(names[i], builds[i].verdict, builds[i].error)
            else:
                one = ran.get(names[i]) or RunResult.failed(names[i], outcome.verdict, outcome.error)
            own = one.baselines if one.baselines is not None else outcome.baselines
            results.append(Result(builds[i].program, shape, one, own))
        yield ShapeResult(shape, tuple(results), outcome)
