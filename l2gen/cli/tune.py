"""``l2gen tune`` and ``l2gen db``: the search and its database on the command line."""

from __future__ import annotations

import json
from pathlib import Path

from .common import EXIT_FAIL, EXIT_OK, card_name, eprint, fail, usage
from .model import add_model_options
from ..protocol import DEFAULT_L2, L2_PROTOCOLS
from ..targets import is_card
from ..timing import DEFAULT_ROUNDS, MIN_REPS
from ..validate import at_least, fraction, gemm_shape, output_file, positive_float, write_atomic


def _learned_model(args):
    """A cost model learned from measurements where there are enough (None: the analytic
    model ranks): this run's database, the serving database and the measured rows shipped
    for the GPU (same protocol; both B layouts, whose costs the model's features tell apart).
    The rows of many shapes are what make it rank an unseen shape well: fit on the serving
    database's decode and split-K rows alone it ranked other shapes below the analytic
    model (bench/results/2026-12-04-cpu-learned-transfer.txt)."""
    from ..db import DatabaseError, KernelDB
    from ..dispatch import default_db_path
    from ..search.learned import MIN_ROWS, LearnedModel, measured_db_path

    paths = [Path(args.db)]
    for shipped in (default_db_path(args.gpu), measured_db_path(args.gpu)):
        if shipped is not None and all(shipped.resolve() != p.resolve() for p in paths):
            paths.append(shipped)
    dbs = []
    try:
        for path in paths:  # rows of another protocol do not count: the lookups ask for args.l2
            if path.is_file():
                dbs.append(KernelDB(path, readonly=True))
        model = LearnedModel.from_dbs(dbs, args.gpu, l2=args.l2)
    except DatabaseError as exc:
        eprint(f"[tune] cost model: no learned ranking ({exc}); the analytic model ranks the library")
        return None
    finally:
        for db in dbs:
            db.close()
    if model is None:
        eprint(f"[tune] cost model: fewer than {MIN_ROWS} measurements to learn from; the analytic model ranks the library")
    else:
        eprint(f"[tune] cost model: the library ranked by a model learned from {len(model)} measurements")
    return model


RANKED_IN_PROMPT = 5  # the cost model's first knob settings an LLM policy's prompt shows


def _rank_for_the_llm(args, policy, programs, model) -> None:
    """Give an LLM policy (alone or wrapped) the cost model's ranking of the kernel
    library (``programs``; none given: the one shipped for the GPU, if any) for each shape
    it is asked about: the same order the library's first proposals follow."""
    from ..diagnostics import DiagnosticError
    from ..ir import BLayout
    from ..search.library import load, predictions
    from ..search.llm import LLMPolicy

    llm = getattr(policy, "inner", policy)
    if not isinstance(llm, LLMPolicy):
        return
    if not programs:
        try:
            programs = load(args.gpu)
        except DiagnosticError:  # none shipped: no ranking
            return
    score = model.predict_us if model is not None else None
    layout = BLayout(args.b_layout)
    llm.ranking = lambda shape: predictions(programs, shape, args.gpu, RANKED_IN_PROMPT, b_layout=layout, score=score)


def _policy(args):
    from ..ir import BLayout
    from ..search.policies import EmbeddedPolicy, RandomPolicy

    layout = BLayout(args.b_layout)
    if args.policy == "random":
        return RandomPolicy(args.gpu, seed=args.seed, b_layout=layout)
    if args.policy == "embedded":
        from ..search.policies import shipped_policy

        state = args.policy_state if args.policy_state and Path(args.policy_state).exists() else None
        if state is None and not args.fresh_policy:
            state = shipped_policy(args.gpu)  # start from what was learned on this GPU
            if state is not None:
                eprint(f"[tune] embedded policy: starting from the trained state shipped for {args.gpu.name} (--fresh-policy to start from zero)")
        if state is not None:
            try:
                return EmbeddedPolicy.load(state, gpu=args.gpu, seed=args.seed, b_layout=layout)
            except (OSError, ValueError) as exc:
                raise fail("E-POLICY", f"{state}: {exc}") from None
        return EmbeddedPolicy(args.gpu, seed=args.seed, b_layout=layout)
    from ..search.llm import LLMConfig, LLMConfigError, LLMPolicy

    try:
        config = LLMConfig.from_env(base_url=args.llm_base_url, model=args.llm_model, mode=args.llm_mode)
    except LLMConfigError as exc:
        raise fail("E-LLM", str(exc)) from None
    return LLMPolicy(config, args.gpu, seed=args.seed)


def measured_on(gpu, device_info=None) -> dict:
    """The card a tune measures on, for the env of every row it writes (``device``), and a
    warning where that card is not the target whose limits the checker applies and under
    whose name the rows are filed (an H100 lent for an H200 tune: its rows say so)."""
    name = card_name(device_info)
    if name is None:  # no name to record: the rows go without it, as before
        return {}
    if not is_card(gpu, name):
        eprint(f"[tune] measuring on {name}, not on the {gpu.name} this tune targets: its rows are filed under "
               f"{gpu.name} and record the card they ran on (env 'device')")
    return {"device": name}


def _evaluator(args):
    if args.simulate:
        from ..search.simulate import SimulatedEvaluator

        return SimulatedEvaluator(args.gpu, l2=args.l2)
    from ..baselines import ShimError, build_shim
    from ..probes import ProbeError, build_probes
    from ..runtime import device_count
    from ..search.evaluate import DeviceEvaluator, worker_runner
    from ..worker import Worker

    if device_count() == 0:
        raise fail("E-GPU", "no CUDA GPU found; use --simulate to run the search against the analytic model")
    try:
        shim = str(build_shim())
    except ShimError as exc:
        raise fail("E-BASELINE", f"cannot build the cuBLAS baseline shim: {exc}") from None
    try:
        probes = str(build_probes())
    except ProbeError as exc:
        raise fail("E-PROBES", f"cannot build the timing probes: {exc}") from None
    progress = (lambda d, t, r: eprint(f"  [build {d}/{t}] {r.source.program.name}: {'ok' if r.ok else 'FAILED'}")) if args.verbose else None
    runner = worker_runner(Worker(), shim=shim, b_layout=args.b_layout, gpu=args.gpu, reps=args.reps, rounds=args.rounds, l2=args.l2,
                           probes=probes, sustained_ms=args.sustained or 0.0)
    from ..db import collect_env

    env = {**collect_env(), **measured_on(args.gpu)}
    return DeviceEvaluator(args.gpu, runner, jobs=args.jobs, progress=progress, bundle=args.bundle, l2=args.l2, env=env)


def cmd_tune(args, shapes_of, layout_of) -> int:
    from ..console import reporter, show
    from ..db import DEFAULT_DB, SIMULATED_DB, DatabaseError, EvidenceMismatchError, KernelDB, ProtocolMismatchError
    from ..problem import unserved
    from ..search.loop import TuneError, tune

    args.b_layout = layout_of(args)
    shapes = shapes_of(args)
    for shape in shapes:  # before the database is opened (or made)
        why = unserved(shape)
        if why:
            raise fail("E-TUNE", f"cannot tune {shape}: {why}")
    if args.simulate and args.sustained:
        raise usage("E-USAGE", "--sustained times calls back to back on a GPU; the analytic model (--simulate) has no "
                               "back-to-back time")
    if args.db is None:  # simulated rows never land beside measured ones
        args.db = SIMULATED_DB if args.simulate else DEFAULT_DB
    for option, path in (("--curves", args.curves), ("--policy-state", args.policy_state)):
        if path:  # before the work: a run must not end unable to write what it learned
            output_file(path, option)
    policy = _policy(args)  # a policy that cannot be made (an LLM not configured) before any file is touched
    programs = []
    if args.library is not None:  # the library's knob settings first: launches of libraries already built
        from ..ir import BLayout
        from ..search.library import load
        from ..search.library_first import LibraryFirst

        programs = load(args.gpu, args.library or None)  # a bad file: its diagnostics, exit 1
        policy = LibraryFirst(policy, programs, args.gpu, budget=args.budget, share=args.library_share,
                              b_layout=BLayout(args.b_layout))
        eprint(f"[tune] kernel library: {len(programs)} configurations; up to {policy.quota} of each shape's "
               f"{args.budget} candidates are their knob settings")
    try:  # before anything is built: a database of another protocol cannot take this run's rows
        with KernelDB(args.db) as db:
            db.check_gpu(args.gpu)
            db.check_l2(args.l2)
            db.check_evidence("simulated" if args.simulate else "measured")
    except ProtocolMismatchError as exc:
        raise usage("E-PROTOCOL", f"{exc} (this tune times with --l2 {args.l2})") from None
    except EvidenceMismatchError as exc:
        raise usage("E-EVIDENCE", f"{exc} (this tune {'simulates' if args.simulate else 'measures on a GPU'})") from None
    except DatabaseError as exc:
        raise fail("E-DB", str(exc)) from None
    ranks = args.library is not None or args.policy == "llm"
    model = _learned_model(args) if ranks and not args.simulate else None
    if args.library is not None:
        policy.model = model
    _rank_for_the_llm(args, policy, programs, model)
    if args.library is not None and args.model_gate is not None:  # after the library, compile only what may gain
        from ..search.model_gate import ModelGated

        policy = ModelGated(policy, args.gpu, slack=args.model_gate, score=model.predict_us if model is not None else None)
        eprint(f"[tune] new configurations compiled only where the cost model expects them within {args.model_gate:.0%} "
               f"of the shape's best (--model-gate)")
    if args.grid:  # last: every proposal, the library's included, kept under the cap
        from ..search.grid_cap import GridCapped

        policy = GridCapped(policy, args.grid)
        eprint(f"[tune] launches kept to at most {args.grid} CTAs (knob grid); kernels that launch a CTA per tile are left out")
    evaluator = _evaluator(args)
    try:
        with KernelDB(args.db) as db, reporter() as report:
            summary = tune(shapes, policy, evaluator, db, budget=args.budget, batch=args.batch, gpu=args.gpu, parallel=args.parallel,
                           progress=report, b_layout=args.b_layout)
    except DatabaseError as exc:
        raise fail("E-DB", f"{exc}; every measurement committed before it is kept") from None
    except (ValueError, TuneError) as exc:
        raise fail("E-TUNE", str(exc)) from None
    except Exception as exc:  # an LLM policy that cannot go on (auth, unknown model, ...)
        if type(exc).__name__ != "LLMError":
            raise
        eprint(f"[tune] the LLM policy stopped: {exc}; every measurement so far is in {args.db}")
        return EXIT_FAIL
    show(summary.blocks())
    if args.grid:
        eprint(f"[tune] {policy.left_out} proposals left out: their kernels cannot keep to grid {args.grid}")
    if hasattr(policy, "stats"):
        print("llm usage:", json.dumps(policy.stats.as_dict()))
    written = True
    if args.policy == "embedded" and args.policy_state:
        written &= _write(args.policy_state, "--policy-state", lambda: json.dumps(policy.state(), indent=1))
    if args.curves:
        curves = {str(s): r.curve for s, r in summary.results.items()}
        written &= _write(args.curves, "--curves", lambda: json.dumps({"policy": args.policy, "gpu": args.gpu.name, "budget": args.budget, "curves": curves}, indent=1))
    if summary.interrupted:
        return 130
    return EXIT_OK if written else EXIT_FAIL


def _gate(text: str) -> float | None:
    """An argparse ``type=`` for --model-gate: a share from 0 to 1, or 'off' (None)."""
    return None if text.strip().lower() == "off" else fraction(text)


_gate.__name__ = "gate"


def _write(path: str, option: str, text) -> bool:
    """Write an output of a finished run (atomically); on failure say so, keep going."""
    try:
        write_atomic(path, text())
    except OSError as exc:
        eprint(f"l2gen: E-OUTPUT: {option} {path}: cannot write: {exc.strerror or exc} (every measurement is in the database)")
        return False
    print(f"{option[2:].replace('-', ' ')}: {path}")
    return True


def cmd_db(args) -> int:
    from ..db import DatabaseError, EvidenceMismatchError, KernelDB, ProtocolMismatchError

    if args.action == "export":
        output_file(args.file, "export")
    try:
        with KernelDB(args.db, readonly=args.action in ("show", "export")) as db:
            _db_action(args, db)
    except ProtocolMismatchError as exc:
        raise usage("E-PROTOCOL", str(exc)) from None
    except EvidenceMismatchError as exc:
        raise usage("E-EVIDENCE", str(exc)) from None
    except DatabaseError as exc:
        raise fail("E-DB", str(exc)) from None
    return EXIT_OK


def _db_action(args, db) -> None:
    """What ``l2gen db ACTION`` does to an open database."""
    from ..printer import format_program

    if args.action == "show":
        best = db.best_all(args.gpu)
        print(f"{args.db}: {db.count()} measurements (l2 {db.l2 or 'none yet'}), best programs for {len(best)} shapes on {args.gpu.name}")
        for shape, (program, speedup, time_us) in sorted(best.items()):
            print(f"  {str(shape):>20}  {time_us:9.1f} us  {speedup:5.2f}x  {program.name}")
            if args.verbose:
                print("    " + format_program(program).replace("\n", "\n    "))
    elif args.action == "export":
        n = db.export_json(args.file)
        print(f"exported {n} measurements to {args.file}")
    elif args.action == "import-bench":
        n = db.import_bench(args.file, skip=args.skip_shape or ())
        skipped = f" (left out: {', '.join(map(str, args.skip_shape))})" if args.skip_shape else ""
        print(f"added {n} measured rows from {args.file}{skipped}")
    else:
        n = db.import_json(args.file)
        print(f"imported {n} measurements from {args.file}")


def cmd_curves(args) -> int:
    from ..curves import compare_runs, curves_from_db, format_comparison, label_of, plot_comparison
    from ..db import DatabaseError, KernelDB

    for option, path in (("-o", args.out), ("--plot", args.plot)):
        if path:
            output_file(path, option)
    runs = {}
    try:
        for path in args.dbs:
            with KernelDB(path, readonly=True) as db:
                db.check_gpu(args.gpu)
                name = label_of(path, db)
                runs[name if name not in runs else path] = curves_from_db(db, args.gpu, budget=args.budget)
    except DatabaseError as exc:
        raise fail("E-DB", str(exc)) from None
    budget = args.budget or min((len(c) for run in runs.values() for c in run.values()), default=0)
    if budget <= 0:
        raise fail("E-DB", "no measurements to draw curves from")
    result = compare_runs(runs, budget)
    print(format_comparison(result))
    if args.out:
        curves = {name: {str(s): c for s, c in run.items()} for name, run in runs.items()}
        write_atomic(args.out, json.dumps({"gpu": args.gpu.name, **result, "curves": curves}, indent=1) + "\n")
    if args.plot and not plot_comparison(runs, result, args.plot):
        eprint("matplotlib is not installed: no plot (pip install 'l2gen[plot]')")
    return EXIT_OK


def add_commands(sub, shapes_of, layout_of) -> None:
    """Register tune, curves and db; ``shapes_of(args)`` gives a tune's shapes and
    ``layout_of(args)`` their B layout (:mod:`l2gen.cli.run` reads the suites)."""
    p = sub.add_parser("tune", help="search for the fastest programs per shape (RL over the DSL)")
    p.add_argument("--shape", action="append", help="MxNxK (repeatable)")
    p.add_argument("--suite", help="a suite JSON file")
    p.add_argument("--shapes-from", metavar="MODEL", help="the GEMM shapes of a model's Linear layers at --tokens (see 'l2gen shapes'); "
                   "B stored N x K")
    add_model_options(p, required=False)
    p.add_argument("--b", choices=("kn", "nk"), default=None,
                   help="B's layout: kn (C = A @ B) or nk (C = A @ W.T, an nn.Linear weight); default: the suite's 'b', "
                   "nk with --shapes-from, else kn")
    p.add_argument("--budget", type=at_least(1), default=32, help="measured candidates per shape (of the tuned B layout)")
    p.add_argument("--batch", type=at_least(1), default=8, help="candidates proposed per step")
    p.add_argument("--parallel", type=at_least(1), default=1, help="shapes tuned at once (one shape's builds overlap another's measurement)")
    p.add_argument("--policy", choices=("embedded", "random", "llm"), default="embedded")
    p.add_argument("--policy-state", help="embedded policy state (JSON): loaded if present, saved after the run "
                   "(without it the embedded policy starts from the state shipped for the GPU, if any)")
    p.add_argument("--fresh-policy", action="store_true", help="start the embedded policy from zero, not from a shipped state")
    p.add_argument("--db", default=None, help="kernel database (SQLite); resumes from it (default l2gen-kernels.db, "
                   "with --simulate l2gen-kernels-simulated.db: simulated rows never share a database with measured ones)")
    p.add_argument("--library", nargs="?", const="", default=None, metavar="FOLDER",
                   help="measure the kernel library's knob settings first (the one shipped for the GPU, or FOLDER's "
                        "*.l2 files): no compile where 'l2gen build --library' built it")
    p.add_argument("--library-share", type=fraction, default=0.5, help="the most of each shape's budget the library takes (default 0.5)")
    p.add_argument("--model-gate", type=_gate, default=0.05, metavar="SLACK|off",
                   help="with --library: compile a new configuration only where the cost model predicts it within SLACK "
                        "(a share, default 0.05) of the shape's best measured program; a shape with none left stops early. "
                        "'off': compile whatever the policy proposes")
    p.add_argument("--grid", type=at_least(1), default=None, metavar="N",
                   help="tune launches of at most N CTAs (the knob grid), as a dispatcher with the same cap serves them "
                        "(use_db(grid=N), L2GEN_GRID): each proposal capped, or left out where its kernel launches a CTA per tile")
    p.add_argument("--simulate", action="store_true", help="measure on the analytic H200 model instead of a GPU")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reps", type=at_least(MIN_REPS), default=50, help="timed runs per median and round")
    p.add_argument("--rounds", type=at_least(1), default=DEFAULT_ROUNDS, help="timing rounds, each on fresh buffers (as l2gen bench)")
    p.add_argument("--sustained", type=positive_float, default=None, metavar="MS",
                   help="also time every candidate and baseline back to back, in 6 rotated blocks of MS milliseconds "
                        "(as l2gen bench --sustained); a candidate of 20 us or more is then judged by the less "
                        "favourable of one call at a time and back to back")
    p.add_argument("--l2", choices=L2_PROTOCOLS, default=DEFAULT_L2,
                   help="the L2 before each timed run: clean (read pass over 4x the L2: as in a model, the default), "
                   "dirty (a written flush, as before), warm (none); a database holds one"),
    p.add_argument("-j", "--jobs", type=at_least(1), default=None)
    p.add_argument("--bundle", type=at_least(1), default=1, help="programs per nvcc run when a batch builds several (saves header parsing)")
    p.add_argument("--curves", help="write best-so-far curves (JSON) here")
    p.add_argument("--llm-base-url", help="OpenAI-compatible endpoint (default: $OPENAI_BASE_URL)")
    p.add_argument("--llm-model", help="model name (default: $L2GEN_LLM_MODEL)")
    p.add_argument("--llm-mode", choices=("auto", "responses_grammar", "chat_grammar", "text"), default=None)
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(func=lambda args: cmd_tune(args, shapes_of, layout_of))

    p = sub.add_parser("curves", help="best-so-far curves of tuning runs (their databases), side by side")
    p.add_argument("dbs", nargs="+", help="kernel databases, one per run (named by their policy)")
    p.add_argument("--budget", type=at_least(1), default=None, help="candidates per shape to compare at (default: the fewest any shape has)")
    p.add_argument("-o", "--out", help="write curves and comparison as JSON here")
    p.add_argument("--plot", help="write a PNG here")
    p.set_defaults(func=cmd_curves)

    p = sub.add_parser("db", help="show, export or import a kernel database")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    for action, helptext, needs_file in (
        ("show", "the best program of every shape", False),
        ("export", "every measurement, as JSON", True),
        ("import", "add an export's measurements (rows already present are skipped)", True),
        ("import-bench", "add an 'l2gen bench' results file's rows", True),
    ):
        a = actions.add_parser(action, help=helptext)
        if needs_file:
            a.add_argument("file", help="the JSON file")
        a.add_argument("--db", default="l2gen-kernels.db")
        a.add_argument("-v", "--verbose", action="store_true")
        a.set_defaults(func=cmd_db)
        if action == "import-bench":
            a.add_argument("--skip-shape", action="append", type=gemm_shape, metavar="MxNxK",
                           help="leave this shape's rows out (repeatable): a shape whose event-timed winner is known to "
                                "lose where it would be served, e.g. under sustained load")
        if not needs_file:
            a.set_defaults(file=None)
