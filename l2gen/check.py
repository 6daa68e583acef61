"""Checking: every well-formed program that would not compile or not run gets a diagnostic.

The rules here are the contract of the templates: a program this module accepts lowers to
a translation unit that nvcc compiles without a ``static_assert`` firing and that runs on
the target GPU. Property tests compile random accepted programs to hold it to that.
Device limits come from :mod:`l2gen.targets`; nothing here hard-codes a GPU.
"""

from __future__ import annotations

from .diagnostics import Diagnostic
from .ir import (
    Decomposition,
    Mainloop,
    Program,
    Scheduler,
    Sm80Config,
    Sm90Config,
    Sm90Epilogue,
    Sm90L2genConfig,
    SplitK,
)
from .targets import Gpu

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
SM90_MAX_ACC_PER_THREAD = 208  # at 224 ptxas serializes wgmma (C7511/C7512) and spills

# l2gen's own sm90a kernel (templates/sm90_l2gen_gemm.cu.j2), in its kernel coordinates:
# rows along wgmma's M side (64 per consumer warpgroup), columns along its N.
L2GEN_ROWS = (64, 128)
L2GEN_COLS = tuple(range(8, 257, 8))
L2GEN_TILE_K = (64, 128)
L2GEN_STAGES = range(2, 9)
L2GEN_MAX_SPLITS = 8  # the portable cluster size: the CTAs of one cluster split one tile
L2GEN_MAX_CLUSTER = 8  # CTAs of one multicast cluster (the portable size)


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


def sm90_stages_and_smem(cfg: Sm90Config, limit: int = 232448) -> tuple[int, int]:
    """(stage count, shared memory bytes per CTA) of an sm90 kernel, exactly as CUTLASS
    4.2 lays out its SharedStorage (derived from the template's builds; see the formula in
    templates/sm90_gemm.cu.j2). With ``stages`` auto, CUTLASS carves out the epilogue and
    fills ``limit`` with as many mainloop stages as fit."""
    bm, bn, bk = cfg.tile.m, cfg.tile.n, cfg.tile.k
    coop = cfg.mainloop is Mainloop.COOPERATIVE
    if cfg.epilogue is Sm90Epilogue.TMA:
        em = min(bm, 128 if coop else 64)
        en = 32 if bn % 32 == 0 else 16
        al = 512 if en == 32 else 256
        tiles = (bm // em) * (bn // en)
        epi_t = min(tiles, 2) * em * en * 2 + al
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


def l2gen_smem_bytes(cfg: Sm90L2genConfig) -> int:
    """Dynamic shared memory of an sm90a l2gen kernel (the template's kSmemBytes)."""
    rows, cols = cfg.kernel_tile
    pipeline = cfg.stages * (rows + cols) * cfg.tile.k * 2
    staging = cfg.tile.m * (cfg.tile.n + 8) * 2  # the tile of C, rows padded by 8 halves
    reduce = rows * cols * 4 if cfg.split_k is SplitK.CLUSTER else 0
    return max(pipeline, reduce + staging) + 16 * cfg.stages + 16 + 1024


class _Checker:
    def __init__(self, program: Program, gpu: Gpu):
        self.p = program
        self.gpu = gpu
        self.out: list[Diagnostic] = []

    def error(self, decision: str, code: str, message: str) -> None:
        self.out.append(Diagnostic(code, message, self.p.span_of(decision)))

    def one_of(self, decision: str, what: str, value: int, allowed) -> bool:
        if value in allowed:
            return True
        self.error(decision, "E-RANGE", f"{what} {value} is not one of {_list(allowed)}")
        return False

    def run(self) -> list[Diagnostic]:
        p = self.p
        if p.family not in self.gpu.families():
            self.error(
                "arch",
                "E-ARCH",
                f"arch {p.family.arch} does not run on {self.gpu.name} (sm_{self.gpu.sm})",
            )
            return self.out
        if not p.name.isidentifier():
            self.error("name", "E-NAME", f"kernel name '{p.name}' is not an identifier")
        if isinstance(p.config, Sm80Config):
            self.sm80(p.config)
        elif isinstance(p.config, Sm90L2genConfig):
            self.sm90_l2gen(p.config)
        else:
            self.sm90(p.config)
        self.knobs()
        return self.out

    def knobs(self) -> None:
        k = self.p.knobs
        if not 0 <= k.swizzle <= MAX_SWIZZLE_LOG2:
            self.error("swizzle", "E-RANGE", f"swizzle {k.swizzle} is out of range 0..{MAX_SWIZZLE_LOG2} (log2 of the group size)")
        if not 1 <= k.splits <= MAX_SPLITS:
            self.error("splits", "E-RANGE", f"splits {k.splits} is out of range 1..{MAX_SPLITS}")
        cfg = self.p.config
        if isinstance(cfg, Sm80Config) and cfg.split_k is SplitK.NONE and k.splits != 1:
            self.error("splits", "E-SPLITS", f"splits {k.splits} needs 'split_k parallel'; this kernel has 'split_k none'")
        if isinstance(cfg, Sm90L2genConfig):
            if cfg.split_k is SplitK.NONE and k.splits != 1:
                self.error("splits", "E-SPLITS", f"splits {k.splits} needs 'split_k cluster' or 'atomic'; this kernel has 'split_k none'")
            elif cfg.split_k is SplitK.CLUSTER and k.splits > L2GEN_MAX_SPLITS:
                self.error("splits", "E-SPLITS", f"splits {k.splits}: a cluster holds at most {L2GEN_MAX_SPLITS} CTAs, so 'split_k cluster' splits K at most {L2GEN_MAX_SPLITS} ways")
        if isinstance(cfg, Sm90Config):
            if cfg.scheduler is Scheduler.PERSISTENT and k.splits != 1:
                self.error("splits", "E-SPLITS", f"splits {k.splits} needs 'scheduler stream_k'; the persistent scheduler does not split K")
            if cfg.scheduler is Scheduler.PERSISTENT and k.decomposition is not Decomposition.HEURISTIC:
                self.error("decomposition", "E-SCHED", "'decomposition' applies only to 'scheduler stream_k'")
            # CUTLASS's stream-K scheduler takes a fixed split count only for the heuristic and
            # split-K decompositions (its can_implement; the template's check_knobs says the same).
            decomposition = Decomposition(k.decomposition)
            if (
                cfg.scheduler is Scheduler.STREAM_K
                and k.splits > 1
                and decomposition not in (Decomposition.HEURISTIC, Decomposition.SPLIT_K)
            ):
                self.error(
                    "decomposition",
                    "E-SPLITS",
                    f"splits {k.splits} needs 'decomposition heuristic' or 'split_k'; "
                    f"'{decomposition.value}' chooses its own split (use splits 1)",
                )

    def sm80(self, c: Sm80Config) -> None:
        t = c.tile
        ok = self.one_of("tile", "tile BM", t.m, SM80_TILE_M)
        ok &= self.one_of("tile", "tile BN", t.n, SM80_TILE_N)
        ok &= self.one_of("tile", "tile BK", t.k, SM80_TILE_K)
        wm, wn = c.warps
        ok &= self.one_of("warps", "warps WM", wm, SM80_WARPS)
        ok &= self.one_of("warps", "warps WN", wn, SM80_WARPS)
        if not ok:
            return
        if c.threads > SM80_MAX_THREADS:
            self.error("warps", "E-WARPS", f"warps {wm} x {wn} make {c.threads} threads; the sm80 template takes at most {SM80_MAX_THREADS}")
            return
        if t.m % (16 * wm):
            self.error("warps", "E-ATOM", f"tile BM {t.m} is not a multiple of 16 x WM = {16 * wm} (the mma.sync atom is 16 rows)")
        if t.n % (16 * wn):
            self.error("warps", "E-ATOM", f"tile BN {t.n} is not a multiple of 16 x WN = {16 * wn} (ldmatrix.x4 loads 16 columns of B per warp)")
        for name, rows in (("A", t.m), ("B", t.n)):
            chunks = rows * t.k // 8  # 16-byte cp.async chunks per stage
            if chunks % c.threads:
                self.error("tile", "E-COPY", f"the {name} tile ({rows} x {t.k}) has {chunks} 16-byte chunks, not a multiple of {c.threads} threads")
        acc = t.m * t.n // c.threads
        if acc > SM80_MAX_ACC_PER_THREAD:
            self.error("tile", "E-REGS", f"{acc} fp32 accumulators per thread (tile {t} over {c.threads} threads) exceed the register budget of {SM80_MAX_ACC_PER_THREAD}; add warps or shrink the tile")
        if c.split_k in (SplitK.CLUSTER, SplitK.ATOMIC):
            self.error("split_k", "E-SPLITK", f"'split_k {c.split_k.value}' is the sm90a l2gen kernel's ('impl l2gen'); sm80 takes 'none' or 'parallel'")
        if c.stages not in SM80_STAGES:
            self.error("stages", "E-RANGE", f"stages {c.stages} is out of range {SM80_STAGES.start}..{SM80_STAGES.stop - 1}")
        b, m, s = c.swizzle
        if (m, s) != (3, 3) or b not in (0, 1, 2, 3):
            self.error("smem_swizzle", "E-SWIZZLE", f"smem_swizzle {b} {m} {s} is not supported; use B 3 3 with B in 0..3")
        else:
            period = 64 << b  # elements in one swizzle period; each stage must hold whole periods
            for name, rows in (("A", t.m), ("B", t.n)):
                if (rows * t.k) % period:
                    self.error("smem_swizzle", "E-SWIZZLE", f"the {name} stage ({rows} x {t.k}) is not a whole number of Swizzle<{b},3,3> periods ({period} elements)")
        smem = sm80_smem_bytes(c)
        if smem > self.gpu.smem_per_block:
            self.error("stages", "E-SMEM", f"{smem} bytes of shared memory ({c.stages} stages of {t}) exceed the {self.gpu.smem_per_block} a block may use on {self.gpu.name}")
        if not 1 <= c.min_blocks <= 4:
            self.error("min_blocks", "E-RANGE", f"min_blocks {c.min_blocks} is out of range 1..4")
            return
        if c.min_blocks * c.threads > 2048:
            self.error("min_blocks", "E-OCCUPANCY", f"{c.min_blocks} blocks of {c.threads} threads exceed 2048 threads per SM")
        if c.min_blocks > 1 and smem * c.min_blocks > self.gpu.smem_per_sm:
            self.error("min_blocks", "E-OCCUPANCY", f"{c.min_blocks} blocks of {smem} bytes of shared memory do not fit the {self.gpu.smem_per_sm} of one SM")
        cap = min(255, self.gpu.regs_per_sm // (c.threads * c.min_blocks))
        need = sm80_register_estimate(c)
        if acc <= SM80_MAX_ACC_PER_THREAD and need > cap - SM80_REGISTER_MARGIN:
            where = "min_blocks" if c.min_blocks > 1 else "tile"
            self.error(where, "E-REGS", f"about {need} registers per thread needed (tile {t}, warps {wm} x {wn}); {cap} available at min_blocks {c.min_blocks}, so it would spill")

    def sm90_l2gen(self, c: Sm90L2genConfig) -> None:
        t = c.tile
        rows, cols = c.kernel_tile
        side = "BN" if c.swap_ab else "BM"
        other = "BM" if c.swap_ab else "BN"
        swapped = " (swap_ab on: BN runs along wgmma's 64-row side)" if c.swap_ab else ""
        ok = self.one_of("tile", f"tile {side}", rows, L2GEN_ROWS)
        if cols not in L2GEN_COLS:
            self.error("tile", "E-RANGE", f"tile {other} {cols} is not a wgmma width: a multiple of 8 from 8 to 256{swapped}")
            ok = False
        ok &= self.one_of("tile", "tile BK", t.k, L2GEN_TILE_K)
        if not ok:
            return
        _, q_kmajor = l2gen_operands(self.p)
        if not q_kmajor and cols % 64:
            self.error("tile", "E-ATOM", f"tile {other} {cols}: B stored K x N ('b kn') is N-major, and its tile must span whole 64-column swizzle atoms")
        if c.split_k is SplitK.PARALLEL:
            self.error("split_k", "E-SPLITK", "'split_k parallel' is the sm80 family's; the l2gen sm90a kernel takes 'none', 'cluster' or 'atomic'")
        self.l2gen_cluster(c)
        if c.stages not in L2GEN_STAGES:
            self.error("stages", "E-RANGE", f"stages {c.stages} is out of range {L2GEN_STAGES.start}..{L2GEN_STAGES.stop - 1}")
            return
        smem = l2gen_smem_bytes(c)
        if smem > self.gpu.smem_per_block:
            self.error("stages", "E-SMEM", f"{smem} bytes of shared memory ({c.stages} stages of {t}) exceed the {self.gpu.smem_per_block} a block may use on {self.gpu.name}")

    def cluster_sides(self, cluster: tuple[int, int, int]) -> bool:
        """Whether a cluster's M and N sides are legal and its K side is 1 (diagnosed if not)."""
        cm, cn, ck = cluster
        ok = self.one_of("cluster", "cluster M", cm, SM90_CLUSTER)
        ok &= self.one_of("cluster", "cluster N", cn, SM90_CLUSTER)
        if ck != 1:
            self.error("cluster", "E-CLUSTER", f"cluster K {ck} must be 1")
            ok = False
        return ok

    def l2gen_cluster(self, c: Sm90L2genConfig) -> None:
        if not self.cluster_sides(c.cluster) or not c.multicast:
            return
        cm, cn, _ = c.cluster
        if cm * cn > L2GEN_MAX_CLUSTER:
            self.error("cluster", "E-CLUSTER", f"cluster {cm} x {cn} has {cm * cn} CTAs; the l2gen kernel's clusters hold at most {L2GEN_MAX_CLUSTER}")
            return
        if c.split_k is SplitK.CLUSTER:
            self.error("cluster", "E-CLUSTER", "'split_k cluster' makes the CTAs of one tile a cluster; a multicast cluster takes 'split_k none' or 'atomic'")
        # Each CTA of a multicast group loads one piece of the shared tile: a slice of the
        # box's outer extent that must stay whole 8-row swizzle atoms.
        for operand, outer, pieces in l2gen_multicast_pieces(self.p):
            if pieces > 1 and (outer % pieces or (outer // pieces) % 8):
                self.error("cluster", "E-CLUSTER", f"cluster {cm} x {cn}: the {operand} tile's {outer} rows per box split over {pieces} CTAs leave {outer / pieces:g}, not a multiple of 8 (the swizzle atom)")

    def sm90(self, c: Sm90Config) -> None:
        t = c.tile
        ok = self.one_of("tile", "tile BM", t.m, SM90_TILE_M)
        ok &= self.one_of("tile", "tile BN", t.n, SM90_TILE_N)
        ok &= self.one_of("tile", "tile BK", t.k, SM90_TILE_K)
        ok &= self.cluster_sides(c.cluster)
        if not ok:
            return
        cm, cn, _ = c.cluster
        if cm * cn > self.gpu.max_cluster:
            self.error("cluster", "E-CLUSTER", f"cluster {cm} x {cn} has {cm * cn} CTAs; {self.gpu.name} allows at most {self.gpu.max_cluster}")
        if c.mainloop is Mainloop.COOPERATIVE and t.m % 128:
            self.error("mainloop", "E-SCHED", f"the cooperative mainloop splits BM over two warpgroups and needs BM of 128 or 256; tile BM is {t.m}")
        if c.scheduler is Scheduler.STREAM_K and c.mainloop is not Mainloop.COOPERATIVE:
            self.error("scheduler", "E-SCHED", "the stream-K scheduler needs 'mainloop cooperative'")
        threads = 256 if c.mainloop is Mainloop.COOPERATIVE else 128  # threads sharing one tile's accumulators
        acc = t.m * t.n // threads
        if acc > SM90_MAX_ACC_PER_THREAD:
            self.error("tile", "E-REGS", f"tile {t} needs {acc} fp32 accumulators per thread ({c.mainloop.value}); above {SM90_MAX_ACC_PER_THREAD} ptxas serializes wgmma and spills")
        if c.stages and c.stages not in SM90_STAGES:
            self.error("stages", "E-RANGE", f"stages {c.stages} is out of range {SM90_STAGES.start}..{SM90_STAGES.stop - 1} (or auto)")
            return
        stages, smem = sm90_stages_and_smem(c, self.gpu.smem_per_block)
        if stages < 2:
            self.error("stages" if c.stages else "tile", "E-SMEM", f"tile {t} leaves room for {stages} pipeline stage(s) beside the epilogue in {self.gpu.smem_per_block} bytes; the mainloop needs 2")
        elif smem > self.gpu.smem_per_block:
            self.error("stages", "E-SMEM", f"{smem} bytes of shared memory ({stages} stages of {t}) exceed the {self.gpu.smem_per_block} a block may use on {self.gpu.name}")


def _list(values) -> str:
    values = list(values)
    if len(values) > 8 and values == list(range(values[0], values[-1] + 1, values[1] - values[0])):
        return f"{values[0]}, {values[1]}, ..., {values[-1]}"
    return ", ".join(str(v) for v in values)


def check(program: Program, gpu: Gpu) -> list[Diagnostic]:
    """All diagnostics for a program on a GPU; an empty list means it lowers and runs."""
    return _Checker(program, gpu).run()


def is_valid(program: Program, gpu: Gpu) -> bool:
    return not any(d.is_error for d in check(program, gpu))
