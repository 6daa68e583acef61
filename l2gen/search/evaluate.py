"""Evaluating proposals: checker → lower → build → run, with every failure kept as data.

An :class:`Evaluator` turns a batch of proposals for one shape into one
:class:`~l2gen.problem.Measurement` each, in order. Status is one of
:data:`l2gen.problem.STATUSES`; nothing a candidate does (failing the checker, the compiler, the launch
or the verification) raises out of ``evaluate``.

Two implementations:

- :class:`~l2gen.search.simulate.SimulatedEvaluator` (its own module) stands in for build
  and run with an analytic cost model of the target GPU. It is a *model, not a measurement*: it lets
  the search, the policies and the database be exercised and compared in CI with no GPU
  and no compiler, and nothing it says is a claim about real kernels.
- :class:`DeviceEvaluator` lowers, builds (:func:`l2gen.build.build_many`) and hands the
  built libraries to an injected ``run_candidates`` callable (the isolated GPU worker).
"""

from __future__ import annotations

import threading
from typing import Callable, Protocol, Sequence

from ..check import check
from ..diagnostics import errors
from ..ir import Program
from ..lower import build_program
from ..printer import format_program
from ..problem import STATUSES, Measurement, Shape, Status, status_from_worker, unserved
from ..protocol import DEFAULT_L2
from ..targets import Gpu
from ..timing import DEFAULT_ROUNDS
from .base import Proposal

OnResult = Callable[[int, Measurement], None]  # (index in the batch, measurement)


class Evaluator(Protocol):
    """Measures proposals for one shape on one GPU; failures come back as statuses."""

    gpu: Gpu

    def evaluate(
        self, shape: Shape, proposals: Sequence[Proposal], on_result: OnResult | None = None
    ) -> list[Measurement]:
        """One measurement per proposal, in order. ``on_result(i, m)`` is called as each
        lands, so the caller can persist it before the batch is done."""
        ...


def rejected(shape: Shape, program: Program, gpu: Gpu) -> Measurement | None:
    """A 'rejected' measurement if the checker (or the shape rule) refuses the program."""
    why = unserved(shape)
    if why:
        return Measurement(shape, program, "rejected", error=why)
    problems = errors(check(program, gpu))
    if problems:
        return Measurement(shape, program, "rejected", error="\n".join(str(d) for d in problems))
    return None


def _emit(out: list, on_result: OnResult | None, index: int, m: Measurement) -> None:
    out[index] = m
    if on_result is not None:
        on_result(index, m)


# ---------------------------------------------------------------------------------------
# The real device.

RunCandidates = Callable[[Shape, list], list]  # (shape, [(library, entry, program, knobs)]) -> [dict]


class DeviceEvaluator:
    """Lower, build and run on a real GPU. The GPU part is the injected ``run_candidates``.

    ``run_candidates(shape, candidates) -> list[dict]`` gets one
    ``(library, entry, program, knobs)`` tuple per candidate (``library`` a Path to the
    shared object, ``entry`` its exported symbol, ``knobs`` to pass at launch) and returns
    one dict per candidate, in order, with keys ``status`` (``"ok"``, ``"run_error"``,
    ``"wrong"`` or ``"timeout"``), ``time_us``, ``baseline_us`` (cuBLAS-best, same run),
    ``relerr`` and ``error`` (missing keys read as None). It must time the candidates and
    the baseline interleaved in one isolated process (:mod:`l2gen.worker`,
    :mod:`l2gen.measure`).

    ``bundle`` > 1 compiles a batch's new programs that many to an nvcc run
    (:func:`l2gen.build.build_bundle`): fewer core-seconds per program, a longer wait for
    the batch. Knob-only variants share one build: each candidate is built from
    :func:`build_program` (its knobs reset, its name canonical), deduplicated by the
    KernelSource key, and launched with its own knobs.
    """

    def __init__(self, gpu: Gpu, run_candidates: RunCandidates, *, build_many=None, lower=None, jobs: int | None = None, build_timeout: float = 600, progress=None, env: dict | None = None, bundle: int = 1,
                 l2: str = DEFAULT_L2):
        if build_many is None:
            if bundle > 1:  # several programs per nvcc run: headers parsed once for them

                def build_many(sources, **kw):
                    from ..build import build_bundle

                    return build_bundle(sources, max_size=bundle, **kw)
            else:
                from ..build import build_many
        if lower is None:
            from ..lower import lower
        self.gpu = gpu
        self.l2 = l2  # the L2 protocol run_candidates times under (the search files it with each measurement)
        self.run_candidates = run_candidates
        self.build_many = build_many
        self.lower = lower
        self.jobs = jobs
        self.build_timeout = build_timeout
        self.progress = progress
        if env is None:
            from ..db import collect_env

            env = collect_env()
        self.env = env  # toolchain versions recorded with every measurement
        self._builds: dict[str, object] = {}  # KernelSource key -> BuildResult
        self.builds_requested = 0  # sources handed to build_many (for tests and logs)

    def evaluate(self, shape: Shape, proposals: Sequence[Proposal], on_result: OnResult | None = None) -> list[Measurement]:
        out: list = [None] * len(proposals)
        sources: dict[int, object] = {}
        for i, proposal in enumerate(proposals):
            m = rejected(shape, proposal.program, self.gpu)
            if m is not None:
                _emit(out, on_result, i, m)
                continue
            try:
                sources[i] = self.lower(build_program(proposal.program), self.gpu)
            except Exception as exc:  # a checker/template disagreement: a bug, but data here
                _emit(out, on_result, i, Measurement(shape, proposal.program, "build_error", error=f"lowering failed: {exc}"))
        todo = {}
        for source in sources.values():
            if source.key not in self._builds:
                todo.setdefault(source.key, source)
        if todo:
            self.builds_requested += len(todo)
            try:
                results = self.build_many(list(todo.values()), jobs=self.jobs, timeout=self.build_timeout, progress=self.progress)
            except Exception as exc:
                results = [None] * len(todo)
                error = f"build_many raised: {exc!r}"
            for key, result in zip(todo, results):
                self._builds[key] = result if result is not None else _FailedBuild(error)
        runnable: list[int] = []
        for i, source in sources.items():
            result = self._builds[source.key]
            if not getattr(result, "ok", False) or getattr(result, "library", None) is None:
                error = getattr(result, "error", None) or "build failed"
                _emit(out, on_result, i, Measurement(shape, proposals[i].program, "build_error", error=str(error)))
            else:
                runnable.append(i)
        if not runnable:
            return out
        candidates = [(self._builds[sources[i].key].library, sources[i].entry, proposals[i].program, proposals[i].program.knobs) for i in runnable]
        try:
            rows = list(self.run_candidates(shape, candidates))
            if len(rows) != len(candidates):
                raise RuntimeError(f"run_candidates returned {len(rows)} results for {len(candidates)} candidates")
        except Exception as exc:
            rows = [{"status": "run_error", "error": f"run_candidates raised: {exc!r}"}] * len(candidates)
        for i, row in zip(runnable, rows):
            _emit(out, on_result, i, _from_row(shape, proposals[i].program, row))
        return out


class _FailedBuild:
    ok = False
    library = None

    def __init__(self, error: str):
        self.error = error


def _from_row(shape: Shape, program: Program, row: dict) -> Measurement:
    status = row.get("status") or "run_error"
    if status not in STATUSES or status == Status.REJECTED:
        return Measurement(shape, program, "run_error", error=f"worker returned unknown status {status!r}")
    time_us = row.get("time_us")
    if status == "ok" and not (time_us and time_us > 0 and row.get("baseline_us")):
        return Measurement(shape, program, "run_error", relerr=row.get("relerr"), error="worker said ok but gave no time or baseline")
    return Measurement(shape, program, status, time_us=time_us if status == "ok" else None, baseline_us=row.get("baseline_us"), relerr=row.get("relerr"), error=row.get("error"))


def worker_runner(worker, *, baselines: Sequence[str] | None = None, shim: str | None = None, b_layout: str = "kn", seeds: int | None = None, reps: int = 50, rounds: int = DEFAULT_ROUNDS, gpu: Gpu | None = None,
                  l2: str = DEFAULT_L2, probes: str | None = None) -> RunCandidates:
    """A ``run_candidates`` for :class:`DeviceEvaluator` over :func:`l2gen.worker.measure`;
    safe to call from several threads (calls take turns on the worker).

    One measure task per batch: the candidates and the cuBLAS baselines verified, then
    timed interleaved in the isolated worker, in events mode under the L2 protocol ``l2``
    (``probes``: the timing probes library, else the worker builds it). ``baseline_us`` is the fastest baseline
    that verified (per candidate, when the worker had to re-run one alone). A candidate
    whose work escaped the timed stream, or with no baseline time to compare, is a
    ``run_error``.
    """
    from ..baselines import BASELINES, cublas_best
    from ..worker import knobs_to_dict, measure

    wanted = list(baselines if baselines is not None else BASELINES)
    gpu_lock = threading.Lock()  # one worker, one GPU: shapes tuned in parallel take turns

    def best_of(results: dict) -> float | None:
        return cublas_best({name: r.get("time_us") for name, r in results.items() if r.get("status") == "ok"})

    def run(shape: Shape, candidates: list) -> list[dict]:
        shape_reps = reps
        if gpu is not None:
            from ..bench import reps_for

            shape_reps = reps_for(shape, gpu, reps)  # the same runs per median as l2gen bench takes
        task = {
            "kind": "measure", "m": shape.m, "n": shape.n, "k": shape.k, "b_layout": b_layout, "baselines": wanted, "shim": shim, "reps": shape_reps,
            "rounds": rounds, "l2": l2, "mode": "events", "probes": probes,
            "candidates": [
                {"name": f"c{i}", "library": str(library), "entry": entry, "program_text": format_program(build_program(program)), "knobs": knobs_to_dict(knobs)}
                for i, (library, entry, program, knobs) in enumerate(candidates)
            ],
        }
        if seeds is not None:
            task["seeds"] = seeds
        timeout = None
        if gpu is not None:
            from ..bench import task_timeout

            timeout = task_timeout(shape, gpu, len(candidates) + len(wanted))
        with gpu_lock:
            outcome = measure(worker, task, timeout)
        shared = best_of(outcome.get("baselines") or {})
        rows = []
        for cand in outcome.get("candidates") or []:
            base = best_of(cand["baselines"]) if "baselines" in cand else shared
            status = status_from_worker(cand.get("status"))
            error = cand.get("error")
            if status == "ok" and base is None:
                status, error = "run_error", "no cuBLAS baseline verified and timed in this run"
            rows.append({"status": status, "time_us": cand.get("time_us"), "baseline_us": base, "relerr": cand.get("relerr"), "error": error})
        return rows

    return run
