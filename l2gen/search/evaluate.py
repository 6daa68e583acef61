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
- :class:`DeviceEvaluator` checks, lowers and builds through the runner's
  :class:`~l2gen.runner.Builder` and hands the built libraries to an injected
  ``run_candidates`` callable: :func:`worker_runner`, the runner's
  :func:`~l2gen.runner.measure` in the isolated GPU worker, or a fake.
"""

from __future__ import annotations

import threading
from typing import Callable, Protocol, Sequence

from ..check import check
from ..diagnostics import errors
from ..ir import Program
from ..problem import STATUSES, Measurement, Shape, Status, unserved
from ..protocol import DEFAULT_L2
from ..protocol import Protocol as Timing
from ..runner import Builder, Settings, candidate_names, measure
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
    ``fallback_us`` (torch.matmul, same run; optional),
    ``relerr`` and ``error`` (missing keys read as None). It must time the candidates and
    the baseline interleaved in one isolated process (:mod:`l2gen.worker`,
    :mod:`l2gen.measure`).

    ``bundle`` > 1 compiles a batch's new programs that many to an nvcc run
    (:func:`l2gen.build.build_bundle`): fewer core-seconds per program, a longer wait for
    the batch. Knob-only variants share one build: the :class:`~l2gen.runner.Builder`
    builds each candidate's build program (its knobs reset, its name canonical), once per
    configuration over the evaluator's life, and each is launched with its own knobs.
    ``build_many`` and ``lower`` stand in for the compiler and the lowering (tests).
    """

    def __init__(self, gpu: Gpu, run_candidates: RunCandidates, *, build_many=None, lower=None, jobs: int | None = None, build_timeout: float = 600, progress=None, env: dict | None = None, bundle: int = 1,
                 l2: str = DEFAULT_L2):
        self.gpu = gpu
        self.l2 = l2  # the L2 protocol run_candidates times under (the search files it with each measurement)
        self.run_candidates = run_candidates
        self.builder = Builder(gpu, jobs=jobs, timeout=build_timeout, bundle=bundle, build_many=build_many, lower=lower)
        self.progress = progress
        if env is None:
            from ..db import collect_env

            env = collect_env()
        self.env = env  # toolchain versions recorded with every measurement

    @property
    def builds_requested(self) -> int:
        """Sources handed to the compiler so far (for tests and logs)."""
        return self.builder.requested

    def evaluate(self, shape: Shape, proposals: Sequence[Proposal], on_result: OnResult | None = None) -> list[Measurement]:
        out: list = [None] * len(proposals)
        todo: list[int] = []
        why = unserved(shape)  # the checker's refusals come from the builder, as data
        for i, proposal in enumerate(proposals):
            if why:
                _emit(out, on_result, i, Measurement(shape, proposal.program, "rejected", error=why))
            else:
                todo.append(i)
        builds = self.builder.build([proposals[i].program for i in todo], progress=self.progress)
        runnable = []
        for i, build in zip(todo, builds):
            if build.ok:
                runnable.append((i, build))
            else:
                _emit(out, on_result, i, Measurement(shape, build.program, build.verdict, error=build.error))
        if not runnable:
            return out
        candidates = [(build.result.library, build.source.entry, build.program, build.program.knobs) for _, build in runnable]
        try:
            rows = list(self.run_candidates(shape, candidates))
            if len(rows) != len(candidates):
                raise RuntimeError(f"run_candidates returned {len(rows)} results for {len(candidates)} candidates")
        except Exception as exc:
            rows = [{"status": "run_error", "error": f"run_candidates raised: {exc!r}"}] * len(candidates)
        for (i, build), row in zip(runnable, rows):
            _emit(out, on_result, i, _from_row(shape, build.program, row))
        return out


def _from_row(shape: Shape, program: Program, row: dict) -> Measurement:
    status = row.get("status") or "run_error"
    if status not in STATUSES or status == Status.REJECTED:
        return Measurement(shape, program, "run_error", error=f"worker returned unknown status {status!r}")
    time_us = row.get("time_us")
    if status == "ok" and not (time_us and time_us > 0 and row.get("baseline_us")):
        return Measurement(shape, program, "run_error", relerr=row.get("relerr"), error="worker said ok but gave no time or baseline")
    fallback = row.get("fallback_us")
    loop = row.get("sustained") if status == "ok" else None
    return Measurement(shape, program, status, time_us=time_us if status == "ok" else None, baseline_us=row.get("baseline_us"),
                       relerr=row.get("relerr"), error=row.get("error"),
                       fallback_us=fallback if status == "ok" and isinstance(fallback, (int, float)) and fallback > 0 else None,
                       sustained=tuple(loop) if loop else None)


def worker_runner(worker, *, baselines: Sequence[str] | None = None, shim: str | None = None, b_layout: str = "kn", seeds: int | None = None, reps: int = 50, rounds: int = DEFAULT_ROUNDS, gpu: Gpu | None = None,
                  l2: str = DEFAULT_L2, probes: str | None = None, sustained_ms: float = 0.0) -> RunCandidates:
    """A ``run_candidates`` for :class:`DeviceEvaluator` over :func:`l2gen.runner.measure`;
    safe to call from several threads (calls take turns on the worker).

    One measure task per batch: the candidates and the cuBLAS baselines verified, then
    timed interleaved in the isolated worker, in events mode under the L2 protocol ``l2``
    (``probes``: the timing probes library, else the worker builds it), with as many runs
    per median as ``l2gen bench`` takes when ``gpu`` is given. ``baseline_us`` is the
    fastest baseline that verified (per candidate, when the worker had to re-run one
    alone). A candidate whose work escaped the timed stream, or with no baseline time to
    compare, is a ``run_error``. ``sustained_ms`` > 0: every runner is also timed back to
    back in rotated blocks of that long (as ``l2gen bench --sustained``), and each row gets
    ``sustained``: the program's, cuBLAS-best's and torch.matmul's time per call there.
    """
    from ..baselines import BASELINES, cublas_best
    from ..lower import build_key
    from ..tasks import Candidate

    settings = Settings(tuple(baselines if baselines is not None else BASELINES), b_layout, Timing("events", l2),
                        shim, probes, seeds, reps, rounds, 1000.0 * sustained_ms)
    gpu_lock = threading.Lock()  # one worker, one GPU: shapes tuned in parallel take turns

    def best_of(results) -> float | None:
        return cublas_best({name: r.time_us for name, r in results.items() if r.ok})

    def fallback_of(results) -> float | None:  # torch.matmul, what an unserved call runs
        r = results.get("torch_matmul")
        return r.time_us if r is not None and r.ok else None

    def back_to_back(cand, results) -> tuple | None:  # (program, cuBLAS-best, torch.matmul) in sustained blocks
        def per_call(r):
            t = r.figures.get("sustained_us") if r is not None and r.ok else None
            return float(t) if isinstance(t, (int, float)) and t > 0 else None

        own = per_call(cand)
        best = cublas_best({name: per_call(r) for name, r in results.items()})
        return (own, best, per_call(results.get("torch_matmul"))) if own and best else None

    def run(shape: Shape, candidates: list) -> list[dict]:
        names = candidate_names([program for _, _, program, _ in candidates])
        wire = [Candidate(name, str(library), entry, build_key(program), knobs)
                for name, (library, entry, program, knobs) in zip(names, candidates)]
        task, timeout = settings.task(shape, wire, gpu)
        with gpu_lock:
            outcome = measure(worker, task, timeout)
        rows = []
        for cand in outcome.candidates:
            results = cand.baselines if cand.baselines is not None else outcome.baselines
            base = best_of(results)
            status, error = cand.status.value, cand.error
            if status == "ok" and base is None:
                status, error = "run_error", "no cuBLAS baseline verified and timed in this run"
            rows.append({"status": status, "time_us": cand.time_us, "baseline_us": base, "fallback_us": fallback_of(results),
                         "relerr": cand.relerr, "error": error, "sustained": back_to_back(cand, results)})
        return rows

    return run
