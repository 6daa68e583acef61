"""Cold build times of DSL programs (default: every example), in wall and CPU time.

Each pass builds every program's library (the one bench and tune build: knobs at their
defaults) into a fresh, empty build cache, so nothing is a cache hit:

- ``--jobs 1``: one nvcc at a time; each program's wall time and the CPU time (user +
  system) of its nvcc and everything nvcc ran (cicc, ptxas, the host compiler);
- ``--jobs N``: all programs at once, N nvcc processes at a time; the pass's wall and CPU
  time, and each program's nvcc wall time.

CPU time is what a build costs a busy machine; wall time depends on what else runs. The
load average before each pass is recorded beside it.

    python bench/build_times.py --jobs 1 16 -o build-times.json
    python bench/build_times.py examples/tiny_sm80.l2 --jobs 1 --baseline before.json -o after.json

``--baseline FILE`` (an earlier output of this script) is copied into the output under
"baseline", and "reduction" holds baseline / this run, per pass and per program.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shlex
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from l2gen.bench import git_commit, write_results  # noqa: E402
from l2gen.parse import parse_file  # noqa: E402
from l2gen.lower import lower  # noqa: E402
from l2gen.search.evaluate import build_program  # noqa: E402
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


def _row(name: str, source, result, cpu: float | None) -> dict:
    row = {
        "program": name,
        "family": source.program.family.value,
        "tile": str(source.program.config.tile),
        "flags": [f for f in source.flags if f.startswith("-D")],
        "ok": result.ok,
        "wall_s": round(result.seconds, 2),
    }
    if cpu is not None:
        row["cpu_s"] = round(cpu, 2)
    if not result.ok:
        row["error"] = result.error
    return row


def run_pass(named_sources: list[tuple[str, object]], jobs: int, timeout: float, keep: Path | None) -> dict:
    """Build every source into a fresh cache with ``jobs`` nvcc processes at a time (kept
    as ``keep``/jobs-N if ``keep`` is given)."""
    from l2gen.build import build, build_many

    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="l2gen-build-times.") as cache:
        if keep:
            cache = keep / f"jobs-{jobs}"
            if cache.exists() and any(cache.iterdir()):
                raise SystemExit(f"{cache} is not empty: a cold build needs an empty cache")
        os.environ["L2GEN_CACHE_DIR"] = str(cache)
        cpu0, wall0 = children_cpu(), time.monotonic()
        rows = []
        if jobs == 1:
            for name, source in named_sources:
                before = children_cpu()
                result = build(source, timeout=timeout)
                rows.append(_row(name, source, result, children_cpu() - before))
                print(f"[jobs 1] {name}: {rows[-1]['wall_s']} s wall, {rows[-1]['cpu_s']} s CPU"
                      + ("" if result.ok else f" FAILED: {result.error}"), file=sys.stderr)
        else:
            results = build_many([s for _, s in named_sources], jobs=jobs, timeout=timeout)
            rows = [_row(n, s, r, None) for (n, s), r in zip(named_sources, results)]
        wall, cpu = time.monotonic() - wall0, children_cpu() - cpu0
    print(f"[jobs {jobs}] total: {wall:.1f} s wall, {cpu:.1f} s CPU", file=sys.stderr)
    return {
        "jobs": jobs,
        "load_average_before": round(load, 2),
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "failed": sum(not r["ok"] for r in rows),
        "programs": rows,
    }


def reduction(baseline: dict, run: dict) -> dict:
    """baseline / run, per pass (by jobs) and, per program, for the passes that time each."""
    out = {}
    old = {p["jobs"]: p for p in baseline.get("passes", [])}
    for new in run["passes"]:
        before = old.get(new["jobs"])
        if not before:
            continue
        entry = {key: round(before[key] / new[key], 2) for key in ("wall_s", "cpu_s") if new[key]}
        per = {}
        old_rows = {r["program"]: r for r in before["programs"]}
        for row in new["programs"]:
            was = old_rows.get(row["program"])
            if was:
                per[row["program"]] = {k: round(was[k] / row[k], 2)
                                       for k in ("wall_s", "cpu_s") if k in row and k in was and row[k]}
        entry["programs"] = per
        out[f"jobs {new['jobs']}"] = entry
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("programs", nargs="*", help="DSL files (default: examples/*.l2)")
    parser.add_argument("--jobs", type=int, nargs="+", default=[1], help="one pass per value")
    parser.add_argument("--gpu", default="h200")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per build")
    parser.add_argument("--baseline", help="an earlier output of this script to compare with")
    parser.add_argument("--keep", type=Path, help="keep each pass's build cache in KEEP/jobs-N")
    parser.add_argument("-o", "--output", required=True)
    args = parser.parse_args(argv)
    if any(j < 1 for j in args.jobs):
        parser.error("--jobs values must be at least 1")

    paths = args.programs or sorted((REPO / "examples").glob("*.l2"))
    gpu = get_gpu(args.gpu)
    named = [(Path(p).stem, lower(build_program(parse_file(p)), gpu)) for p in paths]
    try:
        toolchain = detect_toolchain()
    except ToolchainError as e:
        print(e, file=sys.stderr)
        return 1
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
        "passes": [run_pass(named, jobs, args.timeout, args.keep) for jobs in args.jobs],
    }
    if args.baseline:
        baseline = json.loads(Path(args.baseline).read_text())
        baseline.pop("baseline", None)
        baseline.pop("reduction", None)
        run["baseline"] = baseline
        run["reduction"] = reduction(baseline, run)
    write_results(run, args.output)
    return 1 if any(p["failed"] for p in run["passes"]) else 0


if __name__ == "__main__":
    sys.exit(main())
