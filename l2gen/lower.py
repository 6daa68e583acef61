"""Lowering: a checked program and a target GPU to CUDA C++ source (a KernelSource).

Templates live in ``templates/`` as files and are rendered with ``StrictUndefined``, so a
variable the template uses but lowering forgot is an error, not an empty string.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

import jinja2

from .check import check
from .limits import L2GEN_SK_MAX_PARTS, l2gen_operands, l2gen_persistent_smem_bytes, l2gen_smem_bytes, sm90_epilogue_tile
from .diagnostics import DiagnosticError, errors
from .ir import Family, Knobs, Program, Sm90L2genConfig
from .printer import format_program
from .space import default_name
from .targets import Gpu

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"
if not TEMPLATE_DIR.is_dir():  # running from a source checkout
    TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "templates"

# family -> (the CUDA translation unit, the host translation unit or None). A family with a
# host template builds its CUDA unit alone to a fatbin (FATBIN) that the host unit embeds,
# so that its host code never parses CuTe.
TEMPLATE_OF = {
    Family.SM80: ("sm80_gemm.cu.j2", "sm80_host.cpp.j2"),
    Family.SM90: ("sm90_gemm.cu.j2", None),
    Family.SM90_L2GEN: ("sm90_l2gen_gemm.cu.j2", None),
}
FATBIN = "kernel.fatbin"  # where the build writes a two-unit source's device code

# Flags every build gets. -DNDEBUG matters on sm90: CUTLASS's asserts make ptxas serialize
# the wgmma pipeline (warning C7510) and slow the kernel down.
BASE_FLAGS = (
    "-std=c++17",
    "-O3",
    "-DNDEBUG",
    "--expt-relaxed-constexpr",
    "-Xcompiler=-fPIC",
    "-shared",
)

# The wgmma N extents CuTe's op selector offers without its extended shapes; a tile width
# outside them needs the macro below, or CuTe splits the width into narrower wgmmas (160
# into five N = 32). The macro costs half of a build (2.8 MB more headers), so only those
# tiles get it, and as a flag: a #define in the source can be reordered by bundling.
STANDARD_WGMMA_N = frozenset({8, 16, 32, 64, 96, 128, 192, 256})
EXTENDED_MMA_SHAPES_FLAG = "-DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED"


@dataclass(frozen=True)
class KernelSource:
    """The output of lowering: everything the build needs, and nothing else."""

    program: Program
    gpu: str
    entry: str  # exported symbol; E_workspace and E_program are exported beside it
    code: str  # the .cu translation unit: the whole program, or its device code
    gencode: str  # nvcc -gencode flag
    flags: tuple[str, ...] = BASE_FLAGS
    # Host-only C++ (no CUDA code) holding the entry points. When set, ``code`` is built
    # alone to the fatbin FATBIN, which this embeds; the two are built into the library.
    host_code: str = ""

    def with_flags(self, *flags: str) -> "KernelSource":
        """This source built with more nvcc flags (``-DMACRO=1``: a macro a template reads),
        under another key."""
        return replace(self, flags=(*self.flags, *flags)) if flags else self

    @property
    def key(self) -> str:
        """Content hash of the source and flags (the build cache adds the toolchain)."""
        h = hashlib.sha256()
        for part in (self.code, self.gencode, *self.flags, self.host_code):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()


def define_flags(spec: str) -> tuple[str, ...]:
    """The nvcc flags of a ``--define`` argument: MACRO or MACRO=VALUE, several joined by
    '+' (``A=1+B``: ``-DA=1 -DB``)."""
    return tuple(f"-D{macro}" for macro in spec.split("+"))


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def build_program(program: Program) -> Program:
    """The program a library is built from: knobs at their defaults and a canonical name.

    Knob-only variants of one compile-time configuration map to the same build program,
    hence to one library; each variant passes its own knobs at launch.
    """
    base = replace(program, knobs=Knobs())
    return replace(base, name=default_name(base.family, base.config))


def build_key(program: Program) -> str:
    """The text of :func:`build_program`: one string per compile-time configuration, the
    same for every knob setting of it."""
    return format_program(build_program(program))


def entry_name(program: Program, gpu: Gpu) -> str:
    """A symbol unique to the program's canonical text and target."""
    digest = hashlib.sha256(f"{gpu.name}\n{format_program(program)}".encode()).hexdigest()
    return f"l2gen_{program.family.value}_{digest[:12]}"


def _c_string(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def template_context(program: Program, gpu: Gpu) -> dict:
    """The variables a family template sees (documented at the top of each template)."""
    text = format_program(program)
    cfg = program.config
    ctx = {
        "entry": entry_name(program, gpu),
        "program_comment": "\n".join("// " + line for line in text.rstrip().splitlines()),
        "program_literal": _c_string(text),
        "b_layout": program.b_layout.value,
        "bm": cfg.tile.m,
        "bn": cfg.tile.n,
        "bk": cfg.tile.k,
        "stages": cfg.stages,
        "fatbin": FATBIN,
    }
    if isinstance(cfg, Sm90L2genConfig):
        kbm, kbn = cfg.kernel_tile
        p_kmajor, q_kmajor = l2gen_operands(program)
        ctx.update(
            swap_ab=cfg.swap_ab,
            kbm=kbm,
            kbn=kbn,
            consumers=cfg.consumers,
            p_kmajor=p_kmajor,
            q_kmajor=q_kmajor,
            split_k=cfg.split_k.value,
            hints=cfg.hints.value,
            ccm=cfg.kernel_cluster[0],
            ccn=cfg.kernel_cluster[1],
            extended_mma_shapes=needs_extended_mma_shapes(program),
            # the checker's counts of the kernel's shared memory, which the template
            # asserts against its own (a mirror that drifts fails the build)
            smem_bytes=l2gen_smem_bytes(cfg),
            persistent_smem_bytes=l2gen_persistent_smem_bytes(cfg),
            sk_max_parts=L2GEN_SK_MAX_PARTS,
        )
        return ctx
    ctx["epilogue"] = cfg.epilogue.value
    if program.family is Family.SM80:
        ctx.update(
            wm=cfg.warps[0],
            wn=cfg.warps[1],
            threads=cfg.threads,
            swz_b=cfg.swizzle[0],
            swz_m=cfg.swizzle[1],
            swz_s=cfg.swizzle[2],
            split_k=cfg.split_k.value,
            min_blocks=cfg.min_blocks,
        )
    else:
        ctx.update(
            cm=cfg.cluster[0],
            cn=cfg.cluster[1],
            ck=cfg.cluster[2],
            mainloop=cfg.mainloop.value,
            scheduler=cfg.scheduler.value,
            extended_mma_shapes=needs_extended_mma_shapes(program),
            # (rows, columns) of the TMA epilogue's tile when the program sets it (or sets its
            # store depth, whose collective is assembled without the builder); None: auto
            epilogue_tile=sm90_epilogue_tile(cfg) if cfg.epilogue_tile or cfg.epilogue_stages else None,
            epilogue_stages=cfg.epilogue_stages,
        )
    return ctx


def wgmma_n(program: Program) -> int | None:
    """The N extent of an sm90a program's wgmma instructions (None for sm80): the tile's
    BN, or for l2gen's own kernel the columns of its kernel tile (BM with swap_ab)."""
    cfg = program.config
    if isinstance(cfg, Sm90L2genConfig):
        return cfg.kernel_tile[1]
    return cfg.tile.n if program.family is Family.SM90 else None


def needs_extended_mma_shapes(program: Program) -> bool:
    """Whether an sm90a program's wgmma width needs CuTe's extended wgmma shapes."""
    n = wgmma_n(program)
    return n is not None and n not in STANDARD_WGMMA_N


def build_flags(program: Program) -> tuple[str, ...]:
    """The nvcc flags of a program's build: :data:`BASE_FLAGS`, and every setting that
    changes code generation (none may live in the source, where bundling moves it)."""
    extra = (EXTENDED_MMA_SHAPES_FLAG,) if needs_extended_mma_shapes(program) else ()
    return BASE_FLAGS + extra


def lower(program: Program, gpu: Gpu) -> KernelSource:
    """Render a program for a GPU. Raises DiagnosticError if the checker rejects it."""
    problems = errors(check(program, gpu))
    if problems:
        raise DiagnosticError(problems)
    ctx = template_context(program, gpu)
    unit, host = TEMPLATE_OF[program.family]
    env = _environment()
    return KernelSource(
        program=program,
        gpu=gpu.name,
        entry=ctx["entry"],
        code=env.get_template(unit).render(**ctx),
        gencode=gpu.gencode(program.family),
        flags=build_flags(program),
        host_code=env.get_template(host).render(**ctx) if host else "",
    )

