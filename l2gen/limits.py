"""The templates' limits and the resources a kernel uses: the numbers the rules in
:mod:`l2gen.rules` hold programs to, and the arithmetic of shared memory and registers
that the rules, the search space and the simulator share. Device limits come from
:mod:`l2gen.targets`; nothing here hard-codes a GPU.
"""

from __future__ import annotations

from .ir import (
    Decomposition,
    Mainloop,
    Program,
    Sm80Config,
    Sm90Config,
    Sm90Epilogue,
    Sm90L2genConfig,
    SplitK,
)

MAX_SPLITS = 64
MAX_SWIZZLE_LOG2 = 3

# sm80 family (templates/sm80_gemm.cu.j2)
SM80_TILE_M = (16, 32, 64, 128, 256)
SM80_TILE_N = (32, 64, 128, 256)
SM80_TILE_K = (32, 64)
SM80_WARPS = (1, 2, 4, 8)
SM80_MAX_THREADS = 256
SM80_STAGES = range(2, 9)
SM80_MAX_ACC_PER_THREAD = 128  # fp32 accumulators per thread before registers spill
SM80_REGISTER_MARGIN = 23  # headroom under the register cap that kept every sample spill-free

# sm90 family (templates/sm90_gemm.cu.j2)
SM90_TILE_M = (64, 128, 256)
SM90_TILE_N = tuple(range(16, 257, 16))
SM90_TILE_K = (32, 64, 128)
SM90_CLUSTER = (1, 2, 4, 8)
SM90_STAGES = range(2, 9)
# TMA epilogue store depths a program may choose: one buffer (each epilogue tile waits for the
# last store to have read it) to four
SM90_EPILOGUE_STAGES = range(1, 5)
SM90_MAX_ACC_PER_THREAD = 208  # at 224 ptxas serializes wgmma (C7511/C7512) and spills

# l2gen's own sm90a kernel (templates/sm90_l2gen_gemm.cu.j2), in its kernel coordinates:
# rows along wgmma's M side (two consumer warpgroups from 128 rows on, each taking half),
# columns along its N.
L2GEN_ROWS = (64, 128, 256)
L2GEN_MAX_ACC = 128  # fp32 accumulators per consumer thread (a 256-row tile: BN <= 128)
L2GEN_COLS = tuple(range(8, 257, 8))
L2GEN_TILE_K = (64, 128, 256)
L2GEN_STAGES = range(2, 17)
L2GEN_MAX_SPLITS = 8  # the portable cluster size: the CTAs of one cluster split one tile
L2GEN_MAX_ORDERED_SPLITS = 16  # split_k ordered: the slots the last CTA of a tile reads back
L2GEN_MAX_CLUSTER = 8  # CTAs of one multicast cluster (the portable size)
# How the kernel's grid takes its units of work (a tile's split of K): heuristic, a
# persistent grid of the CTAs the GPU holds when the units outnumber them; data_parallel,
# one CTA per unit, in waves; stream_k, a persistent grid that runs its whole waves of tiles,
# then cuts each of the other tiles into equal K pieces, a CTA each (split_k atomic in a
# persistent kernel, splits 1).
L2GEN_DECOMPOSITIONS = (Decomposition.HEURISTIC, Decomposition.DATA_PARALLEL, Decomposition.STREAM_K)
# stream_k: the K pieces at most into which a tile left over after the whole waves is cut
# (the template's L2GEN_SK_MAX_PARTS, rendered from here; the cost model reads it too)
L2GEN_SK_MAX_PARTS = 8


def stream_k_plan(tiles: int, kt: int, grid: int) -> tuple[int, int, int]:
    """Stream-K's split of ``tiles`` tiles of ``kt`` K tiles over a grid of ``grid`` CTAs,
    as the kernel makes it (``stream_k_plan`` in templates/stream_k.cuh.j2, its default
    build): (the tiles run whole, whole waves of the grid; the CTAs that take a piece of the
    rest; the equal K pieces each left-over tile is cut into, 0 when none is left over).
    tests/unit/test_stream_k_schedule.py holds the two to the same answers."""
    whole = tiles // grid * grid
    rest = tiles - whole
    if rest == 0:
        return whole, 0, 0
    parts = min(grid // rest, L2GEN_SK_MAX_PARTS, kt)
    return whole, rest * parts, parts


def sm80_smem_bytes(cfg: Sm80Config) -> int:
    """Dynamic shared memory of an sm80 kernel: the pipeline, or the epilogue tile if larger
    (the epilogue reuses the pipeline's buffer; its rows are padded by 8 halves)."""
    pipeline = cfg.stages * (cfg.tile.m + cfg.tile.n) * cfg.tile.k * 2
    epilogue = cfg.tile.m * (cfg.tile.n + 8) * 2 if cfg.epilogue.value == "smem" else 0
    return max(pipeline, epilogue)


def sm80_register_estimate(cfg: Sm80Config) -> int:
    """Registers per thread: accumulators, double-buffered A/B fragments, addressing.

    Calibrated on ``nvcc -Xptxas -v`` reports of the template (sm_80 and sm_90): every
    sampled config with ``estimate <= cap - SM80_REGISTER_MARGIN`` compiled spill-free.
    """
    t, (wm, wn) = cfg.tile, cfg.warps
    acc = t.m * t.n // cfg.threads
    fragments = 2 * (4 * (t.m // (16 * wm)) + 2 * (t.n // (8 * wn)))
    return acc + fragments + 40


def _up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def sm90_epilogue_tile(cfg: Sm90Config) -> tuple[int, int]:
    """(rows, columns) of an sm90 kernel's TMA epilogue tile: the program's ``epilogue_tile``
    columns or CUTLASS's EpilogueTileAuto (32, or 16 where BN is not a multiple of 32), on
    128 rows cooperative, 64 otherwise (at most BM)."""
    rows = min(cfg.tile.m, 128 if cfg.mainloop is Mainloop.COOPERATIVE else 64)
    return rows, cfg.epilogue_tile or auto_epilogue_columns(cfg)


def sm90_epilogue_tiles(cfg: Sm90Config) -> int:
    """Epilogue tiles per output tile of an sm90 kernel's TMA epilogue."""
    em, en = sm90_epilogue_tile(cfg)
    return (cfg.tile.m // em) * (cfg.tile.n // en)


def auto_epilogue_stages(cfg: Sm90Config) -> int:
    """CUTLASS's builder's TMA store depth (StagesD): min(epilogue tiles per output tile, 2)."""
    return min(sm90_epilogue_tiles(cfg), 2)


def sm90_epilogue_stages(cfg: Sm90Config) -> int:
    """Tiles of C staged in shared memory at once (TMA stores in flight): the program's
    ``epilogue_stages`` or CUTLASS's own."""
    return cfg.epilogue_stages or auto_epilogue_stages(cfg)


def auto_epilogue_columns(cfg: Sm90Config) -> int:
    """The columns of CUTLASS's EpilogueTileAuto for an sm90 tile (fp16 output)."""
    return 32 if cfg.tile.n % 32 == 0 else 16


def sm90_stages_and_smem(cfg: Sm90Config, limit: int = 232448) -> tuple[int, int]:
    """(stage count, shared memory bytes per CTA) of an sm90 kernel, exactly as CUTLASS
    4.2 lays out its SharedStorage (derived from the template's builds; see the formula in
    templates/sm90_gemm.cu.j2). With ``stages`` auto, CUTLASS carves out the epilogue and
    fills ``limit`` with as many mainloop stages as fit."""
    bm, bn, bk = cfg.tile.m, cfg.tile.n, cfg.tile.k
    if cfg.epilogue is Sm90Epilogue.TMA:
        em, en = sm90_epilogue_tile(cfg)
        al = 1024 if en % 64 == 0 else 512 if en % 32 == 0 else 256  # its swizzle atom: 8 rows of 128, 64 or 32 B
        tiles = sm90_epilogue_tiles(cfg)
        epi_t = sm90_epilogue_stages(cfg) * em * en * 2 + al
        epi_p = 16 * min(tiles, 4)
        epi_ss = _up(epi_t + epi_p, al)
    else:
        epi_t, epi_p, epi_ss, al = 1, 2, 1, 128
    stages = cfg.stages or (limit - _up(epi_ss, 128)) // (_up(2 * bk * (bm + bn), 128) + 16)
    main = stages * 2 * bk * (bm + bn)
    align = max(128, al)
    if cfg.mainloop is Mainloop.WS:
        smem = _up(_up(max(main, epi_t), align) + 16 * stages + _up(epi_p, 16), align)
    else:
        barriers = 16 * stages + _up(epi_p, 16) + 32 + (32 if cfg.mainloop is Mainloop.PINGPONG else 0)
        epilogue = epi_t if cfg.epilogue is Sm90Epilogue.TMA else 128
        smem = _up(_up(barriers, align) + epilogue + main, align)
    return stages, smem


def l2gen_operands(program: Program) -> tuple[bool, bool]:
    """(P is K-major, Q is K-major) of an sm90a l2gen program: A is always K-major, B is
    K-major when stored N x K; swap_ab makes B the kernel's P operand and A its Q."""
    b_kmajor = program.b_layout.value == "nk"
    return (b_kmajor, True) if program.config.swap_ab else (True, b_kmajor)


def l2gen_multicast_pieces(program: Program) -> list[tuple[str, int, int]]:
    """(operand, outer extent of its TMA box, CTAs sharing the load) for A and B of an sm90a
    l2gen program. A K-major box is 64 K-columns by the tile's rows; an MN-major one is 64
    MN-columns by the K tile. A kernel operand shared by a cluster row or column is loaded
    in that many pieces of the box's outer extent, each multicast to the CTAs sharing it."""
    cfg = program.config
    rows, cols = cfg.kernel_tile
    crows, ccols = cfg.kernel_cluster
    p_kmajor, q_kmajor = l2gen_operands(program)
    p_name, q_name = ("B", "A") if cfg.swap_ab else ("A", "B")
    return [
        (p_name, rows if p_kmajor else cfg.tile.k, ccols),  # P: shared along the kernel's N
        (q_name, cols if q_kmajor else cfg.tile.k, crows),  # Q: shared along its M
    ]


L2GEN_SMEM_LIMIT = 232448  # the shared memory a Hopper block may opt into (the template's limit)


def l2gen_tma_store(cfg: Sm90L2genConfig) -> bool:
    """Whether the persistent kernel stores C by TMA (the template's kTmaStore): one CTA
    writes each tile in C's orientation (no swap_ab) in boxes of 64 columns, the tile whole
    or, under an atomic split of K with at most 64 accumulators a consumer thread, the sum
    its last split read back. The one-unit kernel's threads store it."""
    if cfg.swap_ab or cfg.tile.n % 64:
        return False
    if cfg.split_k is SplitK.ATOMIC:
        return cfg.tile.m * cfg.tile.n // (128 * cfg.consumers) <= 64
    return cfg.split_k is SplitK.NONE


def _l2gen_smem_parts(cfg: Sm90L2genConfig) -> tuple[int, int, int, int]:
    """The pipeline's bytes, the epilogue's in the one-unit kernel and in the persistent one,
    and the barriers' (full and empty per stage, the ticket)."""
    rows, cols = cfg.kernel_tile
    pipeline = cfg.stages * (rows + cols) * cfg.tile.k * 2
    barriers = 16 * cfg.stages + 16
    staging = cfg.tile.m * (cfg.tile.n + 8) * 2  # the tile of C, rows padded by 8 halves
    reduce = rows * cols * 4 if cfg.split_k is SplitK.CLUSTER else 0
    loop_staging = staging
    if l2gen_tma_store(cfg):  # boxes of 64 columns (128 bytes) by the tile's rows: one per
        box = cfg.tile.m * 128  # box of the tile where they fit, else two, else one
        boxes = cfg.tile.n // 64
        apart = -(-(max(pipeline, reduce + staging) + barriers) // 1024) * 1024
        if apart + boxes * box + 1024 <= L2GEN_SMEM_LIMIT:
            loop_staging = boxes * box
        else:
            two = boxes >= 2 and apart + 2 * box + 1024 <= L2GEN_SMEM_LIMIT
            loop_staging = (2 if two else 1) * box
    return pipeline, reduce + staging, reduce + loop_staging, barriers


def l2gen_smem_bytes(cfg: Sm90L2genConfig) -> int:
    """The least dynamic shared memory an sm90a l2gen kernel needs, the epilogue staged over
    the drained pipeline (the template's kSmemBytes, with 1 KB of room to align the base):
    what the checker holds a program to, and what a launch of one CTA per unit takes."""
    pipeline, epilogue, _, barriers = _l2gen_smem_parts(cfg)
    return max(pipeline, epilogue) + barriers + 1024


def l2gen_persistent_smem_bytes(cfg: Sm90L2genConfig) -> int:
    """Shared memory of a persistent launch (the template's kPersistentSmemBytes): the
    epilogue's buffers apart, after the barriers, 1024-byte aligned (the swizzle atom)."""
    pipeline, epilogue, loop_epilogue, barriers = _l2gen_smem_parts(cfg)
    apart = -(-(max(pipeline, epilogue) + barriers) // 1024) * 1024
    return apart + loop_epilogue + 1024


def l2gen_persistent(cfg: Sm90L2genConfig, smem_per_block: int) -> bool:
    """Whether the kernel is built persistent (the template's kPersistent): no cluster split,
    and the epilogue's buffers fit apart from the pipeline's. A multicast cluster loops too,
    all its CTAs over the same units."""
    return cfg.split_k is not SplitK.CLUSTER and l2gen_persistent_smem_bytes(cfg) <= smem_per_block
