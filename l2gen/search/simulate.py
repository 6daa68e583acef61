"""The simulated GPU: an analytic cost model standing in for build and run.

:class:`SimulatedEvaluator` lets the search, the policies and the database be exercised and
compared in CI with no GPU and no compiler. It is a *model, not a measurement*: nothing it
says is a claim about real kernels.
"""

from __future__ import annotations

import hashlib
import math
import struct
from typing import Sequence

from ..limits import (
    l2gen_operands,
    l2gen_persistent,
    l2gen_persistent_smem_bytes,
    l2gen_smem_bytes,
    sm80_smem_bytes,
    sm90_stages_and_smem,
    stream_k_plan,
)
from ..ir import (
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
    SplitK,
    Tile,
)
from ..lower import build_key
from ..printer import format_program
from ..problem import Measurement, Shape
from ..protocol import DEFAULT_L2
from ..space import splits_apply
from ..targets import Gpu
from .base import Proposal
from .evaluate import OnResult, _emit, rejected

# Every constant below is a modelling choice, not a measured figure
# (except the Gpu record's SMs, shared memory, peak and bandwidth).

LAUNCH_US = 3.0  # launch + event overhead of one kernel
LATENCY_US = 0.7  # global-memory latency a pipeline prologue waits for
L2_TBS = 12.0  # L2 -> SM bandwidth of the whole chip
INFLIGHT_BYTES = 64 * 1024  # bytes in flight per SM that hide the memory latency
SM80_MMA_SYNC = 0.7  # mma.sync's share of the wgmma peak on sm_90
MAX_THREADS_PER_SM = 2048
SM90_SETUP_US = 0.6  # TMA descriptor prefetch, barrier init, warp-specialized role setup
# A cooperative tile's epilogue, which its tensor cores wait out, measured about 2.5 times
# the time of writing the tile to L2 (1-4 us a 128x256 tile: bench/results/README.md, "The
# persistent kernel's epilogue").
EPI_STAGING = 2.5
# l2gen's kernel, split K, from the H100's per-block timelines (bench/results/
# 2026-12-07-h100-timeline-cube1024-791ea51.txt, 2026-12-06-h100-timeline-ksplit256-ed0fdfb.txt,
# 2026-12-06-h100-timeline-waits-7d11dae.txt): a cluster split of a 128x128 tile spent 1.06 us
# storing its partial and meeting its peer, then 2.0 us reading and adding the peer's 32 KB
# half (128 CTAs: ~2 TB/s over the chip); the atomic split of 16-128 KB tiles cost 1.2-5.7 us,
# growing with the bytes every CTA of the wave adds into L2 at once (~3.3 TB/s over the chip).
DSMEM_TBS = 2.0  # distributed shared memory, the whole chip (cluster reduction)
CLUSTER_MEET_US = 1.0  # a cluster split's partial stored and its peers met
ATOMIC_TBS = 3.3  # L2 additions of an atomic split, the whole chip
# sm80 split_k ordered: what the last CTA pays per other slot beyond the bytes. Measured
# (H100, bench/results/2026-12-07-h100-sm80split-{0695e11,318aa74}-*): ordered ran 0.4-0.7 us
# per slot behind atomic on the same tiles, whether it read one slot a round trip or two.
SM80_SLOT_ROUND_TRIP_US = 0.55
# An MN-major operand whose tile width is not a multiple of 64 is loaded in TMA boxes 64 or
# 32 bytes wide (its swizzle span), which L2 delivers more slowly than 128-byte rows: at
# 256x4096x12288 on an H100 a 128x96 tile pulled 9.0 TB/s from L2 with B stored N x K and
# 7.3 with B K x N (64-byte boxes for B), 128x112 7.4 against 4.7 (32-byte boxes): the
# rates these fractions give for B's share of the bytes (bench/results/
# 2026-12-07-h100-probe-p96-73988fd.txt; 128x112 K x N: 2026-12-07-h100-probe-publicm2split-d218706.txt).
NARROW_BOX_RATE = {32: 0.65, 16: 0.35}


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _round_up(a: int, b: int) -> int:
    return _ceil(a, b) * b


def _l2_penalty(program: Program, shape: Shape, tiles_m: int, tiles_n: int, gpu: Gpu) -> float:
    """Extra DRAM traffic (fraction) from L2 misses; raster order and block swizzle shape it.

    Operands that fit comfortably in L2 are read once whatever the order; past that, a
    swizzle group near sqrt of the smaller grid side and a raster along the longer side
    keep the working set resident.
    """
    # Only an operand that more than one tile reads can miss on a second read: A is read
    # by every tile column, B by every tile row (a decode shape's weights, one tile row
    # high, stream through once whatever the order).
    footprint = 2.0 * (shape.m * shape.k * (tiles_n > 1) + shape.k * shape.n * (tiles_m > 1))
    ratio = footprint / gpu.l2_bytes
    if ratio <= 0.5:
        return 0.0
    kn = program.knobs
    ideal = min(3, max(0, round(math.log2(max(1.0, math.sqrt(min(tiles_m, tiles_n)))))))
    badness = 0.1 + 0.15 * abs(kn.swizzle - ideal)
    longer_m = tiles_m >= tiles_n
    if kn.raster is Raster.ALONG_M and not longer_m or kn.raster is Raster.ALONG_N and longer_m:
        badness += 0.2
    return min(2.0, ratio - 0.5) * badness


def _pipe(stages: int, stage_bytes: int, resident: int = 1) -> float:
    """Fraction of the L2 bandwidth a pipeline sustains, from the bytes it keeps in flight."""
    inflight = max(1, stages - 1) * stage_bytes * resident
    return min(1.0, 0.45 + 0.55 * inflight / INFLIGHT_BYTES)


def _overlap(a: float, b: float, leak: float = 0.15) -> float:
    return max(a, b) + leak * min(a, b)


def _sm80_us(program: Program, cfg: Sm80Config, shape: Shape, gpu: Gpu) -> tuple[float, float, float]:
    """(compute path, extra serial time, extra DRAM bytes) of an sm80 kernel."""
    t = cfg.tile
    kn = program.knobs
    per_sm_flops = gpu.peak_tflops_fp16 * 1e6 / gpu.sms  # flop per microsecond
    bw_sm = L2_TBS * 1e6 / gpu.sms  # bytes per microsecond
    threads = cfg.threads
    warps = threads // 32
    acc = t.m * t.n // threads
    smem = sm80_smem_bytes(cfg)
    regs = min(255, acc + 72)
    if cfg.min_blocks > 1:
        regs = min(regs, gpu.regs_per_sm // (cfg.min_blocks * threads))
    occ = max(1, min(gpu.smem_per_sm // max(smem, 1), MAX_THREADS_PER_SM // threads, gpu.regs_per_sm // (regs * threads), 16))
    tiles_m, tiles_n = _ceil(shape.m, t.m), _ceil(shape.n, t.n)
    splits = kn.splits if cfg.split_k is not SplitK.NONE else 1
    k_iters = _ceil(_ceil(shape.k, splits), t.k)
    units = tiles_m * tiles_n * splits
    waves = _ceil(units, gpu.sms * occ)
    occ = min(occ, _ceil(units, gpu.sms * waves))  # blocks actually resident per SM
    wtm, wtn = t.m // cfg.warps[0], t.n // cfg.warps[1]
    eff = SM80_MMA_SYNC * (1.0 - math.exp(-(wtm * wtn) / 600.0))
    eff *= 1.0 if t.k >= 64 else 0.95
    ideal_b = min(3, (min(t.k, 64) // 8).bit_length() - 1)
    eff *= 0.85 ** abs(ideal_b - cfg.swizzle[0])
    warps_sm = min(8, warps * occ)
    eff *= {1: 0.3, 2: 0.55, 3: 0.7, 4: 0.85, 5: 0.88, 6: 0.92, 7: 0.96, 8: 1.0}[warps_sm]
    stage_bytes = (t.m + t.n) * t.k * 2
    pipe = _pipe(cfg.stages, stage_bytes, occ)
    loaded = (min(t.m, shape.m) + min(t.n, shape.n)) * t.k * 2  # cp.async zero-fills the rest
    l2 = 1.0 + 0.05 * _l2_penalty(program, shape, tiles_m, tiles_n, gpu)
    t_comp = occ * 2.0 * t.m * t.n * t.k / (per_sm_flops * eff)
    t_mem = occ * loaded * l2 / (bw_sm * pipe)
    in_kernel = splits > 1 and cfg.split_k is not SplitK.PARALLEL
    t_epi = occ * t.m * t.n * (4 if splits > 1 and not in_kernel else 2) / bw_sm * (1.0 if cfg.epilogue is Sm80Epilogue.SMEM else 1.8) + 0.15
    if in_kernel:
        # atomic / ordered: each slice adds or stores its fp32 tile in L2 and takes a ticket;
        # the last reads the sum (ordered: every slot) back and zeroes it, as in l2gen's
        # sm90a kernel (its chain of round trips, below), on an sm80 tile's
        # occupancy-shared L2 bandwidth
        reread = 2 * splits + 1 if cfg.split_k is SplitK.ORDERED else 3
        t_epi += 1.0 + occ * t.m * t.n * 4 * reread / bw_sm / splits
        if cfg.split_k is SplitK.ORDERED:
            # a round trip per other slot: reading two a trip (<= 64 accumulators a thread)
            # measured 0-3% faster, not half the cost (2026-12-07 sm80split-*-318aa74)
            t_epi += SM80_SLOT_ROUND_TRIP_US * (splits - 1)
    wave = LATENCY_US + k_iters * _overlap(t_comp, t_mem) + t_epi
    extra, extra_bytes = 0.0, 0.0
    if splits > 1 and not in_kernel:  # fp32 partials to a workspace, then a reduction kernel
        partials = 4.0 * shape.m * shape.n * splits
        extra = 2.0 + (partials + 2.0 * shape.m * shape.n) / (gpu.bandwidth_tbs * 1e6)
        extra_bytes = partials
    return waves * wave, extra, extra_bytes


def _sm90_auto_stages(cfg: Sm90Config, gpu: Gpu) -> int:
    return max(2, min(8, sm90_stages_and_smem(cfg, gpu.smem_per_block)[0]))


def _stream_k_mode(kn: Knobs, tiles: int, slots: int) -> str:
    """What the stream-K scheduler does with these knobs (CUTLASS-like heuristic)."""
    d = kn.decomposition
    if d is Decomposition.HEURISTIC:
        if kn.splits > 1:
            return "split_k"
        util = tiles / (_ceil(tiles, slots) * slots)
        return "stream_k" if tiles < 2 * slots and util < 0.8 else "data_parallel"
    return {Decomposition.DATA_PARALLEL: "data_parallel", Decomposition.SPLIT_K: "split_k", Decomposition.STREAM_K: "stream_k"}[d]


def _cutlass_log_swizzle(blocks_m: int, blocks_n: int, swizzle_log2: int) -> int:
    """The log2 swizzle group CUTLASS's sm90 tile scheduler takes for a grid of tiles under
    max_swizzle_size = 2**swizzle_log2 (PersistentTileSchedulerSm90Params::get_log_swizzle_size):
    the smaller grid side must be at least 6, 3 or 2 tiles for a group of 8, 4 or 2."""
    least = min(blocks_m, blocks_n)
    for log2, needs in ((3, 6), (2, 3), (1, 2)):
        if swizzle_log2 >= log2 and least >= needs:
            return log2
    return 0


def _sm90_us(program: Program, cfg: Sm90Config, shape: Shape, gpu: Gpu) -> tuple[float, float, float]:
    t = cfg.tile
    kn = program.knobs
    per_sm_flops = gpu.peak_tflops_fp16 * 1e6 / gpu.sms
    bw_sm = L2_TBS * 1e6 / gpu.sms
    cm, cn, _ = cfg.cluster
    cs = cm * cn
    stages = cfg.stages or _sm90_auto_stages(cfg, gpu)
    # Ping-pong keeps two tiles in flight, one per consumer warpgroup: the tensor cores see
    # twice the tile's area (its 128x128 measured faster than cooperative 128x256 tiles on
    # the large public shapes: bench/results/README.md, "The persistent kernel's epilogue").
    area = t.m * t.n * (2 if cfg.mainloop is Mainloop.PINGPONG else 1)
    eff = 0.99 * (1.0 - math.exp(-area / 7100.0))
    if cfg.mainloop is Mainloop.WS:
        eff *= 0.9
    elif cfg.mainloop is Mainloop.PINGPONG:
        eff *= 1.0 if t.m * t.n <= 128 * 128 else 0.95
    eff *= {32: 0.93, 64: 1.0, 128: 0.98}[t.k]
    stage_bytes = (t.m + t.n) * t.k * 2
    pipe = _pipe(stages, stage_bytes)
    blocks_m, blocks_n = _ceil(shape.m, t.m), _ceil(shape.n, t.n)
    tiles_m, tiles_n = _round_up(blocks_m, cm), _round_up(blocks_n, cn)
    # CUTLASS's persistent schedulers round each side of the tile grid up to whole swizzle
    # groups of clusters, and run the padding's tiles as work (zero-filled loads, full math):
    # at M = 1024 (8 tile rows) a 2x1 cluster under swizzle 8 runs 16, and ping-pong
    # 128x128 ran 2.3-2.6x slower than on 1x2 (bench/results/2026-12-04-h200-prefillfit3-run*-dda3a49.json)
    # (the non-persistent warp-specialized mainloop has no scheduler to pad)
    group = 1 if cfg.mainloop is Mainloop.WS else 1 << _cutlass_log_swizzle(blocks_m, blocks_n, kn.swizzle)
    tiles = _round_up(blocks_m, group * cm) * _round_up(blocks_n, group * cn)
    # a persistent grid's CTAs: whole clusters the GPCs hold at once (the knob grid caps it)
    slots = min(gpu.cluster_ctas(cs), (kn.grid or gpu.sms) // cs * cs)
    l2 = 1.0 + 0.05 * _l2_penalty(program, shape, tiles_m, tiles_n, gpu)
    bytes_iter = (min(t.m, shape.m) * t.k * 2 / cn + min(t.n, shape.n) * t.k * 2 / cm) * l2  # TMA skips out-of-bounds boxes
    t_comp = 2.0 * t.m * t.n * t.k / (per_sm_flops * eff)
    t_iter = _overlap(t_comp, bytes_iter / (bw_sm * pipe), 0.1)
    t_epi = t.m * t.n * 2 / bw_sm * (1.0 if cfg.epilogue is Sm90Epilogue.TMA else 1.3) + 0.1
    if cfg.mainloop is Mainloop.PINGPONG:
        t_epi *= 0.35  # the other consumer warpgroup's mainloop hides most of it
    else:  # the tensor cores wait while the consumers stage the tile (EPI_STAGING x its write)
        t_epi *= EPI_STAGING
    k_iters = _ceil(shape.k, t.k)
    mode = "data_parallel" if cfg.scheduler is Scheduler.PERSISTENT else _stream_k_mode(kn, tiles, slots)
    extra, extra_bytes = SM90_SETUP_US + 0.2 * (cs > 1), 0.0
    if mode == "data_parallel":
        per_cta = _ceil(tiles, slots)
        compute = LATENCY_US + per_cta * (k_iters * t_iter + t_epi) + 0.15 * (per_cta - 1)
    elif mode == "split_k":
        s = max(1, kn.splits)
        per_cta = _ceil(tiles * s, slots)
        k_iters = _ceil(_ceil(shape.k, s), t.k)
        fixup = (s - 1) * t.m * t.n * 8 / bw_sm + 0.3 if s > 1 else 0.0
        compute = LATENCY_US + per_cta * (k_iters * t_iter + t_epi) + fixup
    else:
        per_cta_iters = _ceil(tiles * k_iters, slots)
        segments = _ceil(per_cta_iters, k_iters) + 1
        fixup = t.m * t.n * 8 / bw_sm + 0.5
        compute = LATENCY_US + per_cta_iters * t_iter + segments * t_epi + fixup
    if cfg.scheduler is Scheduler.STREAM_K:
        compute *= 1.02
        extra += 1.0  # workspace barriers to clear
        extra_bytes = 4.0 * shape.m * shape.n if mode != "data_parallel" else 0.0
    return compute, extra, extra_bytes


def _narrow_box_extra(program: Program, cfg: Sm90L2genConfig, shape: Shape) -> float:
    """How many more columns of B a K step costs at L2's full rate because its boxes are
    narrow: zero unless B is MN-major and its tile width is not a multiple of 64."""
    p_kmajor, q_kmajor = l2gen_operands(program)
    b_kmajor = p_kmajor if cfg.swap_ab else q_kmajor
    width = cfg.tile.n
    if b_kmajor or width % 64 == 0:
        return 0.0
    atom = 32 if width % 32 == 0 else 16
    return min(width, shape.n) * (1.0 / NARROW_BOX_RATE[atom] - 1.0)


def _sm90_l2gen_us(program: Program, cfg: Sm90L2genConfig, shape: Shape, gpu: Gpu) -> tuple[float, float, float]:
    """l2gen's own sm90a kernel: a unit per (tile, split), the splits of a tile reduced in
    its cluster through distributed shared memory or through the workspace, swap_ab
    changing only the wgmma shape; a persistent grid (decomposition heuristic, where the
    kernel is built persistent) overlaps each unit's epilogue with the next unit's loads."""
    t = cfg.tile
    kn = program.knobs
    rows, cols = cfg.kernel_tile
    per_sm_flops = gpu.peak_tflops_fp16 * 1e6 / gpu.sms
    bw_sm = L2_TBS * 1e6 / gpu.sms
    eff = 0.97 * (1.0 - math.exp(-(rows * max(cols, 64)) / 7100.0)) * (1.0 if t.k == 64 else 0.99)
    pipe = _pipe(cfg.stages, (rows + cols) * t.k * 2)
    resident = max(1, min(2, gpu.smem_per_sm // l2gen_smem_bytes(cfg)))
    tiles_m, tiles_n = _ceil(shape.m, t.m), _ceil(shape.n, t.n)
    splits = kn.splits if splits_apply(cfg) else 1
    # A multicast cluster's CTAs all run: the kernel launches whole clusters, so a grid side
    # with fewer tiles than the cluster (a 2x1 cluster on a one-tile-tall problem) holds SMs
    # with CTAs past C's edge; units here count CTAs, those included.
    cm, cn, _ = cfg.cluster
    units = _round_up(tiles_m, cm) * _round_up(tiles_n, cn) * splits
    # A wave is what the GPCs hold at once in whole clusters: 120 CTAs in clusters of 4 on
    # 132 SMs, so 128 CTAs of 128x64 in clusters of 4 run in two (bench/results/README.md).
    held = gpu.cluster_ctas(cm * cn)
    waves = _ceil(units, held * resident)
    k_iters = _ceil(_ceil(shape.k, t.k), splits)
    penalty = _l2_penalty(program, shape, tiles_m, tiles_n, gpu) * (0.5 if cfg.hints is Hints.STREAM else 1.0)
    # A multicast cluster loads a shared tile once for the CTAs along its row or column.
    bytes_iter = (min(t.m, shape.m) / cn + min(t.n, shape.n) / cm) * t.k * 2 * (1.0 + 0.05 * penalty)
    bytes_iter += _narrow_box_extra(program, cfg, shape) / cm * t.k * 2
    t_iter = _overlap(2.0 * t.m * t.n * t.k / (per_sm_flops * eff), bytes_iter / (bw_sm * pipe), 0.1)
    # Past two CTAs, every stage waits for the slowest of more peers: clusters of four ran
    # 11-12% slower than pairs on the same tiles (bench/results/README.md, bigmc4-*).
    t_iter *= 1.0 + 0.06 * max(0, cm * cn - 2)
    t_epi = t.m * t.n * 2 / bw_sm / splits + 0.1
    if splits > 1 and cfg.split_k is SplitK.CLUSTER:
        t_epi += rows * cols * 4 * (splits - 1) / splits / (DSMEM_TBS * 1e6 / gpu.sms) + CLUSTER_MEET_US
    elif splits > 1 and cfg.split_k is SplitK.ORDERED:
        # ordered: every split stores its tile into a slot and takes a ticket; the last reads
        # every slot back, sums them in order and zeroes them: the atomic chain, with traffic
        # that grows with the split count.
        t_epi += 1.0 + rows * cols * 4 * (2 * splits + 1) / bw_sm
    elif splits > 1:
        # atomic: every split adds its tile in L2 and takes a ticket; the last reads the sum
        # back and zeroes it. The last CTA's chain of round trips, whatever the split count
        # (what the per-block timelines measured: bench/results/README.md, "Inside a split").
        t_epi += 1.0 + rows * cols * 4 * 2 / bw_sm
    # an atomic split's additions contend in L2: this much more for each CTA adding at once
    t_contend = rows * cols * 4 / (ATOMIC_TBS * 1e6) if splits > 1 and cfg.split_k is SplitK.ATOMIC else 0.0
    looping = max(1, min(2, gpu.smem_per_sm // l2gen_persistent_smem_bytes(cfg)))  # CTAs per SM of a persistent grid
    capacity = min(held * looping, kn.grid) if kn.grid else held * looping  # its CTAs (the knob grid caps them)
    if kn.decomposition is Decomposition.STREAM_K:
        # the tiles of whole waves of the persistent grid run whole; each of the rest is cut
        # into as many equal K pieces as the grid holds for all of them (at most
        # L2GEN_SK_MAX_PARTS): a shorter last wave; a tile of several pieces is summed in the
        # workspace (the atomic chain), one CTA's epilogues but its last hidden behind its
        # next tile's loads
        tiles = tiles_m * tiles_n
        k_all = _ceil(shape.k, t.k)
        grid = min(capacity, tiles * k_all)
        whole, _, parts = stream_k_plan(tiles, k_all, grid)
        per_cta = whole // grid * k_all + (_ceil(k_all, parts) if parts else 0)
        meets = 1.0 if parts > 1 else 0.0  # tiles summed in the workspace, per CTA
        t_out = t.m * t.n * 2 / bw_sm + 0.1
        # a shared tile's sum is a chain of round trips through an L2 that every other SM is
        # streaming through, dearer than a split's (bench/results/README.md, "Stream-K in
        # l2gen's kernel")
        t_sum = 3.0 + rows * cols * 4 * 2 / bw_sm
        compute = LATENCY_US + per_cta * t_iter + 0.3 * t_out * tiles / grid + 0.7 * t_out + meets * t_sum
        return compute, 0.5, 0.0
    if kn.decomposition is Decomposition.HEURISTIC and l2gen_persistent(cfg, gpu.smem_per_block) and units > capacity:
        # the next unit's loads go on under the epilogue, but its consumers (the tensor
        # cores' only users) stage it first: a build without the epilogue ran 4-8% faster
        # (bench/results/README.md, "The persistent kernel's epilogue")
        # (its CTAs take whole units: the last CTA to finish runs ceil(units / capacity) of them)
        compute = LATENCY_US + _ceil(units, capacity) * (k_iters * t_iter + EPI_STAGING * t_epi + min(units, capacity) * t_contend)
    else:
        compute = LATENCY_US + waves * (k_iters * t_iter + t_epi + min(units, held * resident) * t_contend)
    return compute, 0.3 + 0.2 * (splits > 1), 0.0


def model_us(program: Program, shape: Shape, gpu: Gpu) -> float:
    """Noise-free simulated time of a (valid) program on a shape, in microseconds."""
    cfg = program.config
    if isinstance(cfg, Sm80Config):
        compute, extra, extra_bytes = _sm80_us(program, cfg, shape, gpu)
    elif isinstance(cfg, Sm90L2genConfig):
        compute, extra, extra_bytes = _sm90_l2gen_us(program, cfg, shape, gpu)
    else:
        compute, extra, extra_bytes = _sm90_us(program, cfg, shape, gpu)
    tiles_m, tiles_n = _ceil(shape.m, cfg.tile.m), _ceil(shape.n, cfg.tile.n)
    reload = 1.0 + _l2_penalty(program, shape, tiles_m, tiles_n, gpu)
    dram_bytes = 2.0 * (shape.m * shape.k + shape.k * shape.n) * reload + 2.0 * shape.m * shape.n + extra_bytes
    dram = dram_bytes / (gpu.bandwidth_tbs * 1e6 * 0.92)
    return LAUNCH_US + _overlap(compute, dram, 0.1) + extra


def _cublas_menu(shape: Shape) -> list[Program]:
    """The kernels the simulated cuBLAS picks from, with its quantization-blind knobs.

    Its split count depends on K alone (not on how many tiles the shape makes), and it has
    no small-tile sm80 kernels: good on big shapes, beatable on skinny and small ones.
    """
    def sm90(bm, bn, bk, cluster, mainloop, scheduler=Scheduler.PERSISTENT, splits=1):
        cfg = Sm90Config(Tile(bm, bn, bk), (*cluster, 1), mainloop, Sm90Epilogue.TMA, 0, scheduler)
        dec = Decomposition.SPLIT_K if splits > 1 else Decomposition.HEURISTIC
        return Program("cublas", Family.SM90, BLayout.KN, cfg, Knobs(splits=splits, decomposition=dec))

    small = min(shape.m, shape.n) <= 256
    splits = min(8, max(1, shape.k // 2048)) if small else 1
    menu = [
        sm90(128, 256, 64, (2, 1), Mainloop.COOPERATIVE),
        sm90(128, 128, 64, (1, 2), Mainloop.PINGPONG),
        sm90(64, 128, 64, (1, 1), Mainloop.PINGPONG),
        sm90(128, 128, 64, (1, 1), Mainloop.COOPERATIVE, Scheduler.STREAM_K, splits),
    ]
    if small:
        menu.append(sm90(64, 64, 128, (1, 1), Mainloop.PINGPONG))
        menu.append(sm90(128, 64, 64, (1, 1), Mainloop.COOPERATIVE, Scheduler.STREAM_K, splits))
    return menu


def cublas_model_us(shape: Shape, gpu: Gpu) -> float:
    """Simulated cuBLAS-best: the fastest of its menu, with hand-tuned SASS (2% better)."""
    return 0.98 * min(model_us(p, shape, gpu) for p in _cublas_menu(shape))


def _unit(*parts: object) -> float:
    """A deterministic uniform number in [0, 1) from a hash of the parts."""
    digest = hashlib.sha256("\0".join(str(p) for p in parts).encode()).digest()
    return struct.unpack("<Q", digest[:8])[0] / 2.0**64


def _gauss(*parts: object) -> float:
    u1 = max(_unit("g1", *parts), 1e-12)
    u2 = _unit("g2", *parts)
    return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)


class SimulatedEvaluator:
    """A deterministic stand-in for build + run on ``gpu``: a model, not a measurement.

    Times come from :func:`model_us` (waves and tile quantization over the SMs and
    occupancy, per-tile efficiency by tile size, warps, stages and family, split-K and
    stream-K, a small L2 effect of raster and swizzle, ~3 µs launch overhead), times
    deterministic pseudo-noise from a hash of (program text, shape). The baseline is
    :func:`cublas_model_us`. A fixed fraction of compile-time configurations "fail to
    build" and a smaller fraction of (program, shape) pairs "run wrong" or "fail to
    launch", all decided by hashes, so failure paths get exercised reproducibly.
    """

    def __init__(self, gpu: Gpu, *, noise: float = 0.03, build_fail: float = 0.03, run_fail: float = 0.01, salt: str = "",
                 l2: str = DEFAULT_L2):
        self.gpu = gpu
        self.l2 = l2  # the protocol its measurements are filed under (the model has no L2 state)
        self.noise = noise
        self.build_fail = build_fail
        self.run_fail = run_fail
        self.salt = salt
        self.simulated = True  # its rows go to a database of simulated rows only (KernelDB.check_evidence)
        self.env = {"simulated": "analytic model of " + gpu.name + " (l2gen.search.simulate), not a measurement"}
        self.calls = 0  # measured (non-rejected) candidates, for tests and progress

    def baseline_us(self, shape: Shape) -> float:
        return cublas_model_us(shape, self.gpu)

    def measure(self, shape: Shape, program: Program) -> Measurement:
        """One candidate, without the checker (callers check first)."""
        text = format_program(program)
        build_text = build_key(program)
        if _unit("build", self.salt, self.gpu.name, build_text) < self.build_fail:
            return Measurement(shape, program, "build_error", error="simulated: nvcc failed (deterministic for this configuration)", l2=self.l2)
        u = _unit("run", self.salt, text, shape)
        if u < self.run_fail / 2:
            return Measurement(shape, program, "run_error", error="simulated: launch returned L2GEN_ERR_LAUNCH", l2=self.l2)
        base = self.baseline_us(shape) * math.exp(0.01 * _gauss("base", self.salt, text, shape))
        if u < self.run_fail:
            return Measurement(shape, program, "wrong", baseline_us=base, relerr=0.5, error="simulated: relative error 0.5 > 1e-3", l2=self.l2)
        time = model_us(program, shape, self.gpu) * math.exp(self.noise * _gauss("time", self.salt, text, shape))
        return Measurement(shape, program, "ok", time_us=time, baseline_us=base, relerr=2e-4)

    def evaluate(self, shape: Shape, proposals: Sequence[Proposal], on_result: OnResult | None = None) -> list[Measurement]:
        out: list = [None] * len(proposals)
        for i, proposal in enumerate(proposals):
            m = rejected(shape, proposal.program, self.gpu)
            if m is None:
                self.calls += 1
                m = self.measure(shape, proposal.program)
            _emit(out, on_result, i, m)
        return out
