"""The checker's rules as one table: what each rule concerns, the line that states it to a
reader (the LLM prompt renders its rules from these), and the test the checker runs.

The rules are the contract of the templates: a program that breaks none of them lowers to
a translation unit that nvcc compiles without a ``static_assert`` firing and that runs on
the target GPU. :func:`l2gen.check.check` runs :data:`RULES` in order; a rule runs only
when every rule named in its ``after`` ran and passed (a tile outside the template's
sizes makes the arithmetic of the later rules meaningless, so they keep quiet).

A rule's ``statement`` is a ``str.format`` template over the limits of
:mod:`l2gen.limits` (a tuple renders as a set, a range as ``first..last``) and ``gpu``,
the target; ``archs`` names the architectures the target runs.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

from . import limits
from .ir import Decomposition, Family, Mainloop, Program, Scheduler, Sm90Epilogue, SplitK
from .limits import (
    L2GEN_COLS,
    L2GEN_DECOMPOSITIONS,
    L2GEN_MAX_ACC,
    L2GEN_MAX_CLUSTER,
    L2GEN_MAX_ORDERED_SPLITS,
    L2GEN_MAX_SPLITS,
    L2GEN_ROWS,
    L2GEN_STAGES,
    L2GEN_TILE_K,
    MAX_SPLITS,
    MAX_SWIZZLE_LOG2,
    SM80_MAX_ACC_PER_THREAD,
    SM80_MAX_THREADS,
    SM80_REGISTER_MARGIN,
    SM80_STAGES,
    SM80_TILE_K,
    SM80_TILE_M,
    SM80_TILE_N,
    SM80_WARPS,
    SM90_CLUSTER,
    SM90_EPILOGUE_STAGES,
    SM90_MAX_ACC_PER_THREAD,
    SM90_STAGES,
    SM90_TILE_K,
    SM90_TILE_M,
    SM90_TILE_N,
    l2gen_multicast_pieces,
    l2gen_operands,
    l2gen_persistent,
    l2gen_persistent_smem_bytes,
    l2gen_smem_bytes,
    sm80_register_estimate,
    sm80_smem_bytes,
    sm90_stages_and_smem,
)
from .targets import Gpu

ALL = tuple(Family)
SM80 = (Family.SM80,)
SM90 = (Family.SM90,)
L2GEN = (Family.SM90_L2GEN,)

Violation = tuple[str, str]  # (the decision it is reported at, the message)


@dataclass(frozen=True)
class Rule:
    """One rule of the checker.

    ``test(program, gpu)`` yields a (decision, message) pair for each way the program
    breaks the rule; the diagnostic carries ``code`` and the decision's source span.
    """

    name: str
    code: str
    families: tuple[Family, ...]
    decisions: tuple[str, ...]
    statement: str
    test: Callable[[Program, Gpu], Iterable[Violation]]
    after: tuple[str, ...] = ()

    def state(self, gpu: Gpu) -> str:
        """The rule in one line, with the limits and the target's figures filled in."""
        archs = " or ".join(dict.fromkeys(f.arch for f in gpu.families()))
        return self.statement.format(gpu=gpu, archs=archs, **_VALUES)


_TABLE: list[Rule] = []


def rule(name, code, families, decisions, statement, after=("arch",)):
    """Add the decorated test to the table as a rule (in definition order)."""

    def add(test):
        _TABLE.append(Rule(name, code, tuple(families), tuple(decisions), statement, test, tuple(after)))
        return test

    return add


def _list(values) -> str:
    values = list(values)
    if len(values) > 8 and values == list(range(values[0], values[-1] + 1, values[1] - values[0])):
        return f"{values[0]}, {values[1]}, ..., {values[-1]}"
    return ", ".join(str(v.value if isinstance(v, enum.Enum) else v) for v in values)


def _render(value) -> str:
    if isinstance(value, range):
        return f"{value.start}..{value.stop - 1}"
    if isinstance(value, tuple):
        return "{" + _list(value) + "}"
    return str(value)


_VALUES = {k: _render(v) for k, v in vars(limits).items() if k.isupper()}


def _one_of(decision: str, what: str, value: int, allowed) -> Iterator[Violation]:
    if value not in allowed:
        yield decision, f"{what} {value} is not one of {_list(allowed)}"


# -- every program ------------------------------------------------------------------------


@rule("arch", "E-ARCH", ALL, ("arch",), "arch {archs} (what {gpu.name} runs)", after=())
def _arch(p, gpu):
    if p.family not in gpu.families():
        yield "arch", f"arch {p.family.arch} does not run on {gpu.name} (sm_{gpu.sm})"


@rule("name", "E-NAME", ALL, ("name",), "the kernel name is an identifier")
def _name(p, gpu):
    if not p.name.isidentifier():
        yield "name", f"kernel name '{p.name}' is not an identifier"


# -- sm80 (templates/sm80_gemm.cu.j2) -----------------------------------------------------

_SM80 = ("sm80.threads",)


@rule("sm80.tile", "E-RANGE", SM80, ("tile",), "BM in {SM80_TILE_M}, BN in {SM80_TILE_N}, BK in {SM80_TILE_K}")
def _sm80_tile(p, gpu):
    t = p.config.tile
    yield from _one_of("tile", "tile BM", t.m, SM80_TILE_M)
    yield from _one_of("tile", "tile BN", t.n, SM80_TILE_N)
    yield from _one_of("tile", "tile BK", t.k, SM80_TILE_K)


@rule("sm80.warps", "E-RANGE", SM80, ("warps",), "WM, WN in {SM80_WARPS}")
def _sm80_warps(p, gpu):
    wm, wn = p.config.warps
    yield from _one_of("warps", "warps WM", wm, SM80_WARPS)
    yield from _one_of("warps", "warps WN", wn, SM80_WARPS)


@rule("sm80.threads", "E-WARPS", SM80, ("warps",), "threads = 32*WM*WN <= {SM80_MAX_THREADS}",
      after=("sm80.tile", "sm80.warps"))
def _sm80_threads(p, gpu):
    c = p.config
    if c.threads > SM80_MAX_THREADS:
        wm, wn = c.warps
        yield "warps", f"warps {wm} x {wn} make {c.threads} threads; the sm80 template takes at most {SM80_MAX_THREADS}"


@rule("sm80.warp_rows", "E-ATOM", SM80, ("tile", "warps"), "BM % (16*WM) == 0", after=_SM80)
def _sm80_warp_rows(p, gpu):
    t, wm = p.config.tile, p.config.warps[0]
    if t.m % (16 * wm):
        yield "warps", f"tile BM {t.m} is not a multiple of 16 x WM = {16 * wm} (the mma.sync atom is 16 rows)"


@rule("sm80.warp_cols", "E-ATOM", SM80, ("tile", "warps"), "BN % (16*WN) == 0", after=_SM80)
def _sm80_warp_cols(p, gpu):
    t, wn = p.config.tile, p.config.warps[1]
    if t.n % (16 * wn):
        yield "warps", f"tile BN {t.n} is not a multiple of 16 x WN = {16 * wn} (ldmatrix.x4 loads 16 columns of B per warp)"


@rule("sm80.copy", "E-COPY", SM80, ("tile", "warps"), "BM*BK/8 and BN*BK/8 multiples of threads", after=_SM80)
def _sm80_copy(p, gpu):
    c = p.config
    t = c.tile
    for name, rows in (("A", t.m), ("B", t.n)):
        chunks = rows * t.k // 8  # 16-byte cp.async chunks per stage
        if chunks % c.threads:
            yield "tile", f"the {name} tile ({rows} x {t.k}) has {chunks} 16-byte chunks, not a multiple of {c.threads} threads"


@rule("sm80.accumulators", "E-REGS", SM80, ("tile", "warps"), "BM*BN/threads <= {SM80_MAX_ACC_PER_THREAD}", after=_SM80)
def _sm80_accumulators(p, gpu):
    c = p.config
    acc = c.tile.m * c.tile.n // c.threads
    if acc > SM80_MAX_ACC_PER_THREAD:
        yield "tile", f"{acc} fp32 accumulators per thread (tile {c.tile} over {c.threads} threads) exceed the register budget of {SM80_MAX_ACC_PER_THREAD}; add warps or shrink the tile"


@rule("sm80.split_k", "E-SPLITK", SM80, ("split_k",), "split_k none, parallel, atomic or ordered", after=_SM80)
def _sm80_split_k(p, gpu):
    c = p.config
    if c.split_k is SplitK.CLUSTER:
        yield "split_k", "'split_k cluster' is the sm90a l2gen kernel's ('impl l2gen'); sm80 takes 'none', 'parallel', 'atomic' or 'ordered'"


@rule("sm80.stages", "E-RANGE", SM80, ("stages",), "stages {SM80_STAGES}", after=_SM80)
def _sm80_stages(p, gpu):
    c = p.config
    if c.stages not in SM80_STAGES:
        yield "stages", f"stages {c.stages} is out of range {SM80_STAGES.start}..{SM80_STAGES.stop - 1}"


@rule("sm80.smem_swizzle", "E-SWIZZLE", SM80, ("smem_swizzle",), "smem_swizzle B 3 3 with B in 0..3", after=_SM80)
def _sm80_smem_swizzle(p, gpu):
    b, m, s = p.config.swizzle
    if (m, s) != (3, 3) or b not in (0, 1, 2, 3):
        yield "smem_swizzle", f"smem_swizzle {b} {m} {s} is not supported; use B 3 3 with B in 0..3"


@rule("sm80.swizzle_period", "E-SWIZZLE", SM80, ("smem_swizzle", "tile"),
      "BM*BK and BN*BK multiples of the swizzle period 64*2^B", after=("sm80.smem_swizzle",))
def _sm80_swizzle_period(p, gpu):
    t = p.config.tile
    b = p.config.swizzle[0]
    period = 64 << b  # elements in one swizzle period; each stage must hold whole periods
    for name, rows in (("A", t.m), ("B", t.n)):
        if (rows * t.k) % period:
            yield "smem_swizzle", f"the {name} stage ({rows} x {t.k}) is not a whole number of Swizzle<{b},3,3> periods ({period} elements)"


@rule("sm80.smem", "E-SMEM", SM80, ("stages", "tile", "epilogue"),
      "shared memory max(stages*(BM+BN)*BK*2, BM*(BN+8)*2 if epilogue smem) <= {gpu.smem_per_block} B", after=_SM80)
def _sm80_smem(p, gpu):
    c = p.config
    smem = sm80_smem_bytes(c)
    if smem > gpu.smem_per_block:
        yield "stages", f"{smem} bytes of shared memory ({c.stages} stages of {c.tile}) exceed the {gpu.smem_per_block} a block may use on {gpu.name}"


@rule("sm80.min_blocks", "E-RANGE", SM80, ("min_blocks",), "min_blocks 1..4", after=_SM80)
def _sm80_min_blocks(p, gpu):
    c = p.config
    if not 1 <= c.min_blocks <= 4:
        yield "min_blocks", f"min_blocks {c.min_blocks} is out of range 1..4"


@rule("sm80.occupancy_threads", "E-OCCUPANCY", SM80, ("min_blocks", "warps"), "min_blocks*threads <= 2048",
      after=("sm80.min_blocks",))
def _sm80_occupancy_threads(p, gpu):
    c = p.config
    if c.min_blocks * c.threads > 2048:
        yield "min_blocks", f"{c.min_blocks} blocks of {c.threads} threads exceed 2048 threads per SM"


@rule("sm80.occupancy_smem", "E-OCCUPANCY", SM80, ("min_blocks", "stages", "tile"),
      "min_blocks*smem <= {gpu.smem_per_sm} B", after=("sm80.min_blocks",))
def _sm80_occupancy_smem(p, gpu):
    c = p.config
    smem = sm80_smem_bytes(c)
    if c.min_blocks > 1 and smem * c.min_blocks > gpu.smem_per_sm:
        yield "min_blocks", f"{c.min_blocks} blocks of {smem} bytes of shared memory do not fit the {gpu.smem_per_sm} of one SM"


@rule("sm80.registers", "E-REGS", SM80, ("tile", "warps", "min_blocks"),
      "registers BM*BN/threads + 2*(4*BM/(16*WM) + 2*BN/(8*WN)) + 40 <= "
      "min(255, {gpu.regs_per_sm}/(min_blocks*threads)) - {SM80_REGISTER_MARGIN}",
      after=("sm80.min_blocks", "sm80.accumulators"))
def _sm80_registers(p, gpu):
    c = p.config
    cap = min(255, gpu.regs_per_sm // (c.threads * c.min_blocks))
    need = sm80_register_estimate(c)
    if need > cap - SM80_REGISTER_MARGIN:
        wm, wn = c.warps
        where = "min_blocks" if c.min_blocks > 1 else "tile"
        yield where, f"about {need} registers per thread needed (tile {c.tile}, warps {wm} x {wn}); {cap} available at min_blocks {c.min_blocks}, so it would spill"


# -- sm90a, CUTLASS's kernels (templates/sm90_gemm.cu.j2) ---------------------------------


def _cluster_sides(p, gpu):
    cm, cn, _ = p.config.cluster
    yield from _one_of("cluster", "cluster M", cm, SM90_CLUSTER)
    yield from _one_of("cluster", "cluster N", cn, SM90_CLUSTER)


def _cluster_k(p, gpu):
    ck = p.config.cluster[2]
    if ck != 1:
        yield "cluster", f"cluster K {ck} must be 1"


_CLUSTER_SIDES = "cluster CM x CN x 1 with CM, CN in {SM90_CLUSTER}"
_CLUSTER_K = "cluster K 1"

@rule("sm90.tile", "E-RANGE", SM90, ("tile",), "BM in {SM90_TILE_M}, BN in {SM90_TILE_N}, BK in {SM90_TILE_K}")
def _sm90_tile(p, gpu):
    t = p.config.tile
    yield from _one_of("tile", "tile BM", t.m, SM90_TILE_M)
    yield from _one_of("tile", "tile BN", t.n, SM90_TILE_N)
    yield from _one_of("tile", "tile BK", t.k, SM90_TILE_K)


rule("sm90.cluster", "E-RANGE", SM90, ("cluster",), _CLUSTER_SIDES)(_cluster_sides)
rule("sm90.cluster_k", "E-CLUSTER", SM90, ("cluster",), _CLUSTER_K)(_cluster_k)

_SM90 = ("sm90.tile", "sm90.cluster", "sm90.cluster_k")


@rule("sm90.cluster_size", "E-CLUSTER", SM90, ("cluster",), "CM*CN <= {gpu.max_cluster}", after=_SM90)
def _sm90_cluster_size(p, gpu):
    cm, cn, _ = p.config.cluster
    if cm * cn > gpu.max_cluster:
        yield "cluster", f"cluster {cm} x {cn} has {cm * cn} CTAs; {gpu.name} allows at most {gpu.max_cluster}"


@rule("sm90.cooperative", "E-SCHED", SM90, ("mainloop", "tile"), "mainloop cooperative needs BM 128 or 256", after=_SM90)
def _sm90_cooperative(p, gpu):
    c = p.config
    if c.mainloop is Mainloop.COOPERATIVE and c.tile.m % 128:
        yield "mainloop", f"the cooperative mainloop splits BM over two warpgroups and needs BM of 128 or 256; tile BM is {c.tile.m}"


@rule("sm90.stream_k", "E-SCHED", SM90, ("scheduler", "mainloop"), "scheduler stream_k needs mainloop cooperative", after=_SM90)
def _sm90_stream_k(p, gpu):
    c = p.config
    if c.scheduler is Scheduler.STREAM_K and c.mainloop is not Mainloop.COOPERATIVE:
        yield "scheduler", "the stream-K scheduler needs 'mainloop cooperative'"


@rule("sm90.accumulators", "E-REGS", SM90, ("tile", "mainloop"),
      "accumulators per thread BM*BN/256 (cooperative) or BM*BN/128 (ws, pingpong) <= {SM90_MAX_ACC_PER_THREAD}",
      after=_SM90)
def _sm90_accumulators(p, gpu):
    c = p.config
    threads = 256 if c.mainloop is Mainloop.COOPERATIVE else 128  # threads sharing one tile's accumulators
    acc = c.tile.m * c.tile.n // threads
    if acc > SM90_MAX_ACC_PER_THREAD:
        yield "tile", f"tile {c.tile} needs {acc} fp32 accumulators per thread ({c.mainloop.value}); above {SM90_MAX_ACC_PER_THREAD} ptxas serializes wgmma and spills"


@rule("sm90.stages", "E-RANGE", SM90, ("stages",), "stages auto or {SM90_STAGES}", after=_SM90)
def _sm90_stages(p, gpu):
    c = p.config
    if c.stages and c.stages not in SM90_STAGES:
        yield "stages", f"stages {c.stages} is out of range {SM90_STAGES.start}..{SM90_STAGES.stop - 1} (or auto)"


def _staged_epilogue(c, decision: str) -> str | None:
    """Why an epilogue decision of ``c`` cannot apply (only the TMA epilogue stages C in
    shared memory), or None."""
    if c.epilogue is not Sm90Epilogue.TMA:
        return f"{decision} {getattr(c, decision)}: only the TMA epilogue stages C in shared memory; this kernel has 'epilogue {c.epilogue.value}'"
    return None


@rule("sm90.epilogue_tile", "E-RANGE", SM90, ("epilogue_tile", "epilogue", "tile"),
      "epilogue_tile needs epilogue tma, in columns: a multiple of 16 that divides BN", after=_SM90)
def _sm90_epilogue_tile(p, gpu):
    c = p.config
    en = c.epilogue_tile
    if not en:
        return
    if why := _staged_epilogue(c, "epilogue_tile"):
        yield "epilogue_tile", why
    elif en % 16 or c.tile.n % en:
        yield "epilogue_tile", (f"epilogue_tile {en} must be a multiple of 16 that divides the tile's BN {c.tile.n} "
                                f"(e.g. {', '.join(str(v) for v in range(16, c.tile.n + 1, 16) if c.tile.n % v == 0)})")


@rule("sm90.epilogue_stages", "E-RANGE", SM90, ("epilogue_stages", "epilogue"),
      "epilogue_stages needs epilogue tma: 1..4 tiles of C staged, their TMA stores in flight", after=_SM90)
def _sm90_epilogue_stages(p, gpu):
    c = p.config
    n = c.epilogue_stages
    if not n:
        return
    if why := _staged_epilogue(c, "epilogue_stages"):
        yield "epilogue_stages", why
    elif n not in SM90_EPILOGUE_STAGES:
        yield "epilogue_stages", (f"epilogue_stages {n} is out of range {SM90_EPILOGUE_STAGES.start}..{SM90_EPILOGUE_STAGES.stop - 1} "
                                  "(tiles of C staged in shared memory, their TMA stores in flight)")


@rule("sm90.room", "E-SMEM", SM90, ("stages", "tile", "mainloop", "epilogue", "epilogue_tile", "epilogue_stages"),
      "stages auto must leave room for 2 stages beside the epilogue in {gpu.smem_per_block} B",
      after=("sm90.stages", "sm90.epilogue_tile", "sm90.epilogue_stages"))
def _sm90_room(p, gpu):
    c = p.config
    stages, _ = sm90_stages_and_smem(c, gpu.smem_per_block)
    if stages < 2:
        yield "stages" if c.stages else "tile", f"tile {c.tile} leaves room for {stages} pipeline stage(s) beside the epilogue in {gpu.smem_per_block} bytes; the mainloop needs 2"


@rule("sm90.smem", "E-SMEM", SM90, ("stages", "tile", "mainloop", "epilogue", "epilogue_tile", "epilogue_stages"),
      "shared memory about stages*(BM+BN)*BK*2 + the epilogue's (up to 33 KB with tma) <= {gpu.smem_per_block} B",
      after=("sm90.room",))
def _sm90_smem(p, gpu):
    c = p.config
    stages, smem = sm90_stages_and_smem(c, gpu.smem_per_block)
    if smem > gpu.smem_per_block:
        yield "stages", f"{smem} bytes of shared memory ({stages} stages of {c.tile}) exceed the {gpu.smem_per_block} a block may use on {gpu.name}"


# -- sm90a, l2gen's own kernel (templates/sm90_l2gen_gemm.cu.j2) --------------------------


@rule("l2gen.tile", "E-RANGE", L2GEN, ("tile", "swap_ab"),
      "the kernel tile is BM x BN, or BN x BM with swap_ab on: its first side in {L2GEN_ROWS}, "
      "its second in {L2GEN_COLS}, and BK in {L2GEN_TILE_K}")
def _l2gen_tile(p, gpu):
    c = p.config
    rows, cols = c.kernel_tile
    side, other = ("BN", "BM") if c.swap_ab else ("BM", "BN")
    yield from _one_of("tile", f"tile {side}", rows, L2GEN_ROWS)
    if cols not in L2GEN_COLS:
        swapped = " (swap_ab on: BN runs along wgmma's 64-row side)" if c.swap_ab else ""
        yield "tile", f"tile {other} {cols} is not a wgmma width: a multiple of 8 from 8 to 256{swapped}"
    yield from _one_of("tile", "tile BK", c.tile.k, L2GEN_TILE_K)


_L2GEN = ("l2gen.tile",)


@rule("l2gen.n_major", "E-ATOM", L2GEN, ("tile", "b", "swap_ab"), "b kn with swap_ab off needs BN a multiple of 16",
      after=_L2GEN)
def _l2gen_n_major(p, gpu):
    c = p.config
    _, cols = c.kernel_tile
    _, q_kmajor = l2gen_operands(p)
    if not q_kmajor and cols % 16:
        other = "BM" if c.swap_ab else "BN"
        yield "tile", (f"tile {other} {cols}: B stored K x N ('b kn') is N-major, and its tile must span whole swizzle "
                       "atoms of 16, 32 or 64 columns")


@rule("l2gen.accumulators", "E-REGS", L2GEN, ("tile", "swap_ab"),
      "accumulators per consumer thread, rows x columns of the kernel tile / (128 x consumers), <= {L2GEN_MAX_ACC}",
      after=_L2GEN)
def _l2gen_accumulators(p, gpu):
    c = p.config
    rows, cols = c.kernel_tile
    acc = rows * cols // (128 * c.consumers)
    if acc > L2GEN_MAX_ACC:
        other = "BM" if c.swap_ab else "BN"
        yield "tile", (f"a {rows}-row kernel tile {cols} wide needs {acc} fp32 accumulators per consumer thread, above "
                       f"{L2GEN_MAX_ACC}: tile {other} at most {L2GEN_MAX_ACC * 128 * c.consumers // rows}")


@rule("l2gen.split_k", "E-SPLITK", L2GEN, ("split_k",), "split_k none, cluster, atomic or ordered", after=_L2GEN)
def _l2gen_split_k(p, gpu):
    if p.config.split_k is SplitK.PARALLEL:
        yield "split_k", "'split_k parallel' is the sm80 family's; the l2gen sm90a kernel takes 'none', 'cluster', 'atomic' or 'ordered'"


rule("l2gen.cluster", "E-RANGE", L2GEN, ("cluster",), _CLUSTER_SIDES, after=_L2GEN)(_cluster_sides)
rule("l2gen.cluster_k", "E-CLUSTER", L2GEN, ("cluster",), _CLUSTER_K, after=_L2GEN)(_cluster_k)


@rule("l2gen.cluster_size", "E-CLUSTER", L2GEN, ("cluster",), "CM*CN <= {L2GEN_MAX_CLUSTER}",
      after=("l2gen.cluster", "l2gen.cluster_k"))
def _l2gen_cluster_size(p, gpu):
    c = p.config
    cm, cn, _ = c.cluster
    if c.multicast and cm * cn > L2GEN_MAX_CLUSTER:
        yield "cluster", f"cluster {cm} x {cn} has {cm * cn} CTAs; the l2gen kernel's clusters hold at most {L2GEN_MAX_CLUSTER}"


@rule("l2gen.cluster_split_k", "E-CLUSTER", L2GEN, ("cluster", "split_k"),
      "a cluster larger than 1 x 1 x 1 does not take split_k cluster", after=("l2gen.cluster_size",))
def _l2gen_cluster_split_k(p, gpu):
    c = p.config
    if c.multicast and c.split_k is SplitK.CLUSTER:
        yield "cluster", "'split_k cluster' makes the CTAs of one tile a cluster; a multicast cluster takes 'split_k none', 'atomic' or 'ordered'"


@rule("l2gen.multicast_pieces", "E-CLUSTER", L2GEN, ("cluster", "tile", "b", "swap_ab"),
      "a CTA loads 1/CN of its A box and 1/CM of its B box (boxes: the tile's rows by 64 when K-major, BK by 64 "
      "when N-major, and with swap_ab A and B trade places), and each piece must be a multiple of 8 rows",
      after=("l2gen.cluster_size",))
def _l2gen_multicast_pieces(p, gpu):
    if not p.config.multicast:
        return
    cm, cn, _ = p.config.cluster
    # Each CTA of a multicast group loads one piece of the shared tile: a slice of the
    # box's outer extent that must stay whole 8-row swizzle atoms.
    for operand, outer, pieces in l2gen_multicast_pieces(p):
        if pieces > 1 and (outer % pieces or (outer // pieces) % 8):
            yield "cluster", f"cluster {cm} x {cn}: the {operand} tile's {outer} rows per box split over {pieces} CTAs leave {outer / pieces:g}, not a multiple of 8 (the swizzle atom)"


@rule("l2gen.stages", "E-RANGE", L2GEN, ("stages",), "stages {L2GEN_STAGES}", after=_L2GEN)
def _l2gen_stages(p, gpu):
    c = p.config
    if c.stages not in L2GEN_STAGES:
        yield "stages", f"stages {c.stages} is out of range {L2GEN_STAGES.start}..{L2GEN_STAGES.stop - 1}"


@rule("l2gen.smem", "E-SMEM", L2GEN, ("stages", "tile", "split_k"),
      "shared memory max(stages*(BM+BN)*BK*2, BM*(BN+8)*2 + (BM*BN*4 with split_k cluster)) + 16*stages + 1040 "
      "<= {gpu.smem_per_block} B", after=("l2gen.stages",))
def _l2gen_smem(p, gpu):
    c = p.config
    smem = l2gen_smem_bytes(c)
    if smem > gpu.smem_per_block:
        yield "stages", f"{smem} bytes of shared memory ({c.stages} stages of {c.tile}) exceed the {gpu.smem_per_block} a block may use on {gpu.name}"


# -- run-time knobs (checked after the compile-time decisions) ----------------------------


@rule("knobs.swizzle", "E-RANGE", ALL, ("swizzle",), "swizzle 0..{MAX_SWIZZLE_LOG2}")
def _knobs_swizzle(p, gpu):
    s = p.knobs.swizzle
    if not 0 <= s <= MAX_SWIZZLE_LOG2:
        yield "swizzle", f"swizzle {s} is out of range 0..{MAX_SWIZZLE_LOG2} (log2 of the group size)"


@rule("knobs.splits", "E-RANGE", ALL, ("splits",), "splits 1..{MAX_SPLITS}")
def _knobs_splits(p, gpu):
    s = p.knobs.splits
    if not 1 <= s <= MAX_SPLITS:
        yield "splits", f"splits {s} is out of range 1..{MAX_SPLITS}"


@rule("sm80.splits", "E-SPLITS", SM80, ("splits", "split_k"), "splits > 1 needs split_k parallel, atomic or ordered")
def _sm80_splits(p, gpu):
    s = p.knobs.splits
    if p.config.split_k is SplitK.NONE and s != 1:
        yield "splits", f"splits {s} needs 'split_k parallel', 'atomic' or 'ordered'; this kernel has 'split_k none'"


@rule("l2gen.splits", "E-SPLITS", L2GEN, ("splits", "split_k"), "splits > 1 needs split_k cluster, atomic or ordered")
def _l2gen_splits(p, gpu):
    s = p.knobs.splits
    if p.config.split_k is SplitK.NONE and s != 1:
        yield "splits", f"splits {s} needs 'split_k cluster', 'atomic' or 'ordered'; this kernel has 'split_k none'"


@rule("l2gen.cluster_splits", "E-SPLITS", L2GEN, ("splits", "split_k"),
      "split_k cluster splits at most {L2GEN_MAX_SPLITS} ways")
def _l2gen_cluster_splits(p, gpu):
    s = p.knobs.splits
    if p.config.split_k is SplitK.CLUSTER and s > L2GEN_MAX_SPLITS:
        yield "splits", f"splits {s}: a cluster holds at most {L2GEN_MAX_SPLITS} CTAs, so 'split_k cluster' splits K at most {L2GEN_MAX_SPLITS} ways"


@rule("l2gen.ordered_splits", "E-SPLITS", L2GEN, ("splits", "split_k"),
      "split_k ordered splits at most {L2GEN_MAX_ORDERED_SPLITS} ways")
def _l2gen_ordered_splits(p, gpu):
    s = p.knobs.splits
    if p.config.split_k is SplitK.ORDERED and s > L2GEN_MAX_ORDERED_SPLITS:
        yield "splits", f"splits {s}: with 'split_k ordered' the last CTA of a tile reads one slot per split, at most {L2GEN_MAX_ORDERED_SPLITS}; 'split_k atomic' takes more"


@rule("l2gen.decomposition", "E-SCHED", L2GEN, ("decomposition",),
      "decomposition in {L2GEN_DECOMPOSITIONS}")
def _l2gen_decomposition(p, gpu):
    d = p.knobs.decomposition
    if d not in L2GEN_DECOMPOSITIONS:
        yield "decomposition", f"'decomposition {d.value}' is not one of l2gen's kernel ({_list(L2GEN_DECOMPOSITIONS)}); it splits K by 'splits'"


@rule("l2gen.stream_k", "E-SCHED", L2GEN, ("decomposition", "split_k", "cluster", "stages"),
      "decomposition stream_k needs split_k atomic and a persistent kernel (no multicast cluster, "
      "the epilogue's buffers beside the pipeline's within {gpu.smem_per_block} B)",
      after=(*_L2GEN, "l2gen.smem", "l2gen.cluster"))
def _l2gen_stream_k(p, gpu):
    c = p.config
    if p.knobs.decomposition is not Decomposition.STREAM_K:
        return
    if c.split_k is not SplitK.ATOMIC:
        yield "split_k", f"'decomposition stream_k' sums the tiles CTAs share in the workspace: it needs 'split_k atomic', not '{c.split_k.value}'"
    elif c.cluster[0] * c.cluster[1] > 1:
        yield "cluster", "'decomposition stream_k' gives each CTA a K range of its own; the CTAs of a multicast cluster walk the same tiles together"
    elif not l2gen_persistent(c, gpu.smem_per_block):
        yield "stages", (f"'decomposition stream_k' runs the persistent kernel: {l2gen_persistent_smem_bytes(c)} bytes of shared memory "
                         f"(the epilogue's buffers beside {c.stages} stages) exceed the {gpu.smem_per_block} a block may use on {gpu.name}")


@rule("l2gen.stream_k_splits", "E-SPLITS", L2GEN, ("splits", "decomposition"), "decomposition stream_k takes splits 1")
def _l2gen_stream_k_splits(p, gpu):
    if p.knobs.decomposition is Decomposition.STREAM_K and p.knobs.splits != 1:
        yield "splits", f"splits {p.knobs.splits}: 'decomposition stream_k' divides K by its grid, not by 'splits' (leave it 1)"


@rule("knobs.pdl", "E-KNOB", (*SM80, *SM90), ("pdl",), "pdl on needs impl l2gen, the kernel that waits for the one before it")
def _knobs_pdl(p, gpu):
    if p.knobs.pdl:
        yield "pdl", (f"'pdl on' launches l2gen's own sm90a kernel (impl l2gen), which waits for the kernel before it; "
                      f"this {p.family.value} kernel has no such wait")


@rule("knobs.grid", "E-KNOB", (*SM90, *L2GEN), ("grid", "mainloop", "split_k", "stages", "decomposition", "cluster"),
      "grid N other than 0 is 1..{gpu.sms} whole clusters and needs a kernel that loops over its tiles "
      "(cutlass mainloop pingpong or cooperative, l2gen but split_k cluster, decomposition data_parallel or "
      "a persistent kernel over the shared memory)")
def _knobs_grid(p, gpu):
    g = p.knobs.grid
    if not g:
        return
    c = p.config
    if g < 0 or g > gpu.sms:
        yield "grid", f"grid {g}: the most CTAs a persistent launch may have is between 1 and {gpu.sms} ({gpu.name}'s SMs), or 0 for all of them"
        return
    ctas = c.cluster[0] * c.cluster[1]
    if g % ctas:
        yield "grid", f"grid {g} is not whole clusters of {ctas} CTAs ({c.cluster[0]} x {c.cluster[1]}): give a multiple of {ctas}"
    if p.family is Family.SM90:
        if c.mainloop is Mainloop.WS:
            yield "mainloop", f"grid {g}: 'mainloop ws' launches a CTA per tile; pingpong and cooperative loop over tiles on a capped grid"
    elif c.split_k is SplitK.CLUSTER:
        yield "split_k", f"grid {g}: 'split_k cluster' launches a cluster per tile; the other reductions loop over tiles on a capped grid"
    elif not l2gen_persistent(c, gpu.smem_per_block):
        yield "stages", (f"grid {g}: the persistent kernel needs {l2gen_persistent_smem_bytes(c)} bytes of shared memory (the epilogue's "
                         f"buffers beside {c.stages} stages), over the {gpu.smem_per_block} a block may use on {gpu.name}: use fewer stages")
    elif p.knobs.decomposition is Decomposition.DATA_PARALLEL:
        yield "decomposition", f"grid {g}: 'decomposition data_parallel' launches a CTA per unit, in waves; use heuristic or stream_k"


@rule("knobs.grid_sm80", "E-KNOB", SM80, ("grid",), "grid stays 0 (a CTA per tile, in waves: no persistent grid to cap)")
def _knobs_grid_sm80(p, gpu):
    if p.knobs.grid:
        yield "grid", f"grid {p.knobs.grid}: sm80 kernels launch a CTA per tile, in waves; there is no persistent grid to cap (leave it 0)"


@rule("sm90.splits", "E-SPLITS", SM90, ("splits", "scheduler"), "splits > 1 needs scheduler stream_k")
def _sm90_splits(p, gpu):
    s = p.knobs.splits
    if p.config.scheduler is Scheduler.PERSISTENT and s != 1:
        yield "splits", f"splits {s} needs 'scheduler stream_k'; the persistent scheduler does not split K"


@rule("sm90.decomposition", "E-SCHED", SM90, ("decomposition", "scheduler"), "decomposition needs scheduler stream_k")
def _sm90_decomposition(p, gpu):
    if p.config.scheduler is Scheduler.PERSISTENT and p.knobs.decomposition is not Decomposition.HEURISTIC:
        yield "decomposition", "'decomposition' applies only to 'scheduler stream_k'"


@rule("sm90.fixed_splits", "E-SPLITS", SM90, ("splits", "decomposition", "scheduler"),
      "with scheduler stream_k, splits > 1 needs decomposition heuristic or split_k")
def _sm90_fixed_splits(p, gpu):
    # CUTLASS's stream-K scheduler takes a fixed split count only for the heuristic and
    # split-K decompositions (its can_implement; the template's check_knobs says the same).
    s = p.knobs.splits
    decomposition = Decomposition(p.knobs.decomposition)
    if (
        p.config.scheduler is Scheduler.STREAM_K
        and s > 1
        and decomposition not in (Decomposition.HEURISTIC, Decomposition.SPLIT_K)
    ):
        yield (
            "decomposition",
            f"splits {s} needs 'decomposition heuristic' or 'split_k'; '{decomposition.value}' chooses its own split (use splits 1)",
        )


RULES: tuple[Rule, ...] = tuple(_TABLE)
BY_NAME: dict[str, Rule] = {r.name: r for r in RULES}


def rules_for(family: Family) -> tuple[Rule, ...]:
    """The rules a program of ``family`` is held to, in the order the checker runs them."""
    return tuple(r for r in RULES if family in r.families)
