"""Printing: a Program to canonical DSL text, every decision spelled out (but for the few
defaults kept unwritten so that older canonical texts stay the same, said where they are).

``parse(format_program(p)) == p`` for every program; the canonical text is also what the
build cache, the kernel database and the entry symbol are keyed on.
"""

from __future__ import annotations

from .ir import Decomposition, Family, Program, Sm80Config, Sm90Config, Sm90L2genConfig


def _lines(program: Program) -> list[tuple[str, str]]:
    cfg = program.config
    t = cfg.tile
    # `impl cutlass` is sm90a's default and is not printed, so that the canonical text (the
    # key of builds and database rows) of every CUTLASS program stays what it always was.
    out = [("arch", program.family.arch)]
    if program.family is Family.SM90_L2GEN:
        out.append(("impl", program.family.impl))
    out += [("b", program.b_layout.value), ("tile", f"{t.m} x {t.n} x {t.k}")]
    if isinstance(cfg, Sm80Config):
        out += [
            ("warps", f"{cfg.warps[0]} x {cfg.warps[1]}"),
            ("stages", str(cfg.stages)),
            ("smem_swizzle", " ".join(str(v) for v in cfg.swizzle)),
            ("epilogue", cfg.epilogue.value),
            ("split_k", cfg.split_k.value),
            ("min_blocks", str(cfg.min_blocks)),
        ]
    elif isinstance(cfg, Sm90Config):
        out += [
            ("cluster", " x ".join(str(v) for v in cfg.cluster)),
            ("mainloop", cfg.mainloop.value),
            ("epilogue", cfg.epilogue.value),
        ]
        if cfg.epilogue_tile:  # written only when set: programs keyed before it keep their text
            out.append(("epilogue_tile", str(cfg.epilogue_tile)))
        if cfg.epilogue_stages:
            out.append(("epilogue_stages", str(cfg.epilogue_stages)))
        out += [("stages", "auto" if cfg.stages == 0 else str(cfg.stages)), ("scheduler", cfg.scheduler.value)]
    elif isinstance(cfg, Sm90L2genConfig):
        out += [
            ("swap_ab", "on" if cfg.swap_ab else "off"),
            ("stages", str(cfg.stages)),
            ("split_k", cfg.split_k.value),
            ("hints", cfg.hints.value),
            ("cluster", " x ".join(str(v) for v in cfg.cluster)),
        ]
    kn = program.knobs
    out += [("raster", kn.raster.value), ("swizzle", str(kn.swizzle)), ("splits", str(kn.splits))]
    # l2gen's kernel took the knob after programs of it were keyed and stored: its default
    # stays unwritten, so their canonical text (and key) is what it was.
    if program.family is Family.SM90 or (
        program.family is Family.SM90_L2GEN and kn.decomposition is not Decomposition.HEURISTIC
    ):
        out.append(("decomposition", kn.decomposition.value))
    if kn.pdl:  # written only when on: every program keyed before the knob keeps its text
        out.append(("pdl", "on"))
    if kn.grid:  # likewise written only when set
        out.append(("grid", str(kn.grid)))
    return out


def format_program(program: Program, comment: str | None = None) -> str:
    """Canonical text of a program, optionally preceded by a ``#`` comment block."""
    lines = []
    if comment:
        lines += [f"# {c}".rstrip() for c in comment.splitlines()]
    lines.append(f"kernel {program.name} {{")
    width = max(len(k) for k, _ in _lines(program))
    lines += [f"    {k.ljust(width)} {v}" for k, v in _lines(program)]
    lines.append("}")
    return "\n".join(lines) + "\n"
