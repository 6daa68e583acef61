"""The ``l2gen`` command line; ``l2gen --help`` lists every command with a line on what it does.

Exit codes: 0 ok, 1 diagnostics or a failed build/run, 2 usage. Every error names where it
comes from; no command ends in a Python traceback on bad input.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from .common import EXIT_FAIL, EXIT_OK, EXIT_USAGE, eprint, fail, recorded_best
from ..diagnostics import DiagnosticError, UsageError
from ..ir import Program
from ..targets import DEFAULT_GPU, GPUS, Gpu, get_gpu
from ..validate import at_least, output_dir, output_file, positive_float, write_atomic

def _load(paths: list[str], gpu: Gpu, *, check_too: bool = True) -> tuple[list[tuple[str, Program]], bool]:
    """Parse (and check) files; print diagnostics; return the good programs and an ok flag."""
    from ..check import check
    from ..parse import parse_file

    programs, ok = [], True
    for path in paths:
        try:
            program = parse_file(path)
        except DiagnosticError as exc:
            for d in exc.diagnostics:
                eprint(d)
            ok = False
            continue
        if check_too:
            diags = check(program, gpu)
            for d in diags:
                eprint(d)
            if any(d.is_error for d in diags):
                ok = False
                continue
        programs.append((path, program))
    return programs, ok


def cmd_check(args) -> int:
    programs, ok = _load(args.files, args.gpu)
    for path, program in programs:
        if not args.quiet:
            print(f"{path}: ok ({program.family.value}, {program.config.tile}, {args.gpu.name})")
    return EXIT_OK if ok else EXIT_FAIL


def cmd_fmt(args) -> int:
    from ..printer import format_program

    programs, ok = _load(args.files, args.gpu, check_too=False)
    for path, program in programs:
        original = Path(path).read_text()
        inline = _inline_comment(original)
        if inline and args.write:  # the canonical form keeps only the comment lines before the kernel
            eprint(f"{path}:{inline}: E-FMT: an inline or inner comment would be lost; not rewritten "
                   "(move it above the kernel, or print the canonical form without -w)")
            ok = False
            continue
        text = _leading_comment(original) + format_program(program)
        if args.check:
            if Path(path).read_text() != text:
                print(f"{path}: would reformat")
                ok = False
        elif args.write:
            write_atomic(path, text)
        else:
            sys.stdout.write(text)
    return EXIT_OK if ok else EXIT_FAIL


def _inline_comment(text: str) -> str | None:
    """``line:col`` of the first comment after the kernel starts (one the canonical form
    drops), or None. The DSL has no strings, so every ``#`` starts a comment."""
    started = False
    for number, line in enumerate(text.splitlines(), 1):
        code, hash_, _ = line.partition("#")
        started = started or bool(code.strip())
        if hash_ and started:
            return f"{number}:{len(code) + 1}"
    return None


def _leading_comment(text: str) -> str:
    """The comment lines before the kernel, kept when formatting a file."""
    out = []
    for line in text.splitlines():
        if line.strip().startswith("#") or (not line.strip() and out):
            out.append(line.rstrip())
        elif line.strip():
            break
    while out and not out[-1]:
        out.pop()
    return "\n".join(out) + "\n" if out else ""


def cmd_compile(args) -> int:
    from ..build import nvcc_command
    from ..lower import lower

    out = output_dir(args.output, "-o")
    programs, ok = _load(args.files, args.gpu)
    if programs:  # nothing to write, no directory made
        out.mkdir(parents=True, exist_ok=True)
    for path, program in programs:
        source = lower(program, args.gpu)
        cu = out / f"{Path(path).stem}.cu"
        write_atomic(cu, source.code)
        if source.host_code:  # two steps, run in out/: the device code's fatbin, the library
            host = out / f"{Path(path).stem}.host.cpp"
            write_atomic(host, source.host_code)
            command = nvcc_command(source, cu.absolute(), cu.with_suffix(".so").absolute(), host.absolute())
        else:
            command = nvcc_command(source, cu, cu.with_suffix(".so"))
        write_atomic(out / f"{Path(path).stem}.nvcc.sh", "#!/bin/sh\n" + command + "\n")
        print(f"{cu}  (entry {source.entry})")
        if args.verbose:
            print(f"  {command}")
    return EXIT_OK if ok else EXIT_FAIL


def cmd_build(args) -> int:
    from ..check import check
    from ..console import reporter
    from ..lower import define_flags
    from ..runner import Builder

    programs, ok = _load(args.files, args.gpu)
    if args.library is not None:  # the kernel library: every configuration, built once
        from ..search.library import library_dir, load

        folder = Path(args.library) if args.library else library_dir(args.gpu)
        programs += [(f"{folder}/{p.name}", p) for p in load(args.gpu, folder)]
    if args.db:  # each shape's best program: what the dispatcher will load, checked like a file's
        for shape, (p, _, _) in sorted(recorded_best(args).items()):
            problems = [d for d in check(p, args.gpu) if d.is_error]
            for d in problems:
                eprint(f"{args.db}:{shape}: {d}")
            if problems:
                ok = False
            else:
                programs.append((f"{args.db}:{shape}", p))
    if not programs:
        raise fail("E-USAGE", "nothing to build: give DSL files, --library or --db")
    # The library of a program's compile-time configuration (knobs are launch arguments):
    # the one bench, tune and the dispatcher share.
    def line(done, total, result):
        state = "cached" if result.cached else ("ok" if result.ok else "FAILED")
        return f"[{done}/{total}] {result.source.program.name}: {state} ({result.seconds:.1f} s)"

    def summary(builds):
        failed = sum(not b.ok for b in builds)
        return f"built {len(builds) - failed} of {len(builds)}" + (f", {failed} FAILED" if failed else ""), not failed

    pack_to = output_file(args.pack, "--pack") if args.pack else None
    # Each program as written, then once per --define (A=1+B=1: both macros at once).
    variants = [()] + [define_flags(d) for d in args.define]
    libraries = []
    for flags in variants:
        builder = Builder(args.gpu, jobs=args.jobs, timeout=args.timeout, force=args.force, flags=flags)
        with reporter() as report:
            builds = builder.build([p for _, p in programs], report=report, line=line, summary=summary)
        label = "".join(f" {f}" for f in flags)
        for (path, _), built in zip(programs, builds):
            if built.ok:
                print(f"{path}{label}: {built.result.library}")
                libraries.append(built.result.library)
            else:
                ok = False
                eprint(f"{path}{label}: build failed: {built.result.error if built.result else built.error}")
                if built.result is not None:
                    eprint(built.result.log[-3000:])
                    eprint(f"reproduce with:\n  {built.result.command}")
    if pack_to is not None:
        from ..build import pack

        pack_to.parent.mkdir(parents=True, exist_ok=True)
        count = pack(libraries, pack_to)
        eprint(f"packed {count} cache entries ({pack_to.stat().st_size / 2**20:.1f} MiB) into {pack_to}; "
               f"unpack with: tar xJf {pack_to} -C \"$L2GEN_CACHE_DIR\"")
    return EXIT_OK if ok else EXIT_FAIL


def _define(text: str) -> str:
    """MACRO or MACRO=VALUE, several joined by '+' (argparse type of --define)."""
    for part in text.split("+"):
        if not re.fullmatch(r"[A-Za-z_]\w*(=[^\s+]*)?", part):
            raise argparse.ArgumentTypeError(f"not MACRO[=VALUE]: {part[:60]!r}")
    return text


def _gpu(name: str) -> Gpu:
    try:
        return get_gpu(name)
    except DiagnosticError as exc:
        raise argparse.ArgumentTypeError(str(exc.diagnostics[0].message)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="l2gen", description="Generate, verify and tune fp16 GEMM kernels from a small DSL.",
                                     epilog="'l2gen COMMAND --help' shows a command's options.")
    parser.add_argument("--gpu", type=_gpu, default=GPUS[DEFAULT_GPU], help=f"target GPU ({', '.join(GPUS)}; default {DEFAULT_GPU})")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("check", help="parse and check programs against the target GPU")
    p.add_argument("files", nargs="+")
    p.add_argument("-q", "--quiet", action="store_true")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("fmt", help="print programs in canonical form")
    p.add_argument("files", nargs="+")
    g = p.add_mutually_exclusive_group()
    g.add_argument("-w", "--write", action="store_true", help="rewrite the files in place")
    g.add_argument("--check", action="store_true", help="exit 1 if a file is not canonical")
    p.set_defaults(func=cmd_fmt)

    p = sub.add_parser("compile", help="lower programs to .cu files and the nvcc command")
    p.add_argument("files", nargs="+")
    p.add_argument("-o", "--output", required=True, help="output directory")
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("build", help="compile programs to shared libraries (cached)")
    p.add_argument("files", nargs="*")
    p.add_argument("--db", help="also build each shape's best program in this kernel database")
    p.add_argument("--library", nargs="?", const="", default=None, metavar="FOLDER",
                   help="also build the kernel library (the one shipped for --gpu, or FOLDER's *.l2 files), "
                        "whose libraries 'l2gen tune --library' launches without compiling")
    p.add_argument("-j", "--jobs", type=at_least(1), default=None, help="parallel nvcc jobs (default: cores)")
    p.add_argument("--timeout", type=positive_float, default=900, help="seconds per nvcc run")
    p.add_argument("--force", action="store_true", help="rebuild even if cached")
    p.add_argument("--define", action="append", default=[], type=_define, metavar="MACRO[=VALUE]",
                   help="also build each program with -DMACRO[=VALUE] (repeatable; A=1+B=1 defines both), "
                        "the macros bench/probe.py --define times")
    p.add_argument("--pack", metavar="FILE.tar.xz",
                   help="write every library built (or found in the cache) into this archive, to unpack into "
                        "the cache of a machine with the same nvcc and CUTLASS: build here, run there")
    p.set_defaults(func=cmd_build)

    _add_late_commands(sub)
    for action in sub._choices_actions:  # a command's own --help opens with its line from the list
        command = sub.choices[action.dest]
        command.description = command.description or action.help
    return parser


def _add_late_commands(sub) -> None:
    """bench, tune, db and shapes live in their own modules; import them only when used."""
    from . import model, run

    run.add_commands(sub)
    model.add_commands(sub)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    if any("\x00" in a for a in (argv if argv is not None else sys.argv[1:])):  # no path or value holds one
        eprint("l2gen: E-USAGE: an argument holds a NUL character")
        return EXIT_USAGE
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return EXIT_USAGE if exc.code not in (0, None) else EXIT_OK
    try:
        return args.func(args)
    except UsageError as exc:  # (a subclass of DiagnosticError: first)
        for d in exc.diagnostics:
            eprint(d)
        return EXIT_USAGE
    except DiagnosticError as exc:
        for d in exc.diagnostics:
            eprint(d)
        return EXIT_FAIL
    except KeyboardInterrupt:
        eprint("interrupted")
        return 130
    except BrokenPipeError:
        return EXIT_OK
