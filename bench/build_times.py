"""Cold build times of DSL programs (default: every example), in wall and CPU time.

Each pass builds every program's library (the one bench and tune build: knobs at their
defaults) into a fresh, empty build cache, so nothing is a cache hit:

- ``--jobs 1``: one nvcc at a time; each program's wall time and the CPU time (user +
  system) of its nvcc and everything nvcc ran (cicc, ptxas, the host compiler);
- ``--jobs N``: all programs at once, N nvcc processes at a time; the pass's wall and CPU
  time, and each program's nvcc wall time.

CPU time is what a build costs a busy machine; wall time depends on what else runs, and
even CPU time moves by 10-30% from run to run on a shared machine. So ``--rounds`` repeats
every pass (medians and minima are reported), and ``--baseline SOURCES`` times, in the
same rounds and interleaved with this tree's builds, the sources an earlier commit lowered
the same programs to (``--save-sources`` writes them; the commit's own build command is
used for them, as a one-unit source is built the same way in both). The ratios baseline /
this tree are under each pass's "reduction".

    python bench/build_times.py --jobs 1 16 -o build-times.json
    python bench/build_times.py --save-sources before.json          # at the earlier commit
    python bench/build_times.py --jobs 1 --rounds 2 --baseline before.json -o times.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import shlex
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from l2gen.bench import git_commit, write_results  # noqa: E402
from l2gen.lower import KernelSource  # noqa: E402
from l2gen.parse import parse, parse_file  # noqa: E402
from l2gen.printer import format_program  # noqa: E402
from l2gen.runner import source  # noqa: E402
from l2gen.targets import get_gpu  # noqa: E402
from l2gen.toolchain import ToolchainError, detect_toolchain  # noqa: E402


def children_cpu() -> float:
    """User + system seconds of every child process this process has waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def machine() -> dict:
    """What the timings depend on: host, CPU model and count, memory."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = None
    try:
        memory = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        pass
    return {"host": platform.node(), "cpu": model, "cores": os.cpu_count(), "memory_gib": memory}


def save_sources(named: list[tuple[str, KernelSource]], gpu: str, path: str) -> None:
    """Write what the programs lower to here, for a later ``--baseline``."""
    sources = [{"name": n, "program": format_program(s.program), "entry": s.entry, "code": s.code,
                "host_code": getattr(s, "host_code", ""), "gencode": s.gencode, "flags": list(s.flags)}
               for n, s in named]
    write_results({"commit": git_commit(), "gpu": gpu, "sources": sources}, path)


def load_sources(path: str) -> tuple[dict, list[tuple[str, KernelSource]]]:
    data = json.loads(Path(path).read_text())
    named = [(s["name"], KernelSource(program=parse(s["program"]), gpu=data["gpu"], entry=s["entry"],
                                      code=s["code"], gencode=s["gencode"], flags=tuple(s["flags"]),
                                      host_code=s.get("host_code", "")))
             for s in data["sources"]]
    return {"file": str(path), "commit": data.get("commit")}, named


def _cold_cache(keep: Path | None, *parts: str):
    """A fresh, empty build cache: a temporary one, or KEEP/parts... (which must be empty)."""
    if keep is None:
        return tempfile.TemporaryDirectory(prefix="l2gen-build-times.")
    folder = keep.joinpath(*parts)
    if folder.exists() and any(folder.iterdir()):
        raise SystemExit(f"{folder} is not empty: a cold build needs an empty cache")
    folder.mkdir(parents=True, exist_ok=True)
    return contextlib.nullcontext(str(folder))


def _build_set(named, jobs: int, timeout: float, cache: str, times: dict, label: str) -> tuple[float, float]:
    """Build one set of sources cold; add each program's times to ``times``; return the
    set's (wall, CPU) seconds."""
    from l2gen.build import build, build_many

    os.environ["L2GEN_CACHE_DIR"] = cache
    cpu0, wall0 = children_cpu(), time.monotonic()
    if jobs == 1:
        for name, source in named:
            before = children_cpu()
            result = build(source, timeout=timeout)
            _record(times, name, source, result, children_cpu() - before)
            print(f"[jobs 1, {label}] {name}: {result.seconds:.1f} s wall, "
                  f"{times[name]['cpu_s'][-1]:.1f} s CPU" + ("" if result.ok else f" FAILED: {result.error}"),
                  file=sys.stderr)
    else:
        for (name, source), result in zip(named, build_many([s for _, s in named], jobs=jobs, timeout=timeout)):
            _record(times, name, source, result, None)
    wall, cpu = time.monotonic() - wall0, children_cpu() - cpu0
    if jobs > 1:
        print(f"[jobs {jobs}, {label}] {len(named)} programs: {wall:.1f} s wall, {cpu:.1f} s CPU", file=sys.stderr)
    return wall, cpu


def _record(times: dict, name: str, source, result, cpu: float | None) -> None:
    row = times.setdefault(name, {
        "program": name, "family": source.program.family.value, "tile": str(source.program.config.tile),
        "flags": [f for f in source.flags if f.startswith("-D")], "ok": True, "wall_s": [], "cpu_s": []})
    row["ok"] &= result.ok
    row["wall_s"].append(round(result.seconds, 2))
    if cpu is not None:
        row["cpu_s"].append(round(cpu, 2))
    if not result.ok:
        row["error"] = result.error


def _summary(values: list[float]) -> dict | None:
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2)} if values else None


def run_pass(sets: dict, jobs: int, rounds: int, timeout: float, keep: Path | None) -> dict:
    """``rounds`` cold builds of every set, the sets' order alternating from round to round
    (one at a time, each program of each set in turn; else each set whole)."""
    load = os.getloadavg()[0]
    labels = list(sets)
    times = {label: {} for label in labels}
    totals = {label: [] for label in labels}
    for r in range(rounds):
        order = labels if r % 2 == 0 else labels[::-1]
        if jobs == 1:  # interleave per program, so that drift in the machine hits both sets
            spent = {label: [0.0, 0.0] for label in labels}
            names = [n for n, _ in sets[labels[0]]]
            for name in names:
                for label in order:
                    source = dict(sets[label]).get(name)
                    if source is None:
                        continue
                    with _cold_cache(keep, f"jobs-{jobs}", label, f"round-{r}", name) as cache:
                        wall, cpu = _build_set([(name, source)], 1, timeout, cache, times[label], label)
                    spent[label][0] += wall
                    spent[label][1] += cpu
            for label in labels:
                totals[label].append(spent[label])
        else:
            for label in order:
                with _cold_cache(keep, f"jobs-{jobs}", label, f"round-{r}") as cache:
                    totals[label].append(_build_set(sets[label], jobs, timeout, cache, times[label], label))
    out = {"jobs": jobs, "rounds": rounds, "load_average_before": round(load, 2), "sets": {}}
    for label in labels:
        rows = list(times[label].values())
        for row in rows:
            row["wall"], row["cpu"] = _summary(row["wall_s"]), _summary(row["cpu_s"])
        out["sets"][label] = {
            "rounds": [{"wall_s": round(w, 2), "cpu_s": round(c, 2)} for w, c in totals[label]],
            "wall": _summary([w for w, _ in totals[label]]),
            "cpu": _summary([c for _, c in totals[label]]),
            "failed": sum(not row["ok"] for row in rows),
            "programs": rows,
        }
    if "baseline" in sets:
        out["reduction"] = reduction(out["sets"]["baseline"], out["sets"]["current"])
    return out


def reduction(baseline: dict, current: dict) -> dict:
    """baseline / current: of the totals, and per program, by median and by minimum."""

    def ratios(old: dict, new: dict) -> dict:
        return {f"{kind}_{stat}": round(old[kind][stat] / new[kind][stat], 3)
                for kind in ("cpu", "wall") for stat in ("median", "min")
                if old.get(kind) and new.get(kind) and new[kind][stat]}

    old_rows = {row["program"]: row for row in baseline["programs"]}
    return {"total": ratios(baseline, current),
            "programs": {row["program"]: ratios(old_rows[row["program"]], row)
                         for row in current["programs"] if row["program"] in old_rows}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("programs", nargs="*", help="DSL files (default: examples/*.l2)")
    parser.add_argument("--jobs", type=int, nargs="+", default=[1], help="one pass per value")
    parser.add_argument("--rounds", type=int, default=1, help="cold builds of each program per pass")
    parser.add_argument("--gpu", default="h200")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per build")
    parser.add_argument("--baseline", help="sources an earlier commit lowered (--save-sources) to time alongside")
    parser.add_argument("--save-sources", help="write what the programs lower to here, and stop")
    parser.add_argument("--keep", type=Path, help="keep each cold cache under KEEP")
    parser.add_argument("-o", "--output")
    args = parser.parse_args(argv)
    if any(j < 1 for j in args.jobs) or args.rounds < 1:
        parser.error("--jobs and --rounds values must be at least 1")

    paths = args.programs or sorted((REPO / "examples").glob("*.l2"))
    gpu = get_gpu(args.gpu)
    named = [(Path(p).stem, source(parse_file(p), gpu)) for p in paths]
    if args.save_sources:
        save_sources(named, gpu.name, args.save_sources)
        return 0
    if not args.output:
        parser.error("-o is required unless --save-sources is given")
    try:
        toolchain = detect_toolchain()
    except ToolchainError as e:
        print(e, file=sys.stderr)
        return 1
    sets = {"current": named}
    baseline = None
    if args.baseline:
        baseline, earlier = load_sources(args.baseline)
        sets["baseline"] = [(n, s) for n, s in earlier if n in dict(named)]
    # the process-wide cap on nvcc processes is read once, at the first build
    os.environ["L2GEN_MAX_NVCC"] = str(max(args.jobs))
    run = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "command": shlex.join(["python3", "bench/build_times.py", *(argv if argv is not None else sys.argv[1:])]),
        "machine": machine(),
        "gpu": gpu.name,
        "nvcc_version": toolchain.nvcc_version,
        "cutlass_version": toolchain.cutlass_version,
        "baseline": baseline,
        "passes": [run_pass(sets, jobs, args.rounds, args.timeout, args.keep) for jobs in args.jobs],
    }
    write_results(run, args.output)
    return 1 if any(s["failed"] for p in run["passes"] for s in p["sets"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
