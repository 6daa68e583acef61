"""The kernel library: a fixed set of compile-time configurations per GPU, built once, whose
run-time knobs adapt each of them to any shape.

A library is a folder of DSL files, one configuration each: the one shipped for a GPU is
``l2gen/data/library/<gpu>/`` (the configurations that won or came close on the public,
LLM decode, M = 256, split-K and large-shape benchmarks). ``l2gen build --library`` builds it (parallel, cached:
the builds bench, tune and the dispatcher reuse). ``l2gen tune --library`` then measures,
for each shape, the library's knob settings that the cost model ranks first (split count,
decomposition, raster, block swizzle) before its policy proposes new configurations: with
the library built those cost a launch each, not a compile.

Knob settings come from the family's run-time slots of :data:`l2gen.space.SLOTS`; the
checker judges each, and a split count above the shape's K tiles (which the kernels refuse
at run time) is left out, and so is a grid cap at or above the CTAs the launch uses anyway.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path
from typing import Callable, Sequence

from ..check import check
from ..diagnostics import Diagnostic, DiagnosticError
from ..ir import BLayout, Knobs, Program, Span
from ..lower import build_key
from ..parse import parse_file
from ..printer import format_program
from ..problem import Shape, program_key
from ..space import SLOTS, assemble, choices_of, sanitize, splits_apply, without_idle_cap
from ..targets import Gpu
from .simulate import model_us

LIBRARY_ROOT = Path(__file__).parent.parent / "data" / "library"


def library_dir(gpu: Gpu) -> Path:
    """The folder of the library shipped for ``gpu`` (it may not exist)."""
    return LIBRARY_ROOT / gpu.name


def load(gpu: Gpu, folder: str | Path | None = None) -> list[Program]:
    """The library's configurations for ``gpu``, its knobs at their defaults, one per
    compile-time configuration (a file that differs from an earlier one only in knobs or
    name is left out). A file that does not parse or that the checker rejects raises
    :class:`DiagnosticError` naming it; so does a missing or empty folder."""
    where = Path(folder) if folder is not None else library_dir(gpu)
    files = sorted(where.glob("*.l2")) if where.is_dir() else []
    if not files:
        shipped = ", ".join(sorted(p.name for p in LIBRARY_ROOT.iterdir() if p.is_dir())) if LIBRARY_ROOT.is_dir() else ""
        raise DiagnosticError([Diagnostic(
            "E-LIBRARY", f"no kernel library (*.l2 files) here" + (f"; libraries are shipped for: {shipped}" if shipped else ""),
            Span(str(where)))])
    programs, seen, problems = [], set(), []
    for path in files:
        try:
            program = parse_file(path)
        except DiagnosticError as exc:
            problems.extend(exc.diagnostics)
            continue
        errors = [d for d in check(program, gpu) if d.is_error]
        if errors:
            problems.extend(errors)
            continue
        key = build_key(program)
        if key not in seen:
            seen.add(key)
            programs.append(replace(program, knobs=Knobs()))
    if problems:
        raise DiagnosticError(problems)
    return programs


def knob_settings(program: Program, shape: Shape, gpu: Gpu) -> list[Program]:
    """Every setting of ``program``'s run-time knobs that the checker accepts and that can
    run ``shape``: the same library, launched differently. Splits only where the
    configuration splits K, and no more of them than the shape has K tiles."""
    runtime = [slot for slot in SLOTS[program.family] if slot.runtime]
    base = choices_of(program)
    k_tiles = -(-shape.k // program.config.tile.k)
    splitting = splits_apply(program.config)
    out, seen = [], set()
    for values in itertools.product(*(slot.choices for slot in runtime)):
        choices = dict(base, **{slot.name: v for slot, v in zip(runtime, values)})
        splits = choices.get("splits", 1)
        if splits > k_tiles or (splits != 1 and not splitting):
            continue
        candidate = sanitize(assemble(program.family, choices, b_layout=program.b_layout, name=program.name))
        # a cap over what the launch uses is the uncapped setting again (dropped as seen below)
        candidate = without_idle_cap(candidate, shape.m, shape.n, shape.k)
        text = format_program(candidate)
        if text in seen or any(d.is_error for d in check(candidate, gpu)):
            continue
        seen.add(text)
        out.append(candidate)
    return out


def ranked(programs: Sequence[Program], shape: Shape, gpu: Gpu, n: int, *, b_layout: BLayout | None = None,
           exclude: set[str] | frozenset[str] = frozenset(),
           score: Callable[[Sequence[Program], Shape], Sequence[float]] | None = None) -> list[Program]:
    """``n`` knob settings of ``programs`` (of ``b_layout``, if given) for ``shape``, in the
    order a cost model expects them fastest (``score``: predicted µs of programs on a
    shape, e.g. a :class:`~l2gen.search.learned.LearnedModel`'s ``predict_us``; default the
    analytic model), one configuration at a time: every
    configuration's best setting first (fastest configuration first), then every one's
    second best, and so on, so that a model wrong about one configuration costs one
    measurement, not the batch. None whose :func:`~l2gen.problem.program_key` is in
    ``exclude``."""
    return [program for program, _ in predictions(programs, shape, gpu, n, b_layout=b_layout, exclude=exclude, score=score)]


def predictions(programs: Sequence[Program], shape: Shape, gpu: Gpu, n: int, *, b_layout: BLayout | None = None,
                exclude: set[str] | frozenset[str] = frozenset(),
                score: Callable[[Sequence[Program], Shape], Sequence[float]] | None = None) -> list[tuple[Program, float]]:
    """:func:`ranked`'s knob settings, each with the µs the model predicts for it."""
    if score is None:
        def score(candidates, shape):
            return [model_us(c, shape, gpu) for c in candidates]

    groups = []
    for program in programs:
        if b_layout is not None and program.b_layout is not b_layout:
            continue
        settings = [s for s in knob_settings(program, shape, gpu) if program_key(s) not in exclude]
        if settings:
            times = score(settings, shape)
            groups.append(sorted(((t, i, s) for i, (t, s) in enumerate(zip(times, settings))), key=lambda t: t[:2]))
    groups.sort(key=lambda g: g[0][0])
    out = []
    for depth in range(max((len(g) for g in groups), default=0)):
        out.extend((g[depth][2], g[depth][0]) for g in groups if depth < len(g))
        if len(out) >= n:
            break
    return out[:n]
