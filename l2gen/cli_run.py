"""The measuring commands of the CLI (sample, bench, tune, db), kept apart from the
compiler's. Each imports its stage only when it runs, so ``l2gen check`` stays fast."""

from __future__ import annotations

import json
from pathlib import Path

from .cli import EXIT_FAIL, EXIT_OK, eprint, fail
from .diagnostics import Diagnostic, DiagnosticError
from .ir import Span


def load_suite(path: str) -> list:
    """Shapes from a suite file: ``{"shapes": [{"m":.., "n":.., "k":..}, ...]}``."""
    from .search.base import Shape

    where = Span(path)
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise DiagnosticError([Diagnostic("E-SUITE", f"cannot read suite: {exc}", where)]) from None
    except json.JSONDecodeError as exc:
        raise DiagnosticError(
            [Diagnostic("E-SUITE", f"not JSON: {exc.msg}", Span(path, exc.lineno, exc.colno))]
        ) from None
    entries = data.get("shapes") if isinstance(data, dict) else data
    if not isinstance(entries, list) or not entries:
        raise DiagnosticError([Diagnostic("E-SUITE", "the suite has no 'shapes' list (or it is empty)", where)])
    shapes = []
    for i, e in enumerate(entries):
        try:
            m, n, k = (int(e[key]) for key in ("m", "n", "k"))
            if min(m, n, k) <= 0:
                raise ValueError("a dimension is not positive")
        except (KeyError, TypeError, ValueError) as exc:
            raise DiagnosticError(
                [Diagnostic("E-SUITE", f"shape #{i} is not {{m, n, k}} of positive integers: {e!r} ({exc})", where)]
            ) from None
        shapes.append(Shape(m, n, k))
    if len(set(shapes)) != len(shapes):
        eprint(f"{path}: duplicate shapes dropped")
        shapes = list(dict.fromkeys(shapes))
    return shapes


def _shapes(args) -> list:
    from .search.base import Shape

    shapes = []
    for text in args.shape or ():
        try:
            shapes.append(Shape.parse(text))
        except ValueError as exc:
            raise fail("E-SHAPE", str(exc)) from None
    if args.suite:
        shapes += load_suite(args.suite)
    if not shapes:
        raise fail("E-SHAPE", "no shapes: give --shape MxNxK or --suite FILE")
    return shapes


def cmd_sample(args) -> int:
    from .sample import compile_sample, write_report

    partial = {"done": 0, "total": 0, "failed": 0, "failures": []}

    def progress(done, total, result):
        state = "cached" if result.cached else ("ok" if result.ok else "FAILED: " + (result.error or ""))
        eprint(f"[{done}/{total}] {result.source.program.name} {state} ({result.seconds:.0f} s)")
        if args.out:  # a tally on disk as results land, so a run cut short still leaves evidence
            partial.update(done=done, total=total)
            if not result.ok:
                partial["failed"] += 1
                partial["failures"].append({"program": result.source.program.name, "error": result.error})
            Path(args.out + ".partial").write_text(json.dumps(partial, indent=1))

    report = compile_sample(args.count, args.seed, args.gpu, jobs=args.jobs, bundle=args.bundle, timeout=args.timeout, progress=progress)
    if args.out:
        write_report(report, args.out)
    print(f"{report.count} programs: {report.built} built ({report.cached} cached), {report.failed} failed, {report.wall_seconds} s wall")
    for fam, s in sorted(report.compile_seconds.items()):
        print(f"  {fam}: {s['n']} compiled, {s['min']}/{s['median']}/{s['max']} s min/median/max")
    for f in report.failures:
        eprint(f["error"])
        eprint(f"  reproduce: {f['command']}")
    return EXIT_OK if report.failed == 0 else EXIT_FAIL


def cmd_bench(args) -> int:
    from .bench import bench, format_table
    from .parse import parse_file
    from .runtime import device_count

    if device_count() == 0:
        raise fail("E-GPU", "no CUDA GPU found (or no driver for this CUDA runtime): bench needs one; 'l2gen build' and 'l2gen tune --simulate' do not")
    programs = []
    for path in args.files:
        programs.append(parse_file(path))
    if args.db:
        programs += _db_programs(args)
    if not programs:
        raise fail("E-USAGE", "no programs: give DSL files or --db")
    out = Path(args.out)
    plot = None if args.no_plot else out.with_suffix(".png")
    results = bench(programs, _shapes(args), args.gpu, out_json=out, plot_png=plot, reps=args.reps, seeds=args.seeds, jobs=args.jobs)
    print(format_table(results))
    print(f"results: {out}" + (f", plot: {plot}" if plot and plot.exists() else ""))
    failed = [r for r in results["rows"] if r["status"] != "ok"]
    if failed:
        eprint(f"{len(failed)} of {len(results['rows'])} program x shape rows did not pass (see the table)")
    return EXIT_FAIL if failed else EXIT_OK


def _db_programs(args) -> list:
    """The best program of every shape in a database, deduplicated by text."""
    from .db import KernelDB

    db = KernelDB(args.db, readonly=True)
    db.check_gpu(args.gpu)
    seen, out = set(), []
    for program, _speedup, _time_us in db.best_all(args.gpu).values():
        if program not in seen:
            seen.add(program)
            out.append(program)
    return out


def add_commands(sub) -> None:
    """Register sample, bench, tune and db."""
    p = sub.add_parser("sample", help="compile random valid programs; report counts and compile times")
    p.add_argument("--count", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-j", "--jobs", type=int, default=None)
    p.add_argument("--bundle", type=int, default=1, help="programs per translation unit")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("-o", "--out", help="write the JSON report here")
    p.set_defaults(func=cmd_sample)

    p = sub.add_parser("bench", help="verify and time programs against cuBLAS/cuBLASLt on shapes")
    p.add_argument("files", nargs="*", help="DSL programs")
    p.add_argument("--db", help="also bench the best program of each shape in this kernel database")
    p.add_argument("--shape", action="append", help="MxNxK (repeatable)")
    p.add_argument("--suite", help="a suite JSON file, e.g. suites/public.json")
    p.add_argument("--reps", type=int, default=50, help="timed runs per median (at least 30)")
    p.add_argument("--seeds", type=int, default=3, help="input sets verified per program")
    p.add_argument("-j", "--jobs", type=int, default=None, help="parallel nvcc jobs")
    p.add_argument("-o", "--out", default="bench-results.json")
    p.add_argument("--no-plot", action="store_true")
    p.set_defaults(func=cmd_bench)

    from .cli_tune import add_commands as add_tune_commands

    add_tune_commands(sub, _shapes)
