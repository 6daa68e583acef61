"""``l2gen shapes``: a model's GEMM shapes on the command line, and the same shapes as a
source for ``l2gen tune --shapes-from`` (:func:`shapes_from_args`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Sequence

from .common import EXIT_OK, eprint, fail, usage
from ..validate import at_least, output_file, write_atomic

MODEL_HELP = ("a transformers config.json (or its directory), a built-in name ({builtin}), or pkg.module:factory "
              "(a callable returning an nn.Module, traced once per token count)")


def _tokens(text: str) -> list[int]:
    from ..model_shapes import parse_tokens

    try:
        return parse_tokens(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_model_options(p, *, required: bool) -> None:
    """--tokens, --tp, --unfused, --no-lm-head and --trace-device, for a command that reads a model."""
    p.add_argument("--tokens", type=_tokens, required=required, default=None,
                   help="token counts per forward, comma-separated: decode batch sizes and prefill lengths (e.g. 1,16,64,2048)")
    p.add_argument("--tp", type=at_least(1), default=1, help="tensor-parallel degree: the shapes of one of TP ranks (default 1)")
    p.add_argument("--unfused", action="store_true",
                   help="one Linear per projection, as transformers runs them (q/k/v, gate/up); default fused, as vLLM")
    p.add_argument("--no-lm-head", action="store_true", help="leave out the output projection")
    p.add_argument("--trace-device", choices=("meta", "cpu"), default="meta",
                   help="where a traced model (pkg.module:factory) is built and run (default meta: no memory for weights)")


def resolve_model(spec: str, tokens: Sequence[int], *, tp: int = 1, fused: bool = True, lm_head: bool = True,
                  device: str = "meta") -> tuple[str, list]:
    """(label, :class:`~l2gen.model_shapes.ModelShape` list) of MODEL as the commands
    take it: a ``config.json`` (or a directory holding one), a built-in name
    (:data:`l2gen.model_shapes.BUILTIN`), or ``pkg.module:factory`` (a callable returning
    an ``nn.Module``, traced on ``device``: :mod:`l2gen.model_trace`). Raises
    DiagnosticError (E-CONFIG, E-TP, E-MODEL) with the location of the fault."""
    from ..model_shapes import BUILTIN, config_shapes, model_dims, model_label

    if not tokens:
        raise fail("E-MODEL", "no token counts to list shapes at")
    if ":" in spec and not Path(spec).exists() and spec.lower() not in BUILTIN:
        if tp != 1:
            raise fail("E-TP", "a traced model is one rank's model already: --tp applies to configs and built-in names")
        from ..model_trace import trace_import

        return spec, trace_import(spec, tokens, device=device)
    dims = model_dims(spec, traced_too=True)
    return model_label(dims.name, tp), config_shapes(dims, tokens, tp=tp, fused=fused, lm_head=lm_head)


def model_shapes_of(args, model: str):
    """(label, shapes) of ``model`` under the command's model options."""
    return resolve_model(model, args.tokens, tp=args.tp, fused=not args.unfused, lm_head=not args.no_lm_head,
                         device=args.trace_device)


def shapes_from_args(args) -> list:
    """``tune --shapes-from MODEL``'s shapes (l2gen's Shape), those no program serves
    left out with a line on stderr (torch computes them)."""
    from ..model_shapes import unserved_note

    if not args.tokens:
        raise usage("E-USAGE", "--shapes-from needs --tokens (e.g. --tokens 1,16,64,256,2048)")
    label, found = model_shapes_of(args, args.shapes_from)
    shapes = []
    for s in found:
        why = unserved_note(s)
        if why:
            eprint(f"[tune] {label}: {', '.join(s.layers)} at {s.tokens} tokens: skipped, {why}; torch computes it")
        else:
            shapes.append(s.shape)
    eprint(f"[tune] {label}: {len(shapes)} GEMM shapes of its Linear layers at {', '.join(map(str, args.tokens))} tokens (B stored N x K)")
    return shapes


def cmd_shapes(args) -> int:
    from ..console import Columns, show
    from ..model_shapes import suite_json, unserved_note

    if args.out:
        output_file(args.out, "-o")
    label, shapes = model_shapes_of(args, args.model)
    data = suite_json(label, shapes, args.tokens, args.tp)
    if args.out:
        write_atomic(args.out, json.dumps(data, indent=1) + "\n")
    if args.json:
        print(json.dumps(data, indent=1))
        return EXIT_OK
    rows = [[str(s.tokens), str(s.m), str(s.n), str(s.k), str(s.count), ", ".join(s.layers) + (f"  ({unserved_note(s)})" if unserved_note(s) else "")]
            for s in shapes]
    show([f"{label}: {len(shapes)} GEMM shapes (B stored N x K)" + (f", one of {args.tp} tensor-parallel ranks" if args.tp > 1 else ""),
          Columns(["tokens", "M", "N", "K", "calls", "layers"], rows, frozenset({5}))])
    if args.out:
        print(f"suite: {args.out}")
    return EXIT_OK


def add_commands(sub) -> None:
    """Register ``shapes``."""
    from ..model_shapes import BUILTIN

    p = sub.add_parser("shapes", help="list the GEMM shapes of a model's Linear layers at given token counts")
    p.add_argument("model", metavar="MODEL", help=MODEL_HELP.format(builtin=", ".join(BUILTIN)))
    add_model_options(p, required=True)
    p.add_argument("--json", action="store_true", help="print the shapes as a suite file (what bench --suite and tune --suite read)")
    p.add_argument("-o", "--out", help="also write the suite file here")
    p.set_defaults(func=cmd_shapes)
