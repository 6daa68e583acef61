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
               "baseline_round_us": {"<baseline>_us": [...]}; in graph or server mode
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
from .console import Reporter, as_reporter, build_line, build_progress
from .ir import Program
from .lower import build_program
from .modes import GRAPH_REPLAYS, graph_calls_for
from .printer import format_program
from .probes import build_probes
from .problem import Shape
from .protocol import Floors, Protocol
from .targets import Gpu
from .timing import DEFAULT_ROUNDS
from .toolchain import found_nvcc_version
from .report import _fmt, format_table, plot_speedups  # noqa: F401  (format_table: bench's table, here too)
from .worker import Worker, knobs_to_dict, measure

Progress = Callable[[str], None]


def stderr_progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# ---- the run --------------------------------------------------------------------------


SHORT_KERNEL_US = 5.0  # shapes whose floor is below this get SHORT_REPS_FACTOR times the reps
SHORT_REPS_FACTOR = 4


def reps_for(shape: Shape, gpu: Gpu, reps: int) -> int:
    """Timed runs per median for a shape: launch jitter is a larger share of a few-µs
    kernel (a few-µs shape's ratio moved several percent between two runs at 50 reps),
    so short shapes get more runs; they cost little."""
    return reps * SHORT_REPS_FACTOR if gpu.floor_us(shape.m, shape.n, shape.k) < SHORT_KERNEL_US else reps


def task_timeout(shape: Shape, gpu: Gpu, runners: int, protocol: Protocol = Protocol(), reps: int = 50) -> float:
    """Seconds a shape's task may take: setup, plus per runner about 70 runs (verify,
    warm-up, timed, escape batch) of a kernel up to 50x slower than the floor, plus
    building the inputs and the reference; in graph mode the replays, in server mode the
    gaps of its schedule (at least twice their expected length)."""
    per_run = 50 * gpu.floor_us(shape.m, shape.n, shape.k) / 1e6
    extra = 0.0
    if protocol.mode == "graph":
        extra = GRAPH_REPLAYS * protocol.graph_calls * per_run
    elif protocol.mode == "server":
        extra = reps * (2.0 / protocol.qps + per_run)
    return 120.0 + runners * (20.0 + 100 * per_run + extra)


def shape_protocol(protocol: Protocol, shape: Shape, gpu: Gpu) -> Protocol:
    """The protocol of one shape's task: in graph mode, as many calls per graph as make a
    replay of about 10 ms of the shape's floor, at most the run's ``graph_calls``."""
    if protocol.mode != "graph":
        return protocol
    from dataclasses import replace

    return replace(protocol, graph_calls=graph_calls_for(gpu.floor_us(shape.m, shape.n, shape.k), protocol.graph_calls))


def probe_floors(worker: Worker, gpu: Gpu, protocol: Protocol, *, shim: str | None, probes: str,
                 reps: int = 50, say: Progress = lambda line: None) -> Floors:
    """This run's floors, measured by the worker ("probe" task); what it could not measure
    comes from the target record, with the reason."""
    task = {"kind": "probe", **protocol.to_dict(), "shim": shim, "probes": probes, "reps": reps}
    result = worker.run(task, 600)
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
) -> dict:
    """Lower, build and measure ``programs`` on ``shapes`` under ``protocol``; write
    ``out_json`` (after every shape, so an interrupted run keeps what it measured). Returns
    the results (the file's content). Raises :class:`l2gen.probes.ProbeError` if the timing
    probes cannot be built: nothing can be timed without them.

    Each program is built from :func:`~l2gen.lower.build_program` (its knobs at
    their defaults) and launched with its own knobs, so knob variants share one library,
    the same one ``l2gen tune`` built. ``only`` maps a shape to the names of the programs
    to run on it (all of them for a shape it does not name). ``progress`` takes the
    run's lines, or is a :class:`~l2gen.console.Reporter` (bars on a terminal)."""
    from .build import build_many
    from .diagnostics import DiagnosticError
    from .lower import lower

    report = as_reporter(progress)
    say = report.say
    out_json = Path(out_json)
    names = [p.name for p in programs]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"program names must be unique in a bench (repeated: {', '.join(dup)})")
    texts = {p.name: format_program(p) for p in programs}
    built_texts = {p.name: format_program(build_program(p)) for p in programs}
    # Lower and build: a program that fails either gets rows with its error for every shape.
    fails: dict[str, tuple[str, str]] = {}
    sources = {}
    for p in programs:
        try:
            sources[p.name] = lower(build_program(p), gpu)
        except DiagnosticError as e:
            fails[p.name] = ("rejected", str(e))
        except Exception as e:  # a template error: a bug, but still a row, not a crash
            fails[p.name] = ("build_error", f"lowering failed: {type(e).__name__}: {e}")
    say(f"[bench] building {len(sources)} program(s) for {gpu.name}")

    bar = report.bar("building", len({s.key for s in sources.values()}))
    on_build = build_progress(bar, lambda done, total, r: build_line(r, done, total))
    built = {}
    for name, r in zip(sources, build_many(list(sources.values()), jobs=jobs,
                                           timeout=build_timeout, progress=on_build)):
        if r.ok:
            built[name] = r
        else:
            fails[name] = ("build_error", f"{r.error}\n{r.command}".strip())
    bar.done()

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
    serving = [p for p in programs if p.b_layout.value == b_layout]
    for p in programs:
        if p.b_layout.value != b_layout:
            say(f"[bench] {p.name}: B layout {p.b_layout.value} does not serve this bench "
                f"({b_layout}); skipped")

    results = {
        "gpu": gpu.name, "device": None, "date": datetime.now(timezone.utc).isoformat(
            timespec="seconds"), "commit": git_commit(), "nvcc": found_nvcc_version(),
        **protocol.to_dict(), "b_layout": b_layout, "reps": reps,
        "rounds": rounds if protocol.mode == "events" else 1, "seeds": seeds, "floors": None,
        "rows": [], "shapes": [],
    }
    say(f"[bench] timing in {protocol.describe()}")
    own_worker = worker is None
    worker = worker or Worker()
    try:
        floors = probe_floors(worker, gpu, protocol, shim=shim, probes=probes, reps=reps, say=say)
        results["floors"] = floors.to_dict()
        bar = report.bar("measuring", len(shapes))
        for i, shape in enumerate(shapes, 1):
            here = [p for p in serving if only is None or shape not in only or p.name in only[shape]]
            candidates = [
                {"name": p.name, "library": str(built[p.name].library),
                 "entry": built[p.name].source.entry, "program_text": built_texts[p.name],
                 "knobs": knobs_to_dict(p.knobs)}
                for p in here if p.name in built
            ]
            bar.event(f"[bench] {i}/{len(shapes)} {shape}: {len(candidates)} program(s), "
                      f"{len(wanted)} baseline(s)", note=str(shape))
            here_protocol = shape_protocol(protocol, shape, gpu)
            shape_reps = reps_for(shape, gpu, reps)
            task = {"kind": "measure", "m": shape.m, "n": shape.n, "k": shape.k,
                    "b_layout": b_layout, "candidates": candidates, "baselines": wanted,
                    "shim": shim, "probes": probes, "seeds": seeds, "reps": shape_reps,
                    "rounds": rounds, **here_protocol.to_dict()}
            outcome = measure(worker, task, task_timeout(shape, gpu, len(candidates) + len(wanted),
                                                         here_protocol, shape_reps))
            if outcome.get("device"):
                results["device"] = outcome["device"].get("name")
            base = dict(outcome.get("baselines", {}))
            if shim_error:
                for b in baselines:
                    if b.startswith("cublas"):
                        base[b] = {"status": "unavailable", "time_us": None, "error": shim_error}
            by_name = {c["name"]: c for c in outcome.get("candidates", [])}
            rows = []
            for p in here:
                if p.name in fails:
                    status, error = fails[p.name]
                    cand = {"status": status, "error": error, "time_us": None, "relerr": None}
                else:
                    cand = by_name.get(p.name) or {"status": outcome.get("status", "run_error"),
                                                   "error": outcome.get("error"),
                                                   "time_us": None, "relerr": None}
                rows.append(make_row(shape, p.name, texts[p.name], cand,
                                     cand.get("baselines", base), floors, baselines))
                bar.event(f"[bench]   {p.name}: {_row_brief(rows[-1])}", ok=rows[-1]["status"] == "ok")
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


def make_row(shape: Shape, program: str, text: str, cand: dict, base: dict, floors: Floors,
             names: Sequence[str] = BASELINES) -> dict:
    """One results row from a candidate's result and its baselines' results; ``floors``
    are the run's (:func:`probe_floors`)."""
    times = {result_key(n): (_finite(base[n].get("time_us"))
                             if n in base and base[n].get("status") == "ok" else None)
             for n in names}
    best = cublas_best(times)
    status = cand.get("status", "run_error")
    t = _finite(cand.get("time_us")) if status == "ok" else None
    flops = 2.0 * shape.m * shape.n * shape.k
    return {
        "m": shape.m, "n": shape.n, "k": shape.k,
        "program": program, "program_text": text,
        "l2gen_us": t,
        "relerr": _finite(cand.get("relerr")),
        "status": status,
        "error": None if status == "ok" else cand.get("error"),
        "tflops": flops / (t * 1e6) if t else None,
        "floor_pct": 100.0 * floors.floor_us(shape.m, shape.n, shape.k) / t if t else None,
        "baselines": times,
        "cublas_best_us": best,
        "speedup_vs_best": best / t if t and best else None,
        **_rounds(cand, base, names),
        **_mode_figures(cand, base, names),
    }


MODE_FIGURES = ("graph", "server")  # the keys a graph- or server-mode result adds


def _mode_figures(cand: dict, base: dict, names: Sequence[str]) -> dict:
    """Graph or server mode: the program's own figures and each baseline's."""
    out = {}
    for mode in MODE_FIGURES:
        if mode in cand:
            out[mode] = cand[mode]
        per_baseline = {result_key(n): base[n][mode] for n in names if n in base and mode in base[n]}
        if per_baseline:
            out[f"baseline_{mode}"] = per_baseline
    return out


def _rounds(cand: dict, base: dict, names: Sequence[str]) -> dict:
    """With several timing rounds (bench ``rounds``): each round's median, the program's
    and each baseline's, so a reader can see how much the rounds differed."""
    if "round_us" not in cand:
        return {}
    return {"round_us": cand["round_us"],
            "baseline_round_us": {result_key(n): base[n]["round_us"] for n in names
                                  if n in base and "round_us" in base[n]}}


def shape_summary(shape: Shape, rows: Sequence[dict], base: dict,
                  names: Sequence[str] = BASELINES) -> dict:
    """The fastest passing program of a shape against cuBLAS-best."""
    ok = [r for r in rows if r["l2gen_us"] is not None]
    best_row = min(ok, key=lambda r: r["l2gen_us"]) if ok else None
    times = {result_key(n): (_finite(base[n].get("time_us"))
                             if n in base and base[n].get("status") == "ok" else None)
             for n in names}
    best = cublas_best(times)
    t = best_row["l2gen_us"] if best_row else None
    return {
        "m": shape.m, "n": shape.n, "k": shape.k,
        "best_program": best_row["program"] if best_row else None,
        "l2gen_us": t,
        "baselines": times,
        "baseline_errors": {n: base[n].get("error") for n in names
                            if n in base and base[n].get("status") != "ok"},
        "cublas_best_us": best,
        "speedup_vs_best": best / t if t and best else None,
        **{k: v for k, v in _mode_figures({}, base, names).items() if k == "baseline_server"},
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
