"""What the LLM policy says and reads: prompts (shape, GPU facts, grammar, rules, the best
and worst programs so far, the reward rule) and the reading of answers (a fenced block or
the first balanced ``kernel NAME { ... }``, parsed and checked)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from ..check import check
from ..diagnostics import Diagnostic, DiagnosticError, errors
from ..ir import Family, Program, Span
from ..parse import grammar_text, parse
from ..printer import format_program
from ..targets import Gpu
from ..problem import Shape
from ..rules import RULES, rules_for
from .base import REWARD_FAILED, REWARD_REJECTED

ANSWER_FILE = "answer.l2"  # the file name diagnostics of an answer carry
TOOL_NAME = "emit_l2gen_program"


@dataclass(frozen=True)
class Entry:
    """A remembered outcome: the program as one line of DSL, and how it did."""

    text: str
    status: str
    speedup: float | None
    error: str | None



@dataclass(frozen=True)
class Examples:
    best: list
    worst: list
    similar: list  # (Shape, Entry)
    measured: int


# -- reading answers ----------------------------------------------------------------------

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.S)
_KERNEL = re.compile(r"\bkernel\s+[A-Za-z_][A-Za-z0-9_]*\s*\{")


def extract_program_text(answer: str) -> str | None:
    """The program in a model's answer: an ```l2gen fenced block, else the first balanced
    ``kernel NAME { ... }`` (``#`` comments skipped when matching braces). None if neither."""
    fences = _FENCE.findall(answer or "")
    for lang, body in fences:
        if lang.lower() == "l2gen":
            return body.strip()
    for _, body in fences:
        if _KERNEL.search(body):
            answer = body
            break
    start = _KERNEL.search(answer or "")
    if not start:
        return None
    depth, i, text = 0, start.start(), answer
    while i < len(text):
        c = text[i]
        if c == "#":
            nl = text.find("\n", i)
            i = len(text) if nl < 0 else nl
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[start.start() : i + 1]
        i += 1
    return text[start.start() :].strip()  # unbalanced: let the parser say where it ends


def read_answer(answer: str, gpu: Gpu) -> tuple[Program | None, list[Diagnostic]]:
    """Parse and check a model's answer: (program, []) when valid, else the diagnostics
    (with the program when it parsed but the checker rejected it)."""
    if not (answer or "").strip():
        why = "the answer is empty; expected one `kernel NAME { ... }` program"
        return None, [Diagnostic("E-EMPTY", why, Span(ANSWER_FILE))]
    text = extract_program_text(answer)
    if text is None:
        return None, [Diagnostic("E-NOPROGRAM", "the answer holds no `kernel NAME { ... }` program", Span(ANSWER_FILE))]
    try:
        program = parse(text, ANSWER_FILE)
    except DiagnosticError as exc:
        return None, exc.diagnostics
    return program, errors(check(program, gpu))


# -- prompts ------------------------------------------------------------------------------


def instructions(gpu: Gpu, mode: str) -> str:
    """The system part of every request: task, grammar, decisions, rules, reward, format.
    It depends only on the GPU and mode, so servers can cache it as a prompt prefix."""
    if mode == "text":
        fmt = (
            "Answer with the program in one ```l2gen fenced block and nothing else. "
            "Write no comment before `kernel`."
        )
    elif mode == "responses_grammar":
        fmt = (
            f"Call the tool {TOOL_NAME} with the program as its input: "
            "the text starts with `kernel` and ends with `}`."
        )
    else:
        fmt = "Your output is held to the grammar: write only the program, starting with `kernel` and ending with `}`."
    return "\n\n".join(
        [
            "You tune fp16 GEMM kernels (C[M,N] = A[M,K] @ B, fp16 in and out, fp32 accumulation) "
            "written in the l2gen DSL. Each answer is ONE complete program for the problem in the "
            "request; it is compiled, verified and timed against cuBLAS.",
            "Grammar (Lark):\n" + grammar_text().strip(),
            DECISIONS,
            f"Rules the checker enforces on {gpu.name} (a program that breaks one is rejected unmeasured):\n"
            + rules_text(gpu),
            REWARD,
            fmt,
        ]
    )


DECISIONS = """\
Decisions (omitted ones take the default in brackets):
- arch sm80: CuTe mma.sync 16x8x16 + cp.async + ldmatrix; low overhead, good for small, skinny or
  decode shapes. arch sm90a: wgmma + TMA, warp-specialized: CUTLASS's kernels (impl cutlass, the
  default), best for large shapes, or l2gen's own (impl l2gen), for small M and long K.
- b kn: B is K x N (A @ B); b nk: B is N x K (A @ W.T). [kn]
- tile BM x BN x BK: the output tile of one block and the K step of its mainloop.
- sm80 only: warps WM x WN (warp grid over the tile) [2 x 2]; stages (cp.async pipeline depth) [3];
  smem_swizzle B 3 3 (shared-memory Swizzle<B,3,3>) [3 3 3]; epilogue smem|direct [smem];
  split_k none|parallel|atomic|ordered (K slices; parallel: fp32 partials, a second kernel
  reduces; atomic: one launch, slices add into a workspace tile, the last writes C; ordered:
  one launch, a slot per slice summed in order, deterministic) [none];
  min_blocks (launch-bounds minimum resident blocks per SM) [1].
- sm90a only: cluster CM x CN x 1 (CTAs sharing TMA multicast) [1 x 1 x 1];
  mainloop ws|pingpong|cooperative [cooperative]; epilogue tma|direct [tma];
  epilogue_tile N (tma only: columns of C per TMA store, a multiple of 16 dividing BN) [CUTLASS's 32];
  epilogue_stages N (tma only: 1..4 tiles of C staged, their TMA stores in flight) [CUTLASS's min(tiles, 2)];
  stages N|auto [auto]; scheduler persistent|stream_k [persistent];
  decomposition heuristic|data_parallel|split_k|stream_k (stream_k scheduler only) [heuristic].
- sm90a impl l2gen only (no mainloop, epilogue, epilogue_tile, epilogue_stages, scheduler): swap_ab on|off
  (compute C^T = B^T A^T: N along wgmma's 64-row side, M along its N; for small M) [off];
  BK 64, 128 or 256 (a deeper K tile keeps more bytes in flight for few CTAs streaming a
  long K); stages N [4]; split_k none|cluster|atomic|ordered (cluster: the splits CTAs of a tile reduce
  through distributed shared memory, deterministic; atomic: they add into a workspace, arrival
  order; ordered: each writes a workspace slot, the last sums them in split order,
  deterministic, splits <= 16; all in one launch; more splits than ceil(K/BK) fail at run
  time) [none]; hints none|stream (B evict-first, A evict-last in L2) [none];
  cluster CM x CN x 1 (neighbouring output tiles load a shared tile of A (along N) or B (along
  M) once and multicast it: less L2-to-SM traffic) [1 x 1 x 1]; decomposition
  heuristic|data_parallel|stream_k (a run-time knob: heuristic runs a persistent grid of the
  CTAs the GPU holds when the tiles times splits outnumber them, each CTA storing one tile
  while it loads the next; data_parallel one CTA per tile and split, in waves; stream_k, with
  split_k atomic and splits 1, runs that grid's whole waves of tiles, then cuts each
  remaining tile into equal K pieces, a CTA each, so the last partial wave runs shorter)
  [heuristic]; pdl on|off (programmatic dependent launch: overlaps the launch with
  the kernel before it; a call timed alone, as here, gains nothing from it) [off].
- Run-time knobs (no rebuild): raster heuristic|along_m|along_n [heuristic]; swizzle S
  (block-swizzle group of 2^S tiles) [0]; splits (K slices for split_k parallel, cluster,
  atomic or ordered, or stream_k) [1]; sm90a only, grid N (at most N CTAs in a persistent
  launch, whole clusters, N <= the SM count; kernels that loop over their tiles: CUTLASS
  pingpong or cooperative, l2gen but split_k cluster or data_parallel; fewer CTAs give
  stream-K longer runs) [0: every SM].
Few output tiles for many SMs (small M or N, long K) call for split-K / stream-K; large square
shapes for big tiles, clusters and deep pipelines."""

REWARD = (
    "Reward: ln(cuBLAS-best time / your kernel's time): 0 at parity, above 0 when faster. "
    f"A program the checker rejects scores {REWARD_REJECTED}; one that fails to build or run, "
    f"computes a wrong result or times out scores {REWARD_FAILED}. Kernel names are cosmetic: a "
    "program that differs from a measured one only in its name is a repeat and is not measured. "
    "Study the measured programs: keep what made the best ones fast, avoid what failed, and "
    "propose a program not measured yet."
)


FAMILY_LABELS = {Family.SM80: "sm80", Family.SM90: "sm90a", Family.SM90_L2GEN: "sm90a impl l2gen"}
EVERY_PROGRAM = "every program"


def rules_text(gpu: Gpu) -> str:
    """The checker's rules (:data:`l2gen.rules.RULES`) for the families ``gpu`` runs, one
    line per family, each rule's statement filled in with the limits and the GPU's figures."""
    lines = [(EVERY_PROGRAM, [r for r in RULES if set(r.families) == set(Family)])]
    for family in gpu.families():
        lines.append((FAMILY_LABELS[family], [r for r in rules_for(family) if set(r.families) != set(Family)]))
    return "\n".join(f"- {label}: " + "; ".join(r.state(gpu) for r in group) + "." for label, group in lines)


def shape_facts(shape: Shape, gpu: Gpu) -> str:
    m, n, k = shape.m, shape.n, shape.k
    flops = 2.0 * m * n * k
    bytes_ = 2.0 * (m * k + k * n + m * n)
    compute_us = 1e6 * flops / (gpu.peak_tflops_fp16 * 1e12)
    memory_us = 1e6 * bytes_ / (gpu.bandwidth_tbs * 1e12)
    bound = "compute" if compute_us >= memory_us else "memory"
    tiles = ", ".join(
        f"{bm}x{bn}: {_tiles(m, bm) * _tiles(n, bn)} tiles" for bm, bn in ((64, 64), (128, 128), (128, 256))
    )
    fits = ", ".join(f"{bm}x{bn}: {t} tiles, {100 * eff:.0f}% of {w} wave{'s' if w > 1 else ''}"
                     for bm, bn, t, w, eff in wave_fits(shape, gpu))
    return (
        f"Problem: M={m} N={n} K={k} ({flops / 1e9:.3g} GFLOP, {bytes_ / 1e6:.3g} MB of operands).\n"
        f"Target: {gpu.name} (sm_{gpu.sm}): {gpu.sms} SMs, {gpu.smem_per_block} B shared memory per block, "
        f"L2 {gpu.l2_bytes / 2**20:.0f} MiB, {gpu.peak_tflops_fp16:g} TFLOP/s fp16, {gpu.bandwidth_tbs:g} TB/s.\n"
        f"Floor time {gpu.floor_us(m, n, k):.3g} us "
        f"({bound}-bound: compute {compute_us:.3g} us, memory {memory_us:.3g} us). "
        f"Output tiles per launch: {tiles} (vs {gpu.sms} SMs). "
        f"Tile widths that fill the SMs' waves best: {fits}."
    )


def wave_fits(shape: Shape, gpu: Gpu, top: int = 3) -> list[tuple[int, int, int, int, float]]:
    """(BM, BN, tiles, waves, useful share of the waves) of the 128-row tiles 96..256 wide
    and the 256-row ones 96..128 wide (large enough to keep the tensor cores busy) that fill
    whole waves of one CTA per SM best, counting a tile's part past the problem's edge as
    waste, the larger tile first among equals (a tile count that leaves the last wave short
    wastes SMs: 2048 x 3584 is 224 tiles of 128 x 256 but 256 of 128 x 224)."""
    out = []
    for bm, widths in ((128, range(96, 257, 16)), (256, range(96, 129, 16))):
        for bn in widths:
            tiles = _tiles(shape.m, bm) * _tiles(shape.n, bn)
            waves = _tiles(tiles, gpu.sms)
            out.append((bm, bn, tiles, waves, shape.m * shape.n / (waves * gpu.sms * bm * bn)))
    out.sort(key=lambda f: (-round(f[4], 2), -f[0] * f[1]))
    return out[:top]


def task_prompt(
    shape: Shape, gpu: Gpu, ex: Examples, proposed: Sequence[Program] = (), repeated: Program | None = None,
    ranked: Sequence[tuple[Program, float]] = (),
) -> str:
    """The request for one new program for ``shape`` (``repeated``: the previous answer,
    which repeated a known program; ``ranked``: the cost model's first knob settings of the
    kernel library for the shape, with the µs it predicts)."""
    parts = [shape_facts(shape, gpu)]
    if ranked:
        parts.append("The cost model's first choices among the kernel library's configurations for this shape "
                     "(predicted µs: a model fit on measurements, not a measurement):\n"
                     + _lines(f"{one_line(p)} -> ~{us:.1f} us" for p, us in ranked))
    if ex.best:
        parts.append("Fastest measured on this shape (speedup over cuBLAS-best):\n" + _lines(map(_entry, ex.best)))
    else:
        parts.append("Nothing measured on this shape yet.")
    if ex.worst:
        parts.append("Slowest and failed on this shape:\n" + _lines(map(_entry, ex.worst)))
    if ex.similar:
        parts.append(
            "Best on similar shapes:\n" + "\n".join(f"{s.m}x{s.n}x{s.k}: {_entry(e)}" for s, e in ex.similar)
        )
    if proposed:
        parts.append("Already proposed in this round (propose something else):\n" + _lines(map(one_line, proposed)))
    if repeated is not None:
        parts.append(
            f"Your previous answer repeats a program already measured or proposed:\n{one_line(repeated)}\n"
            "Change at least one decision."
        )
    parts.append(f"Write one new program for M={shape.m} N={shape.n} K={shape.k}.")
    return "\n\n".join(parts)


def repair_prompt(shape: Shape, gpu: Gpu, answer: str, diags: Sequence[Diagnostic]) -> str:
    """The request to correct an answer that did not parse or check."""
    shown = (extract_program_text(answer) or answer or "").strip()[:2000] or "(empty)"
    return "\n\n".join(
        [
            shape_facts(shape, gpu),
            f"Your previous answer, read as {ANSWER_FILE}:\n{shown}",
            "It was rejected with these diagnostics:\n" + "\n".join(str(d) for d in diags),
            "Answer with one corrected program (keep its intent, fix every diagnostic).",
        ]
    )



# -- small helpers ---------------------------------------------------------------------------


def one_line(program: Program) -> str:
    """The canonical text of a program on one line (still valid DSL)."""
    return " ".join(format_program(program).split())


def _lines(items) -> str:
    return "\n".join(items)


def _entry(e: Entry) -> str:
    if e.speedup is not None:
        return f"{e.speedup:.3f}x  {e.text}"
    why = f" ({e.error})" if e.error else ""
    return f"{e.status}{why}  {e.text}"


def _set(values) -> str:
    return "{" + ", ".join(str(v) for v in values) + "}"


def _tiles(extent: int, tile: int) -> int:
    return -(-extent // tile)
