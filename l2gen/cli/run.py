"""The measuring commands of the CLI (sample, bench, tune, db), kept apart from the
compiler's. Each imports its stage only when it runs, so ``l2gen check`` stays fast."""

from __future__ import annotations

import json
from pathlib import Path

from .common import EXIT_FAIL, EXIT_OK, EXIT_USAGE, eprint, fail, off_target_card, recorded_best, target_of, usage
from ..diagnostics import Diagnostic, DiagnosticError
from ..ir import Span
from ..protocol import DEFAULT_GRAPH_CALLS, DEFAULT_L2, DEFAULT_QPS, L2_PROTOCOLS, MODES
from ..timing import DEFAULT_ROUNDS, MIN_REPS
from ..validate import at_least, dimension, output_file, positive_float, write_atomic


def load_suite(path: str) -> list:
    """Shapes from a suite file: ``{"shapes": [{"m":.., "n":.., "k":..}, ...]}``."""
    from ..problem import Shape

    where = Span(path)
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise DiagnosticError([Diagnostic("E-SUITE", f"cannot read suite: {exc}", where)]) from None
    except json.JSONDecodeError as exc:
        raise DiagnosticError(
            [Diagnostic("E-SUITE", f"not JSON: {exc.msg}", Span(path, exc.lineno, exc.colno))]
        ) from None
    except (ValueError, RecursionError) as exc:  # an integer too long to convert, nesting too deep
        raise DiagnosticError([Diagnostic("E-SUITE", f"not a usable JSON file: {str(exc)[:200]}", where)]) from None
    entries = data.get("shapes") if isinstance(data, dict) else data
    if not isinstance(entries, list) or not entries:
        raise DiagnosticError([Diagnostic("E-SUITE", "the suite has no 'shapes' list (or it is empty)", where)])
    shapes = []
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or not all(key in e for key in ("m", "n", "k")):
            raise DiagnosticError([Diagnostic("E-SUITE", f"shape #{i} is not an object with m, n and k", where)])
        try:
            m, n, k = (dimension(e[key], f"shape #{i}'s {key}", where) for key in ("m", "n", "k"))
        except DiagnosticError as exc:  # the same diagnostic, as a suite error (exit 1)
            raise DiagnosticError([Diagnostic("E-SUITE", d.message, d.span) for d in exc.diagnostics]) from None
        shapes.append(Shape(m, n, k))
    suite_layout(path)  # a 'b' that is not kn or nk, or mixed layouts: refused here too
    if len(set(shapes)) != len(shapes):
        eprint(f"{path}: duplicate shapes dropped")
        shapes = list(dict.fromkeys(shapes))
    return shapes


def suite_layout(path: str) -> str | None:
    """The B layout a suite's shapes name (``"b": "kn" | "nk"``), None if none does; a
    suite that mixes layouts is an error (one bench serves one layout)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError, RecursionError):
        return None  # load_suite reports it
    entries = data.get("shapes") if isinstance(data, dict) else data
    if not isinstance(entries, list):
        return None  # load_suite reports it
    found = {e.get("b") for e in entries or [] if isinstance(e, dict) and e.get("b") is not None}
    if not all(isinstance(b, str) for b in found) or len(found) > 1 or not found <= {"kn", "nk"}:
        raise DiagnosticError([Diagnostic("E-SUITE", f"the shapes' B layouts are {sorted(map(str, found))}: a suite "
                                          "must name one, kn or nk (split it to bench both)", Span(path))])
    return found.pop() if found else None


def _layout(args) -> str:
    """``--b``, else the suite's, else kn; a ``--b`` the suite contradicts is refused."""
    suite = suite_layout(args.suite) if args.suite else None
    if args.b and suite and args.b != suite:
        raise usage("E-USAGE", f"--b {args.b}, but {args.suite} holds {suite} shapes")
    return args.b or suite or "kn"


def _tune_layout(args) -> str:
    """The B layout a tune measures: ``--b``, else the suite's, else nk for
    ``--shapes-from`` (nn.Linear weights), else kn; sources that disagree are refused."""
    named = {}
    if args.b:
        named["--b"] = args.b
    if args.suite:
        layout = suite_layout(args.suite)
        if layout:
            named[args.suite] = layout
    if args.shapes_from:
        named["--shapes-from"] = "nk"
    if len(set(named.values())) > 1:
        raise usage("E-USAGE", "the B layouts disagree: " + ", ".join(f"{k} {v}" for k, v in named.items())
                    + " (one tune measures one layout)")
    return next(iter(named.values()), "kn")


def _protocol(args):
    """The bench's timing protocol from --mode, --l2, --qps, --graph-calls, --seed (exit 2
    if they do not make one)."""
    from ..protocol import Protocol, ProtocolError

    try:
        return Protocol(args.mode, args.l2, args.qps, args.graph_calls, args.seed)
    except ProtocolError as exc:
        raise usage("E-PROTOCOL", str(exc)) from None


def _shapes(args) -> list:
    from ..problem import Shape

    shapes = []
    for text in args.shape or ():
        try:
            shapes.append(Shape.parse(text))
        except ValueError as exc:
            raise usage("E-SHAPE", str(exc)) from None
    if args.suite:
        shapes += load_suite(args.suite)
    if getattr(args, "shapes_from", None):
        from .model import shapes_from_args

        shapes += shapes_from_args(args)
    elif getattr(args, "tokens", None):
        raise usage("E-USAGE", "--tokens without --shapes-from MODEL")
    if not shapes:
        raise fail("E-SHAPE", "no shapes: give --shape MxNxK or --suite FILE" + (" or --shapes-from MODEL" if hasattr(args, "shapes_from") else ""))
    return shapes


SAMPLE_MAX = 100_000  # programs one sample run compiles at most


def cmd_sample(args) -> int:
    from ..console import reporter
    from ..sample import compile_sample, write_report
    from ..toolchain import ToolchainError, detect_toolchain

    try:  # every program of the sample needs the compiler: find it before the first
        detect_toolchain()
    except ToolchainError as exc:
        raise fail("E-TOOLCHAIN", f"sample compiles programs: {exc}") from None
    if args.out:
        output_file(args.out, "-o")
        output_file(args.out + ".partial", "-o")
    partial = {"done": 0, "total": 0, "failed": 0, "failures": []}

    def progress(done, total, result):
        state = "cached" if result.cached else ("ok" if result.ok else "FAILED: " + (result.error or ""))
        bar.advance(f"[{done}/{total}] {result.source.program.name} {state} ({result.seconds:.0f} s)", ok=result.ok,
                    completed=done, total=total, note=result.source.program.name)
        if args.out:  # a tally on disk as results land, so a run cut short still leaves evidence
            partial.update(done=done, total=total)
            if not result.ok:
                partial["failed"] += 1
                partial["failures"].append({"program": result.source.program.name, "error": result.error})
            write_atomic(args.out + ".partial", json.dumps(partial, indent=1))

    with reporter() as live:
        bar = live.bar("compiling", args.count)
        report = compile_sample(args.count, args.seed, args.gpu, jobs=args.jobs, bundle=args.bundle, timeout=args.timeout, progress=progress)
        bar.done()
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
    from ..bench import bench
    from ..console import reporter, show
    from ..report import table_blocks
    from ..parse import parse_file
    from ..probes import ProbeError
    from ..runtime import device_count

    protocol = _protocol(args)
    b_layout = _layout(args)
    if args.sustained and protocol.mode != "events":
        raise fail("E-USAGE", f"--sustained times blocks of calls back to back, an events-mode measurement; "
                              f"this bench is timed in {protocol.describe()}")
    output_file(args.out, "-o")
    if not args.no_plot:
        output_file(Path(args.out).with_suffix(".png"), "-o (its plot)")
    if device_count() == 0:
        raise fail("E-GPU", "no CUDA GPU found (or no driver for this CUDA runtime): bench needs one; 'l2gen build' and 'l2gen tune --simulate' do not")
    card = off_target_card(args.gpu)
    if card is not None:
        own = target_of(card)
        eprint(f"[bench] timing on {card}, not on the {args.gpu.name} this bench targets: its results name the "
               f"{args.gpu.name} and the card they ran on, and no kernel database takes them (import-bench refuses "
               f"them)" + (f"; bench with --gpu {own} for rows a {own} database takes" if own else ""))
    programs = []
    for path in args.files:
        programs.append(parse_file(path))
    only = None
    shapes = _shapes(args) if (args.shape or args.suite or not args.db) else []
    if args.db:
        db_programs, own = _db_programs(args)
        programs += db_programs
        if not shapes:  # the database's own shapes
            shapes = list(own)
        if not args.db_all:  # each database program on the shape(s) it is the best for
            files = {p.name for p in programs} - {p.name for p in db_programs}
            only = {shape: own.get(shape, set()) | files for shape in shapes}
    names = [p.name for p in programs]
    if len(set(names)) != len(names):
        raise fail("E-USAGE", f"program names must be unique in a bench (repeated: {', '.join(sorted({n for n in names if names.count(n) > 1}))})")
    out = Path(args.out)
    plot = None if args.no_plot else out.with_suffix(".png")
    try:
        with reporter() as report:
            results = bench(programs, shapes, args.gpu, out_json=out, plot_png=plot, reps=args.reps, rounds=args.rounds,
                            seeds=args.seeds, jobs=args.jobs, only=only, protocol=protocol, b_layout=b_layout, progress=report,
                            sustained_ms=args.sustained or 0.0)
    except ProbeError as exc:
        raise fail("E-PROBES", f"cannot build the timing probes, without which nothing can be timed: {exc}") from None
    show(table_blocks(results))
    print(f"results: {out}" + (f", plot: {plot}" if plot and plot.exists() else ""))
    failed = [r for r in results["rows"] if r["status"] != "ok"]
    uncaptured = [r for r in failed if r["status"] == "capture_error"]
    if uncaptured:
        which = sorted({r["program"] for r in uncaptured})
        eprint(f"{len(uncaptured)} program x shape rows cannot run in a CUDA graph ({', '.join(which)}): graph mode "
               f"cannot time them; every other row is in {out}")
        return EXIT_USAGE
    if failed:
        eprint(f"{len(failed)} of {len(results['rows'])} program x shape rows did not pass (see the table)")
    return EXIT_FAIL if failed else EXIT_OK


def _db_programs(args) -> tuple[list, dict]:
    """The best program (``--top N``: the N best) of every shape in a database, one per
    distinct program (named after the first shape it ranks on, ``<name>_<M>x<N>x<K>``),
    and for each shape the names of its programs."""
    from dataclasses import replace

    from ..db import DatabaseError, KernelDB

    if args.top > 1:
        try:
            with KernelDB(args.db, readonly=True) as db:
                db.check_gpu(args.gpu)
                ranked = db.ranked(args.gpu, args.top)
        except DatabaseError as exc:
            raise fail("E-DB", str(exc)) from None
    else:
        ranked = {shape: [best] for shape, best in recorded_best(args).items()}
    named: dict = {}  # program (knobs included, name aside) -> its bench name
    taken: set = set()
    own: dict = {}
    for shape, programs in sorted(ranked.items()):
        for program, _speedup, _time_us in programs:
            key = replace(program, name="k")
            if key not in named:
                # a name benched this way before already ends in its shape: keep it, so that
                # re-benching a rebuilt database does not grow the names
                tag = f"{shape.m}x{shape.n}x{shape.k}"
                base = program.name if program.name.endswith(f"_{tag}") else f"{program.name}_{tag}"
                # two programs of one name (knob variants) ranking on one shape: number them
                name, i = base, 1
                while name in taken:
                    i += 1
                    name = f"{base}_{i}"
                taken.add(name)
                named[key] = replace(program, name=name)
            own.setdefault(shape, set()).add(named[key].name)
    return list(named.values()), own


def cmd_bench_dispatch(args) -> int:
    from ..dispatch_bench import bench_dispatch, format_table, write
    from ..probes import ProbeError

    try:
        import torch
    except ImportError:
        raise fail("E-TORCH", "bench-dispatch times l2gen.matmul against torch.matmul: install torch") from None
    if not torch.cuda.is_available():
        raise fail("E-GPU", "no CUDA GPU visible to torch: bench-dispatch needs one")
    shapes = _shapes(args)
    if args.out:
        output_file(args.out, "-o")
    try:
        results = bench_dispatch(shapes, args.db, reps=args.reps, rounds=args.rounds, tolerance=args.tolerance, progress=eprint, l2=args.l2,
                                 b_layout=_layout(args), rotate=args.rotate)
    except ProbeError as exc:
        raise fail("E-PROBES", f"cannot build the timing probes: {exc}") from None
    except RuntimeError as exc:
        raise fail("E-GPU", str(exc)) from None
    if args.out:
        write(results, args.out)
    print(format_table(results))
    return EXIT_OK if results["ok"] else EXIT_FAIL


def cmd_compare(args) -> int:
    from ..compare import compare_db, compare_results
    from ..console import show
    from ..protocol import Protocol, ProtocolError, ProtocolMismatch

    from ..schema import read_results

    if args.out:
        output_file(args.out, "-o")

    def load(path):
        doc = read_results(path)
        try:
            Protocol.of(doc)
        except ProtocolError as exc:
            raise usage("E-PROTOCOL", f"{path}: {exc}") from None
        return doc

    try:
        if args.db:
            if len(args.files) != 1:
                raise fail("E-USAGE", "with --db give one bench results file: l2gen compare --db KERNELS.db RESULTS.json")
            results = load(args.files[0])
            protocol = Protocol.of(results)
            if protocol.mode != "events":
                raise ProtocolMismatch(f"{args.files[0]} was timed in {protocol.describe()}; a kernel database's speedups "
                                       "were timed in events mode")
            comparison = compare_db(recorded_best(args, protocol.l2), results, tolerance=args.tolerance, names=(args.db, args.files[0]))
        else:
            if len(args.files) != 2:
                raise fail("E-USAGE", "give two bench results files: l2gen compare FIRST.json SECOND.json")
            first, second = (load(f) for f in args.files)
            comparison = compare_results(first, second, tolerance=args.tolerance, names=tuple(args.files))
    except ProtocolMismatch as exc:
        raise usage("E-PROTOCOL", str(exc)) from None
    show(comparison.blocks(all_rows=args.all))
    if args.out:
        data = {"first": comparison.first, "second": comparison.second, "tolerance": comparison.tolerance,
                "summary": comparison.summary(), "ok": comparison.ok,
                "pairs": [{"m": p.shape.m, "n": p.shape.n, "k": p.shape.k, "program": p.what, "first": p.first,
                           "second": p.second, "change": p.change} for p in comparison.pairs]}
        write_atomic(args.out, json.dumps(data, indent=1) + "\n")
    return EXIT_OK if comparison.ok else EXIT_FAIL


def _protocol_options(p) -> None:
    """The timing protocol's options (see l2gen.protocol)."""
    p.add_argument("--l2", choices=L2_PROTOCOLS, default=DEFAULT_L2,
                   help="the L2 before each timed run: clean (a read pass over 4x the L2 leaves it holding clean lines of "
                   "other data, as in a model; the default), dirty (a written flush: every result before the protocol was "
                   "recorded), warm (no flush)")
    p.add_argument("--mode", choices=MODES, default="events",
                   help="events: one call between two events (default); graph: calls back to back in a CUDA graph over "
                   "rotated inputs, time per call = replay / calls; server: Poisson arrivals at --qps, event and wall time per call")
    p.add_argument("--qps", type=float, default=None, help=f"server mode: calls per second (default {DEFAULT_QPS:g})")
    p.add_argument("--graph-calls", type=int, default=None,
                   help=f"graph mode: the most calls per graph (default {DEFAULT_GRAPH_CALLS}; slow shapes get fewer, about 10 ms a replay)")
    p.add_argument("--seed", type=int, default=0, help="server mode: the seed of the call order and the gaps")


def add_commands(sub) -> None:
    """Register sample, bench, tune and db."""
    p = sub.add_parser("sample", help="compile random valid programs; report counts and compile times")
    p.add_argument("--count", type=at_least(1, SAMPLE_MAX), default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-j", "--jobs", type=at_least(1), default=None)
    p.add_argument("--bundle", type=at_least(1), default=1, help="programs per translation unit")
    p.add_argument("--timeout", type=positive_float, default=900)
    p.add_argument("-o", "--out", help="write the JSON report here")
    p.set_defaults(func=cmd_sample)

    p = sub.add_parser("bench", help="verify and time programs against cuBLAS/cuBLASLt on shapes")
    p.add_argument("files", nargs="*", help="DSL programs")
    p.add_argument("--db", help="also bench the best program of each shape in this kernel database, on that shape "
                   "(and, without --shape/--suite, on the database's shapes only)")
    p.add_argument("--db-all", action="store_true", help="run every --db program on every shape")
    p.add_argument("--top", type=at_least(1), default=1, metavar="N",
                   help="with --db: each shape's N best programs (each judged by its least favourable run)")
    p.add_argument("--shape", action="append", help="MxNxK (repeatable)")
    p.add_argument("--suite", help="a suite JSON file, e.g. suites/public.json")
    p.add_argument("--reps", type=at_least(MIN_REPS), default=50, help=f"timed runs per median and round (at least {MIN_REPS})")
    p.add_argument("--rounds", type=at_least(1), default=DEFAULT_ROUNDS,
                   help="timing rounds per shape, each on freshly allocated buffers; the median pools them")
    p.add_argument("--seeds", type=at_least(1), default=3, help="input sets verified per program")
    p.add_argument("--sustained", type=positive_float, default=None, metavar="MS",
                   help="also time every program and baseline back to back, in rotated blocks of MS milliseconds "
                        "(6 each; 100 is enough for clocks and power to settle): the time per call a model's loop of "
                        "GEMMs sees; 'l2gen db import-bench' then judges rows from 20 us by it")
    p.add_argument("-j", "--jobs", type=at_least(1), default=None, help="parallel nvcc jobs")
    p.add_argument("-o", "--out", default="bench-results.json")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--b", choices=("kn", "nk"), default=None,
                   help="B's layout: kn (C = A @ B) or nk (C = A @ W.T); default: the suite's 'b', else kn")
    _protocol_options(p)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("compare", help="do the speedups of one bench run reproduce in another (or a database's records)?")
    p.add_argument("files", nargs="+", help="two bench results files (one with --db)")
    p.add_argument("--db", help="compare this kernel database's recorded best speedups with one bench results file")
    p.add_argument("--tolerance", type=positive_float, default=0.03, help="largest relative change that counts as reproduced")
    p.add_argument("--all", action="store_true", help="list every pair, not only those that moved")
    p.add_argument("-o", "--out", help="write the comparison as JSON here")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("bench-dispatch", help="time l2gen.matmul against torch.matmul per shape (device and wall time per call)")
    p.add_argument("--db", required=True, help="the kernel database the dispatcher serves from")
    p.add_argument("--shape", action="append", help="MxNxK (repeatable)")
    p.add_argument("--suite", help="a suite JSON file, e.g. suites/public.json")
    p.add_argument("--b", choices=("kn", "nk"), default=None,
                   help="how B is stored: kn (a @ b) or nk (a @ w.t(), an nn.Linear weight; default: the suite's, else kn)")
    p.add_argument("--reps", type=at_least(MIN_REPS), default=200, help="event-timed calls per median")
    p.add_argument("--rounds", type=at_least(1), default=15, help="back-to-back loops per wall-time median")
    p.add_argument("--tolerance", type=positive_float, default=0.03, help="largest slowdown that counts as noise")
    p.add_argument("--l2", choices=L2_PROTOCOLS, default=DEFAULT_L2,
                   help="the L2 before each event-timed call (default clean), and the protocol whose winners the dispatcher serves")
    p.add_argument("--rotate", action="store_true",
                   help="the wall-time loops take turns over copies of A and B that keep each out of the L2 between "
                        "its uses, as a model's layers each read their own weights")
    p.add_argument("-o", "--out", help="write the results as JSON here")
    p.set_defaults(func=cmd_bench_dispatch)

    from .tune import add_commands as add_tune_commands

    add_tune_commands(sub, _shapes, _tune_layout)
