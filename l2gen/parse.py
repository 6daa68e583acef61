"""Parsing: DSL text to a typed :class:`~l2gen.ir.Program`, with source spans.

The grammar (``grammar/l2gen.lark``) decides what is well formed; this module turns the
tree into records and reports structural problems (a missing ``arch`` or ``tile``, a
decision given twice, a decision that belongs to the other family) as diagnostics with
locations. Value ranges and device limits are the checker's business.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import lark

from .diagnostics import Diagnostic, DiagnosticError
from .ir import (
    BLayout,
    Decomposition,
    Family,
    Hints,
    Knobs,
    Mainloop,
    Program,
    Raster,
    Scheduler,
    Sm80Config,
    Sm80Epilogue,
    Sm90Config,
    Sm90Epilogue,
    Sm90L2genConfig,
    Span,
    SplitK,
    Tile,
    given,
)

GRAMMAR_DIR = Path(__file__).resolve().parent / "grammar"
if not GRAMMAR_DIR.is_dir():  # running from a source checkout
    GRAMMAR_DIR = Path(__file__).resolve().parent.parent / "grammar"
GRAMMAR_PATH = GRAMMAR_DIR / "l2gen.lark"

# Decisions each family accepts (beyond arch, b, tile, stages and the knobs).
COMMON = ("arch", "b_layout", "tile", "stages", "raster", "swizzle", "splits")
ONLY = {
    Family.SM80: ("epilogue", "warps", "smem_swizzle", "split_k", "min_blocks"),
    Family.SM90: ("impl", "epilogue", "epilogue_tile", "epilogue_stages", "cluster", "mainloop", "scheduler", "decomposition", "grid"),
    Family.SM90_L2GEN: ("impl", "swap_ab", "split_k", "hints", "cluster", "decomposition", "pdl", "grid"),
}
KEYWORD = {"b_layout": "b"}  # decision name -> the keyword written in the DSL


def grammar_text() -> str:
    """The DSL grammar, as sent to LLM servers for constrained decoding."""
    return GRAMMAR_PATH.read_text()


@lru_cache(maxsize=1)
def _parser() -> lark.Lark:
    return lark.Lark(grammar_text(), parser="lalr", propagate_positions=True)


def _span(file: str, meta_or_token) -> Span:
    m = meta_or_token
    if isinstance(m, lark.Token):
        return Span(file, m.line, m.column, m.end_line or m.line, m.end_column or m.column)
    if getattr(m, "empty", False):
        return Span(file)
    return Span(file, m.line, m.column, m.end_line, m.end_column)


def _end_span(text: str, file: str) -> Span:
    lines = text.split("\n")
    return Span(file, len(lines), len(lines[-1]) + 1, len(lines), len(lines[-1]) + 1)


def _parse_error(exc: lark.exceptions.LarkError, text: str, file: str) -> Diagnostic:
    if isinstance(exc, lark.exceptions.UnexpectedToken):
        tok = exc.token
        expected = sorted(_describe_terminal(t) for t in exc.accepts or exc.expected)
        if tok.type == "$END":
            return Diagnostic(
                "E-PARSE", f"unexpected end of input; expected {', '.join(expected)}", _end_span(text, file)
            )
        message = f"unexpected '{tok}'; expected {', '.join(expected)}"
        if expected == ["end of input"]:
            message += " (a program holds one kernel)"
        return Diagnostic(
            "E-PARSE",
            message,
            Span(file, tok.line or 1, tok.column or 1, tok.end_line or 1, tok.end_column or 1),
        )
    if isinstance(exc, lark.exceptions.UnexpectedCharacters):
        allowed = sorted(_describe_terminal(t) for t in exc.allowed or ())
        text = f"unexpected character '{exc.char}'"
        if allowed:
            text += f"; expected {', '.join(allowed)}"
        return Diagnostic("E-PARSE", text, Span(file, exc.line, exc.column, exc.line, exc.column))
    if isinstance(exc, lark.exceptions.UnexpectedEOF):
        return Diagnostic("E-PARSE", "unexpected end of input", _end_span(text, file))
    return Diagnostic("E-PARSE", str(exc).splitlines()[0], Span(file))


def _describe_terminal(name: str) -> str:
    """A readable spelling of a terminal for error messages ('LBRACE' -> '{')."""
    if name in _READABLE:
        return _READABLE[name]
    try:
        pattern = _parser().get_terminal(name).pattern
    except KeyError:
        return name
    if isinstance(pattern, lark.lexer.PatternStr):
        return f"'{pattern.value}'"
    words = re.fullmatch(r"\(\?:([a-z0-9_|]+)\)", pattern.value)
    if words:  # an alternation of keywords, e.g. ARCH: "sm80" | "sm90a"
        return " | ".join(f"'{w}'" for w in sorted(words.group(1).split("|")))
    return name


_READABLE = {
    "INT": "an integer",
    "NAME": "a name",
    "STAGES": "an integer or 'auto'",
    "$END": "end of input",
}


def default_smem_swizzle(tile: Tile) -> tuple[int, int, int]:
    """Swizzle<B,3,3> with the widest B whose 8 << B element rows fit in BK (at most 3)."""
    b = max(0, min(3, (max(tile.k, 8) // 8).bit_length() - 1))
    return (b, 3, 3)


def _words(name: str) -> str:
    return KEYWORD.get(name, name)


def _a(words: str) -> str:
    return ("an " if words[0] in "aeios" else "a ") + words


def _family_words(family: Family) -> str:
    """How a family is written: 'sm80', 'sm90a', 'sm90a impl l2gen'."""
    return family.arch if family is not Family.SM90_L2GEN else f"{family.arch} impl {family.impl}"


MAX_DIGITS = 9  # the longest number a decision takes (sizes and counts fit in 32 bits)


class _Builder:
    """Walks the parse tree and assembles a Program, collecting diagnostics."""

    def __init__(self, file: str):
        self.file = file
        self.diags: list[Diagnostic] = []

    def build(self, tree: lark.Tree) -> Program | None:
        kernel = tree.children[0]
        name_tok = kernel.children[0]
        header = _span(self.file, name_tok)
        values: dict[str, tuple[object, Span]] = {}
        for node in kernel.children[1:]:
            span = _span(self.file, node.meta)
            decision = node.data
            if decision in values:
                first = values[decision][1]
                self.diags.append(
                    Diagnostic(
                        "E-DUP",
                        f"'{_words(decision)}' is given twice (first at line {first.line})",
                        span,
                    )
                )
                continue
            values[decision] = (self._value(decision, node), span)

        if "arch" not in values:
            self.diags.append(
                Diagnostic("E-MISSING", "the kernel needs an 'arch' decision (sm80 or sm90a)", header)
            )
        if "tile" not in values:
            self.diags.append(
                Diagnostic("E-MISSING", "the kernel needs a 'tile' decision (BM x BN x BK)", header)
            )
        if self.diags:
            return None

        arch = values["arch"][0]
        impl = values["impl"][0] if "impl" in values else None
        try:
            family = Family.of(arch, impl)
        except ValueError:
            self.diags.append(
                Diagnostic("E-FAMILY", f"'impl {impl}' is an sm90a decision; this kernel is {arch}", values["impl"][1])
            )
            return None
        allowed = set(COMMON) | set(ONLY[family])
        for decision, (_, span) in values.items():
            if decision not in allowed:
                owners = [f for f in Family if decision in ONLY[f]]
                if len(owners) > 1 and {f.arch for f in owners} == {"sm90a"}:
                    whose = "an sm90a"
                elif owners[0] is Family.SM90 and family is Family.SM90_L2GEN:
                    whose = "a CUTLASS sm90a ('impl cutlass')"
                else:
                    whose = _a(_family_words(owners[0]))
                self.diags.append(
                    Diagnostic(
                        "E-FAMILY",
                        f"'{_words(decision)}' is {whose} decision; "
                        f"this kernel is {_family_words(family)}",
                        span,
                    )
                )
        if self.diags:
            return None

        get = {k: v for k, (v, _) in values.items()}
        spans = {k: s for k, (_, s) in values.items()}
        epilogue = get.get("epilogue")
        if family is Family.SM80:
            if epilogue == "tma":
                self.diags.append(
                    Diagnostic(
                        "E-VALUE",
                        "epilogue 'tma' is an sm90a epilogue; sm80 takes 'smem' or 'direct'",
                        spans["epilogue"],
                    )
                )
                return None
            if get.get("stages") == "auto":
                self.diags.append(
                    Diagnostic("E-VALUE", "sm80 kernels need a stage count, not 'auto'", spans["stages"])
                )
                return None
            config = Sm80Config(
                tile=get["tile"],
                swizzle=get.get("smem_swizzle", default_smem_swizzle(get["tile"])),
                **given(get, warps=None, stages=None, epilogue=Sm80Epilogue, split_k=SplitK, min_blocks=None),
                spans=spans,
            )
        elif family is Family.SM90_L2GEN:
            if get.get("stages") == "auto":
                self.diags.append(
                    Diagnostic("E-VALUE", "the l2gen sm90a kernel needs a stage count, not 'auto'", spans["stages"])
                )
                return None
            config = Sm90L2genConfig(
                tile=get["tile"],
                **given(get, swap_ab=lambda v: v == "on", stages=None, split_k=SplitK, hints=Hints, cluster=None),
                spans=spans,
            )
        else:
            if epilogue == "smem":
                self.diags.append(
                    Diagnostic(
                        "E-VALUE",
                        "epilogue 'smem' is an sm80 epilogue; sm90a takes 'tma' or 'direct'",
                        spans["epilogue"],
                    )
                )
                return None
            if get.get("stages") == 0:  # 0 is how the record says auto; the text must say it
                self.diags.append(Diagnostic("E-RANGE", "stages 0 is not a stage count: give 2 or more, or 'auto'", spans["stages"]))
                return None
            config = Sm90Config(
                tile=get["tile"],
                **given(
                    get,
                    cluster=None,
                    mainloop=Mainloop,
                    epilogue=Sm90Epilogue,
                    stages=lambda v: 0 if v == "auto" else v,
                    scheduler=Scheduler,
                    epilogue_tile=None,
                    epilogue_stages=None,
                ),
                spans=spans,
            )
        knob_span = spans.get("splits") or spans.get("swizzle") or spans.get("raster") or header
        knobs = Knobs(
            **given(get, raster=Raster, swizzle=None, splits=None, decomposition=Decomposition, pdl=lambda v: v == "on",
                    grid=None),
            span=knob_span,
        )
        return Program(
            name=str(name_tok),
            family=family,
            b_layout=BLayout(get.get("b_layout", "kn")),
            config=config,
            knobs=knobs,
            span=header,
            spans=spans,
        )

    def _value(self, decision: str, node: lark.Tree):
        toks = [t for t in node.children if isinstance(t, lark.Token)]
        for t in toks:  # no decision takes a number this long (and int() refuses past 4300 digits)
            if t.type in ("INT", "STAGES") and len(t) > MAX_DIGITS:
                self.diags.append(Diagnostic("E-RANGE", f"'{_words(decision)}' takes a number of at most {MAX_DIGITS} digits, "
                                             f"not one of {len(t)}", _span(self.file, t)))
                return "auto" if decision == "stages" else 0
        if decision in ("arch", "impl"):
            return str(toks[0])
        if decision == "tile":
            m, n, k = (int(t) for t in toks)
            return Tile(m, n, k, span=_span(self.file, node.meta))
        if decision in ("warps", "smem_swizzle", "cluster"):
            return tuple(int(t) for t in toks)
        if decision == "stages":
            return "auto" if str(toks[0]) == "auto" else int(toks[0])
        if decision in ("min_blocks", "swizzle", "splits", "grid", "epilogue_tile", "epilogue_stages"):
            return int(toks[0])
        return str(toks[0])  # an enum word; converted once the family is known


def parse(text: str, file: str = "<string>") -> Program:
    """Parse one kernel. Raises :class:`DiagnosticError` with located diagnostics."""
    try:
        tree = _parser().parse(text)
    except lark.exceptions.LarkError as exc:
        raise DiagnosticError([_parse_error(exc, text, file)]) from None
    builder = _Builder(file)
    program = builder.build(tree)
    if program is None:
        raise DiagnosticError(builder.diags)
    return program


def parse_file(path: str | Path) -> Program:
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise DiagnosticError([Diagnostic("E-IO", f"cannot read: {exc}", Span(str(path)))]) from None
    return parse(text, str(path))
