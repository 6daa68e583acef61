"""Bench: programs x shapes against the cuBLAS baselines, into a results file and a table.

For each shape one worker task verifies, then times interleaved, the baselines and every
program that serves the shape (one whose B layout is the bench's, "kn" for ``C = A @ B``,
"nk" for ``C = A @ W.T``): the ratio of a program to the baselines comes from one process
and one stretch of time. A program that is rejected, fails to build, crashes, hangs,
computes a wrong answer, escapes the timed stream or (graph mode) cannot be captured in a
CUDA graph gets a row with its status and error and no time. With no programs, the
baselines alone are timed (their times are in ``shapes``).

Every run is timed under one protocol (:mod:`l2gen.protocol`; default: events mode with a
clean-cold L2), recorded at the top of the file, and starts with a worker "probe" task that
measures the run's floors (:class:`~l2gen.protocol.Floors`: the launch floor under that
protocol, the stream rate, the fp16 peak) in the process that times everything else.

The results file (JSON)::

    {"gpu": target name, "device": the CUDA device's name (null if none ran),
     "date": ISO 8601 UTC, "commit": git sha of the l2gen checkout or null,
     "mode": "events" | "graph" | "server", "l2": "clean" | "dirty" | "warm" (a file
     without these was timed in events mode with the written flush: dirty), "qps" and
     "seed" (server), "graph_calls" (graph: the most calls per graph), "b_layout",
     "floors": {"launch_floor_us", "stream_tbs", "peak_tflops", and how each was had},
     "nvcc": version or null, "reps": timed runs per median and round (4x for shapes whose
     floor is under 5 µs, see reps_for), "rounds": timing rounds, each on fresh buffers
     (the median pools them), "seeds": input sets verified,
     "rows": [{"m", "n", "k", "program", "program_text", "l2gen_us", "relerr", "status",
               "error", "tflops", "floor_pct", "baselines": {"torch_matmul_us",
               "cublas_us", "cublas_tt_us", "cublaslt_heuristic_us",
               "cublaslt_autotuned_us"}, "cublas_best_us", "speedup_vs_best",
               with rounds > 1 also "round_us": [per-round median],
               "baseline_round_us": {"<baseline>_us": [...]}; "batch_us" and
               "baseline_batch_us": {"<baseline>_us": ...}, the event time per call of each
               one's back-to-back batch (the escape check's: one batch of ~20 ms each,
               run one runner after another after the timed runs, so its clock depends on
               what ran before it; ``bench/probe.py --sustained`` times longer rotated
               blocks for a per-call time under sustained load); with ``sustained`` also
               "sustained_us" and "baseline_sustained_us": {"<baseline>_us": ...}, the
               median event time per call over rotated blocks of that length, back to back
               over operand copies that exceed the L2 (see
               :func:`l2gen.timing.time_sustained`), and "sustained_blocks_us";
               in graph or server mode
               "graph" / "server" (that mode's figures: calls, medians and means) and
               "baseline_graph" / "baseline_server" ({"<baseline>_us": {...}})}],
     "shapes": [{"m", "n", "k", "best_program", "l2gen_us", "baselines",
                 "baseline_errors", "cublas_best_us", "speedup_vs_best",
                 in server mode also "baseline_server"}]}

``rows`` has one row per (program, shape); ``shapes`` is the per-shape summary: the fastest
program that passed (null when none did) against cuBLAS-best. Times are medians in µs: of
the runs (events mode), of replays over the calls in one graph (graph), of the calls'
event times (server). ``floor_pct`` is ``100 * floor / l2gen_us`` with the floor
``max(launch floor, bytes / stream rate, FLOPs / peak)`` from this run's ``floors``;
``speedup_vs_best`` is
``cublas_best_us / l2gen_us``; a baseline time is null where it was unavailable or failed
(``baseline_errors`` says why). ``cublas_tt`` is cublasGemmEx with both operands transposed
(C written column-major), ``cublas`` the usual row-major swap.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Collection, Mapping, Sequence

from .baselines import BASELINES, ShimError, build_shim, cublas_best, result_key
from .console import Reporter, as_reporter
from .ir import Program
from .printer import format_program
from .probes import build_probes
from .problem import Shape
from .protocol import Floors, Protocol
from .runner import Builder, Settings, run
from .targets import Gpu
from .tasks import ProbeTask, RunResult
from .timing import DEFAULT_ROUNDS
from .toolchain import found_nvcc_version
from .report import _fmt, format_table, plot_speedups  # noqa: F401  (format_table: bench's table, here too)
from .worker import Worker

Progress = Callable[[str], None]


def stderr_progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# ---- the run --------------------------------------------------------------------------


def probe_floors(worker: Worker, gpu: Gpu, protocol: Protocol, *, shim: str | None, probes: str,
                 reps: int = 50, say: Progress = lambda line: None) -> Floors:
    """This run's floors, measured by the worker ("probe" task); what it could not measure
    comes from the target record, with the reason."""
    result = worker.run(ProbeTask(protocol, shim, probes, reps).to_wire(), 600)
    if result.get("status") != "ok":
        first = (result.get("error") or "no reason given").strip().splitlines()
        say(f"[bench] the floors could not be measured: {first[0] if first else ''}")
    floors = Floors.from_probe(result if result.get("status") == "ok" else {"error": result.get("error")}, gpu)
    say(f"[bench] floors: launch {_fmt(floors.launch_us, '.2f')} us, stream {floors.stream_tbs:.2f} TB/s, "
        f"peak {floors.peak_tflops:.0f} TFLOP/s")
    return floors


def bench(
    programs: Sequence[Program],
    shapes: Sequence[Shape],
    gpu: Gpu,
    *,
    out_json: Path | str,
    plot_png: Path | str | None = None,
    reps: int = 50,
    rounds: int = DEFAULT_ROUNDS,
    seeds: int = 3,
    progress: Progress | Reporter | None = stderr_progress,
    baselines: Sequence[str] = BASELINES,
    b_layout: str = "kn",
    jobs: int | None = None,
    build_timeout: float = 600,
    worker: Worker | None = None,
    only: Mapping[Shape, Collection[str]] | None = None,
    protocol: Protocol = Protocol(),
    sustained_ms: float = 0.0,
) -> dict:
    """Lower, build and measure ``programs`` on ``shapes`` under ``protocol``; write
    ``out_json`` (after every shape, so an interrupted run keeps what it measured). Returns
    the results (the file's content). Raises :class:`l2gen.probes.ProbeError` if the timing
    probes cannot be built: nothing can be timed without them.

    Each program is built from :func:`~l2gen.lower.build_program` (its knobs at
    their defaults) and launched with its own knobs, so knob variants share one library,
    the same one ``l2gen tune`` built. ``only`` maps a shape to the names of the programs
    to run on it (all of them for a shape it does not name). ``progress`` takes the
    run's lines, or is a :class:`~l2gen.console.Reporter` (bars on a terminal).

    ``sustained_ms`` > 0 (events mode): every program and baseline is also timed back to
    back, in rotated blocks of that many milliseconds (``sustained_us`` in its row), what a
    model's loop of GEMMs sees once clocks and power settle."""
    report = as_reporter(progress)
    say = report.say
    out_json = Path(out_json)
    names = [p.name for p in programs]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"program names must be unique in a bench (repeated: {', '.join(dup)})")
    texts = {p.name: format_program(p) for p in programs}
    # A program that is rejected or fails to build gets rows with its error for every shape.
    say(f"[bench] building {len(programs)} program(s) for {gpu.name}")
    builds = Builder(gpu, jobs=jobs, timeout=build_timeout).build(programs, report=report)

    wanted = list(baselines)
    shim, shim_error = None, None
    if any(b.startswith("cublas") for b in wanted):
        try:
            shim = str(build_shim(timeout=build_timeout))
        except ShimError as e:
            shim_error = str(e)
            say(f"[bench] cuBLAS baselines unavailable: {shim_error.splitlines()[0]}")
            wanted = [b for b in wanted if not b.startswith("cublas")]
    probes = str(build_probes(timeout=build_timeout))
    if not programs:
        say("[bench] no programs: timing the baselines alone")
    for p in programs:
        if p.b_layout.value != b_layout:
            say(f"[bench] {p.name}: B layout {p.b_layout.value} does not serve this bench "
                f"({b_layout}); skipped")
    if sustained_ms > 0 and protocol.mode != "events":
        raise ValueError(f"sustained blocks are an events-mode measurement, not {protocol.describe()}'s")
    settings = Settings(tuple(wanted), b_layout, protocol, shim, probes, seeds, reps, rounds, 1000.0 * sustained_ms)

    results = {
        "gpu": gpu.name, "device": None, "date": datetime.now(timezone.utc).isoformat(
            timespec="seconds"), "commit": git_commit(), "nvcc": found_nvcc_version(),
        **protocol.to_dict(), "b_layout": b_layout, "reps": reps,
        "rounds": rounds if protocol.mode == "events" else 1, "seeds": seeds, "floors": None,
        **({"sustained_ms": sustained_ms} if sustained_ms > 0 else {}),
        "rows": [], "shapes": [],
    }
    say(f"[bench] timing in {protocol.describe()}")
    own_worker = worker is None
    worker = worker or Worker()
    try:
        floors = probe_floors(worker, gpu, protocol, shim=shim, probes=probes, reps=reps, say=say)
        results["floors"] = floors.to_dict()
        bar = report.bar("measuring", len(shapes))

        def starting(i: int, shape: Shape, task) -> None:
            bar.event(f"[bench] {i}/{len(shapes)} {shape}: {len(task.candidates)} program(s), "
                      f"{len(wanted)} baseline(s)", note=str(shape))

        for measured in run(worker, builds, shapes, settings, gpu=gpu, only=only, on_task=starting):
            shape, outcome = measured.shape, measured.task
            if outcome.device:
                results["device"] = outcome.device.get("name")
            base = dict(outcome.baselines)
            if shim_error:
                for b in baselines:
                    if b.startswith("cublas"):
                        base[b] = RunResult(b, "unavailable", error=shim_error)
            rows = []
            for one in measured.results:
                own = one.baselines if one.run.baselines is not None else base
                rows.append(make_row(shape, one.program.name, texts[one.program.name], one.run, own, floors, baselines))
                bar.event(f"[bench]   {one.program.name}: {_row_brief(rows[-1])}", ok=rows[-1]["status"] == "ok")
            results["rows"] += rows
            results["shapes"].append(shape_summary(shape, rows, base, baselines))
            write_results(results, out_json)
            best = results["shapes"][-1]["speedup_vs_best"]
            bar.advance(note=f"{shape}: best {best:.2f}x cuBLAS-best" if best else f"{shape}: no program passed")
        bar.done()
    finally:
        if own_worker:
            worker.close()
    write_results(results, out_json)
    if plot_png:
        if plot_speedups(results, plot_png):
            say(f"[bench] plot written to {plot_png}")
        else:
            say("[bench] matplotlib is not installed: no plot (pip install 'l2gen[plot]')")
    return results


# ---- rows -----------------------------------------------------------------------------


def _finite(x) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


def _times(base: Mapping[str, RunResult], names: Sequence[str]) -> dict:
    """Each baseline's time (null where it was unavailable or failed), by result key."""
    return {result_key(n): (_finite(base[n].time_us) if n in base and base[n].ok else None) for n in names}


def make_row(shape: Shape, program: str, text: str, cand: RunResult, base: Mapping[str, RunResult],
             floors: Floors, names: Sequence[str] = BASELINES) -> dict:
    """One results row from a candidate's result and its baselines' results; ``floors``
    are the run's (:func:`probe_floors`)."""
    times = _times(base, names)
    best = cublas_best(times)
    status = cand.verdict
    t = _finite(cand.time_us) if status == "ok" else None
    flops = 2.0 * shape.m * shape.n * shape.k
    return {
        "m": shape.m, "n": shape.n, "k": shape.k,
        "program": program, "program_text": text,
        "l2gen_us": t,
        "relerr": _finite(cand.relerr),
        "status": status,
        "error": None if status == "ok" else cand.error,
        "tflops": flops / (t * 1e6) if t else None,
        "floor_pct": 100.0 * floors.floor_us(shape.m, shape.n, shape.k) / t if t else None,
        "baselines": times,
        "cublas_best_us": best,
        "speedup_vs_best": best / t if t and best else None,
        **_rounds(cand, base, names),
        **_batches(cand, base, names),
        **_sustained(cand, base, names),
        **_mode_figures(cand, base, names),
    }


def _sustained(cand: RunResult, base: Mapping[str, RunResult], names: Sequence[str]) -> dict:
    """Where the run timed sustained blocks: the program's and each baseline's median time
    per call in them, and the program's blocks."""
    own = _finite(cand.figures.get("sustained_us")) if cand.ok else None
    if own is None:
        return {}
    return {"sustained_us": own, "sustained_blocks_us": list(cand.figures.get("sustained_blocks_us") or ()),
            "baseline_sustained_us": {result_key(n): (_finite(base[n].figures.get("sustained_us"))
                                                      if n in base and base[n].ok else None) for n in names}}


MODE_FIGURES = ("graph", "server")  # the keys a graph- or server-mode result adds


def _mode_figures(cand: RunResult | None, base: Mapping[str, RunResult], names: Sequence[str]) -> dict:
    """Graph or server mode: the program's own figures and each baseline's."""
    out = {}
    for mode in MODE_FIGURES:
        if cand is not None and mode in cand.figures:
            out[mode] = cand.figures[mode]
        per_baseline = {result_key(n): base[n].figures[mode] for n in names if n in base and mode in base[n].figures}
        if per_baseline:
            out[f"baseline_{mode}"] = per_baseline
    return out


def _rounds(cand: RunResult, base: Mapping[str, RunResult], names: Sequence[str]) -> dict:
    """With several timing rounds (bench ``rounds``): each round's median, the program's
    and each baseline's, so a reader can see how much the rounds differed."""
    if "round_us" not in cand.figures:
        return {}
    return {"round_us": cand.figures["round_us"],
            "baseline_round_us": {result_key(n): base[n].figures["round_us"] for n in names
                                  if n in base and "round_us" in base[n].figures}}


def _batch_us(result: RunResult | None) -> float | None:
    ev = result.figures.get("event_vs_wall") if result is not None and result.ok else None
    return _finite(ev.get("batch_event_us")) if isinstance(ev, Mapping) else None


def _batches(cand: RunResult, base: Mapping[str, RunResult], names: Sequence[str]) -> dict:
    """The event time per call of the program's and each baseline's back-to-back batch,
    where the run timed one (the time a loop of calls sees once clocks and power settle)."""
    own = _batch_us(cand)
    if own is None:
        return {}
    return {"batch_us": own, "baseline_batch_us": {result_key(n): _batch_us(base.get(n)) for n in names}}


def shape_summary(shape: Shape, rows: Sequence[dict], base: Mapping[str, RunResult],
                  names: Sequence[str] = BASELINES) -> dict:
    """The fastest passing program of a shape against cuBLAS-best."""
    ok = [r for r in rows if r["l2gen_us"] is not None]
    best_row = min(ok, key=lambda r: r["l2gen_us"]) if ok else None
    times = _times(base, names)
    best = cublas_best(times)
    t = best_row["l2gen_us"] if best_row else None
    return {
        "m": shape.m, "n": shape.n, "k": shape.k,
        "best_program": best_row["program"] if best_row else None,
        "l2gen_us": t,
        "baselines": times,
        "baseline_errors": {n: base[n].error for n in names if n in base and not base[n].ok},
        "cublas_best_us": best,
        "speedup_vs_best": best / t if t and best else None,
        **{k: v for k, v in _mode_figures(None, base, names).items() if k == "baseline_server"},
    }


def _row_brief(row: dict) -> str:
    if row["status"] != "ok":
        return f"{row['status']}: {(row['error'] or '').splitlines()[0] if row['error'] else ''}"
    s = row["speedup_vs_best"]
    return f"{row['l2gen_us']:.2f} us" + (f", {s:.2f}x cuBLAS-best" if s else "")


def write_results(results: dict, path: Path | str) -> None:
    """Write strict JSON (no NaN/Infinity) atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(results, f, indent=1, allow_nan=False)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def git_commit() -> str | None:
    """The sha of the checkout l2gen runs from, or None (not a checkout, no git).

    ``$L2GEN_COMMIT`` names it where the tree was copied without its .git (a GPU machine)."""
    if os.environ.get("L2GEN_COMMIT"):
        return os.environ["L2GEN_COMMIT"]
    try:
        run = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    sha = run.stdout.strip()
    return sha if run.returncode == 0 and sha else None
