"""Compile a random sample of valid programs: the evidence behind "every accepted program
compiles". The nvcc tests run a small sample; ``l2gen sample`` runs as many as asked and
writes a report (counts, compile times, every failure with its log and command)."""

from __future__ import annotations

import json
import os
import platform
import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from .build import BuildResult, build_bundle, build_many
from .lower import lower
from .printer import format_program
from .space import random_program
from .targets import Gpu


@dataclass
class SampleReport:
    gpu: str
    seed: int
    count: int
    bundle: int
    date: str
    host: str
    wall_seconds: float = 0.0
    built: int = 0
    cached: int = 0
    failed: int = 0
    by_family: dict = field(default_factory=dict)
    compile_seconds: dict = field(default_factory=dict)  # per family: min/median/max
    failures: list = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)


def draw(count: int, seed: int, gpu: Gpu) -> list:
    """``count`` distinct valid programs, families alternating, layouts mixed."""
    rng = random.Random(seed)
    families = gpu.families()
    programs, seen = [], set()
    while len(programs) < count:
        family = families[len(programs) % len(families)]
        program = random_program(rng, gpu, family)
        text = format_program(program)
        if text not in seen:
            seen.add(text)
            programs.append(program)
    return programs


def compile_sample(
    count: int,
    seed: int,
    gpu: Gpu,
    *,
    jobs: int | None = None,
    bundle: int = 1,
    timeout: float = 900,
    progress: Callable[[int, int, BuildResult], None] | None = None,
) -> SampleReport:
    """Draw, lower and build ``count`` random valid programs; report what happened."""
    programs = draw(count, seed, gpu)
    sources = [lower(p, gpu) for p in programs]
    start = time.perf_counter()
    if bundle > 1:
        results = build_bundle(sources, max_size=bundle, jobs=jobs, timeout=timeout, progress=progress)
    else:
        results = build_many(sources, jobs=jobs, timeout=timeout, progress=progress)
    report = SampleReport(
        gpu=gpu.name,
        seed=seed,
        count=count,
        bundle=bundle,
        date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        host=f"{platform.node()} ({platform.machine()}, {_cores()} cores)",
        wall_seconds=round(time.perf_counter() - start, 1),
    )
    times: dict[str, list[float]] = {}
    for program, result in zip(programs, results):
        fam = program.family.value
        stats = report.by_family.setdefault(fam, {"built": 0, "failed": 0})
        if result.ok:
            stats["built"] += 1
            report.built += 1
            report.cached += result.cached
            if not result.cached:
                times.setdefault(fam, []).append(result.seconds)
        else:
            stats["failed"] += 1
            report.failed += 1
            report.failures.append(
                {"program": format_program(program), "error": result.error, "command": result.command, "log": result.log[-4000:]}
            )
    for fam, ts in times.items():
        report.compile_seconds[fam] = {
            "n": len(ts),
            "min": round(min(ts), 1),
            "median": round(statistics.median(ts), 1),
            "max": round(max(ts), 1),
        }
    return report


def _cores() -> int:
    return os.cpu_count() or 1


def write_report(report: SampleReport, path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(report.to_json())
