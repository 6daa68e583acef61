"""The decision space: every slot a program fills, with the values worth trying.

Policies (random, embedded, LLM repair) and the property tests draw programs from here.
A slot is one decision with a finite list of choices; :func:`assemble` turns one choice
per slot into a :class:`Program`, which the checker then accepts or rejects.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from . import limits
from .check import is_valid
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
    SplitK,
    Tile,
    given,
)
from .targets import Gpu


@dataclass(frozen=True)
class Slot:
    name: str
    choices: tuple
    runtime: bool = False  # a run-time knob: changing it needs no rebuild
    # The choice a policy that has learned nothing of this slot starts by favouring (None:
    # all alike): a knob whose default is right almost everywhere, like ``grid``.
    prior: object = None


SPLITS = (1, 2, 3, 4, 6, 8, 12, 16)
# Persistent grid caps worth trying (0: every SM): whole clusters of up to 8 CTAs each; 112
# and 128 divide the tile counts of power-of-two problems into equal runs.
GRIDS = (0, 64, 96, 112, 128)
EPILOGUE_TILES = (0, 64, 128)
EPILOGUE_STAGES = (0, 1, 3, 4)

SLOTS: dict[Family, tuple[Slot, ...]] = {
    Family.SM80: (
        Slot("bm", limits.SM80_TILE_M),
        Slot("bn", limits.SM80_TILE_N),
        Slot("bk", limits.SM80_TILE_K),
        Slot("warps", ((1, 1), (1, 2), (2, 1), (2, 2), (1, 4), (4, 1), (2, 4), (4, 2))),
        Slot("stages", (2, 3, 4, 5, 6)),
        Slot("smem_swizzle_b", (1, 2, 3)),
        Slot("epilogue", tuple(Sm80Epilogue)),
        Slot("split_k", (SplitK.NONE, SplitK.PARALLEL, SplitK.ATOMIC, SplitK.ORDERED)),
        Slot("min_blocks", (1, 2)),
        Slot("raster", tuple(Raster), runtime=True),
        Slot("swizzle", (0, 1, 2, 3), runtime=True),
        Slot("splits", SPLITS, runtime=True),
    ),
    Family.SM90: (
        Slot("bm", limits.SM90_TILE_M),
        Slot("bn", (64, 96, 128, 160, 192, 224, 256)),
        Slot("bk", (32, 64, 128)),
        Slot("cluster", ((1, 1), (2, 1), (1, 2), (2, 2))),
        Slot("mainloop", tuple(Mainloop)),
        Slot("epilogue", tuple(Sm90Epilogue)),
        # the TMA epilogue's columns (0: CUTLASS's 32 or 16): wider tiles, fewer and larger
        # stores of C, for the shapes its write bounds
        Slot("epilogue_tile", EPILOGUE_TILES, prior=0),
        # tiles of C staged at once, their TMA stores in flight (0: CUTLASS's min(tiles, 2))
        Slot("epilogue_stages", EPILOGUE_STAGES, prior=0),
        Slot("stages", (0, 3, 4, 5, 6)),
        Slot("scheduler", tuple(Scheduler)),
        Slot("raster", tuple(Raster), runtime=True),
        Slot("swizzle", (0, 1, 2, 3), runtime=True),
        Slot("splits", SPLITS, runtime=True),
        Slot("decomposition", tuple(Decomposition), runtime=True),
        Slot("grid", GRIDS, runtime=True, prior=0),
    ),
    Family.SM90_L2GEN: (
        Slot("bm", (16, 32, 64, 128, 192, 256)),
        # the widths between 128 and 256 fit a problem's tiles to the SMs (4096 x 1280 is
        # 256 tiles of 128 x 160, 2048 x 3584 256 of 128 x 224)
        Slot("bn", (16, 32, 64, 96, 112, 128, 160, 192, 224, 256)),
        Slot("bk", limits.L2GEN_TILE_K),
        Slot("swap_ab", (False, True)),
        Slot("stages", (3, 4, 5, 6, 8)),
        Slot("split_k", (SplitK.NONE, SplitK.CLUSTER, SplitK.ATOMIC, SplitK.ORDERED)),
        Slot("hints", tuple(Hints)),
        Slot("cluster", ((1, 1), (2, 1), (1, 2), (2, 2), (4, 1), (1, 4), (8, 1), (1, 8))),
        Slot("raster", tuple(Raster), runtime=True),
        Slot("swizzle", (0, 1, 2, 3), runtime=True),
        Slot("splits", (1, 2, 3, 4, 6, 8), runtime=True),
        Slot("decomposition", limits.L2GEN_DECOMPOSITIONS, runtime=True),
        Slot("grid", GRIDS, runtime=True, prior=0),
    ),
}


def assemble(family: Family, choices: dict, *, b_layout: BLayout = BLayout.KN, name: str | None = None) -> Program:
    """Build a program from one choice per slot (missing slots take the IR's defaults)."""
    c = choices
    tile = Tile(c["bm"], c["bn"], c["bk"])
    if family is Family.SM80:
        config = Sm80Config(
            tile=tile,
            swizzle=(c.get("smem_swizzle_b", 3), 3, 3),
            **given(c, warps=tuple, stages=None, epilogue=Sm80Epilogue, split_k=SplitK, min_blocks=None),
        )
    elif family is Family.SM90_L2GEN:
        config = Sm90L2genConfig(
            tile=tile, **given(c, swap_ab=bool, stages=None, split_k=SplitK, hints=Hints, cluster=lambda mn: (*mn, 1))
        )
    else:
        config = Sm90Config(
            tile=tile,
            **given(c, cluster=lambda mn: (*mn, 1), mainloop=Mainloop, epilogue=Sm90Epilogue, stages=None, scheduler=Scheduler,
                    epilogue_tile=None, epilogue_stages=None),
        )
    knob_fields = dict(raster=Raster, swizzle=None, splits=None)
    if family in (Family.SM90, Family.SM90_L2GEN):
        knob_fields.update(decomposition=Decomposition, grid=None)
    knobs = Knobs(**given(c, **knob_fields))
    return Program(name or default_name(family, config), family, b_layout, config, knobs)


def default_name(family: Family, config: Sm80Config | Sm90Config | Sm90L2genConfig) -> str:
    t = config.tile
    return f"{family.value}_{t.m}x{t.n}x{t.k}"


def choices_of(program: Program) -> dict:
    """The inverse of :func:`assemble`: one value per slot of the program's family."""
    c = program.config
    k = program.knobs
    out = {"bm": c.tile.m, "bn": c.tile.n, "bk": c.tile.k, "raster": k.raster, "swizzle": k.swizzle, "splits": k.splits}
    if isinstance(c, Sm80Config):
        out.update(warps=c.warps, stages=c.stages, smem_swizzle_b=c.swizzle[0], epilogue=c.epilogue, split_k=c.split_k, min_blocks=c.min_blocks)
    elif isinstance(c, Sm90L2genConfig):
        out.update(swap_ab=c.swap_ab, stages=c.stages, split_k=c.split_k, hints=c.hints, cluster=c.cluster[:2], decomposition=k.decomposition,
                   grid=k.grid)
    else:
        out.update(cluster=c.cluster[:2], mainloop=c.mainloop, epilogue=c.epilogue, epilogue_tile=c.epilogue_tile,
                   epilogue_stages=c.epilogue_stages, stages=c.stages,
                   scheduler=c.scheduler, decomposition=k.decomposition, grid=k.grid)
    return out


def splits_apply(config: Sm80Config | Sm90Config | Sm90L2genConfig) -> bool:
    """Whether a compile-time configuration splits K, so that the ``splits`` knob means
    something: sm80 and sm90a l2gen with a ``split_k`` other than none, sm90a CUTLASS
    with the stream-K scheduler."""
    if isinstance(config, Sm90Config):
        return config.scheduler is Scheduler.STREAM_K
    return config.split_k is not SplitK.NONE


def grid_applies(program: Program) -> bool:
    """Whether the knob ``grid`` can cap the program's launches: an sm90a kernel that loops
    over its tiles (CUTLASS's pingpong and cooperative; l2gen's kernel but a cluster split,
    not launched data_parallel). l2gen's kernel must also fit its persistent shared memory,
    which the checker tells."""
    c = program.config
    if isinstance(c, Sm90Config):
        return c.mainloop is not Mainloop.WS
    if isinstance(c, Sm90L2genConfig):
        return c.split_k is not SplitK.CLUSTER and program.knobs.decomposition is not Decomposition.DATA_PARALLEL
    return False


def launch_ctas(program: Program, m: int, n: int, k: int) -> int:
    """The CTAs a launch of ``program`` on M x N x K would use with no cap on its grid, at
    most (before the GPU's own limit): its tiles, whole clusters, times its K splits; under
    stream-K, its tiles' K tiles (a CTA takes at least one). A cap of ``grid`` at or above
    it changes nothing."""
    c = program.config
    cm, cn = c.cluster[0], c.cluster[1]
    tiles = -(-(-(-m // c.tile.m)) // cm) * cm * (-(-(-(-n // c.tile.n)) // cn) * cn)
    kn = program.knobs
    # stream-K: l2gen's decomposition stream_k; CUTLASS's stream-K scheduler may choose it
    # (its heuristic) unless told data_parallel or split_k
    if splits_apply(c) and (kn.decomposition is Decomposition.STREAM_K or (
            isinstance(c, Sm90Config) and kn.decomposition is Decomposition.HEURISTIC and kn.splits == 1)):
        return tiles * -(-k // c.tile.k)
    return tiles * (kn.splits if splits_apply(c) else 1)


def without_idle_cap(program: Program, m: int, n: int, k: int) -> Program:
    """``program``, its knob ``grid`` dropped where the cap is at or above the CTAs its launch
    on M x N x K uses anyway (:func:`launch_ctas`): the same launch, under one text and key."""
    cap = program.knobs.grid
    return program.with_knobs(grid=0) if cap and cap >= launch_ctas(program, m, n, k) else program


def cap_grid(program: Program, grid: int) -> Program:
    """``program`` with its knob ``grid`` kept to at most ``grid`` CTAs (whole clusters; a
    cap of its own below that stays). ValueError where its launches cannot keep to a cap:
    kernels that launch a CTA per tile (:func:`grid_applies`); the checker tells the rest (a
    persistent kernel over the shared memory)."""
    if not grid_applies(program):
        raise ValueError(f"it cannot keep to grid {grid}: it launches a CTA (or a cluster) per tile")
    ctas = program.config.cluster[0] * program.config.cluster[1]
    cap = grid - grid % ctas
    if cap <= 0:
        raise ValueError(f"it cannot keep to grid {grid}: its clusters are of {ctas} CTAs")
    own = program.knobs.grid
    return program.with_knobs(grid=min(own, cap) if own else cap)


def sanitize(program: Program) -> Program:
    """Make knob defaults consistent with compile-time choices (splits need a splitter; a
    grid cap, a kernel that loops over its tiles), and drop an epilogue decision equal to
    CUTLASS's own choice or meaningless without a TMA epilogue."""
    if program.knobs.grid and not grid_applies(program):
        program = program.with_knobs(grid=0)
    c = program.config
    if isinstance(c, Sm90Config) and c.epilogue_tile and (c.epilogue is not Sm90Epilogue.TMA or c.epilogue_tile == limits.auto_epilogue_columns(c)):
        program = replace(program, config=replace(c, epilogue_tile=0))  # no staged tile, or CUTLASS's own: one text, one build
        c = program.config
    if isinstance(c, Sm90Config) and c.epilogue_stages and (c.epilogue is not Sm90Epilogue.TMA or c.epilogue_stages == limits.auto_epilogue_stages(c)):
        program = replace(program, config=replace(c, epilogue_stages=0))  # the same: CUTLASS's own depth, one build
        c = program.config
    if splits_apply(c):
        return program
    if isinstance(c, Sm90Config):
        if program.knobs.splits != 1 or program.knobs.decomposition is not Decomposition.HEURISTIC:
            return program.with_knobs(splits=1, decomposition=Decomposition.HEURISTIC)
    elif program.knobs.splits != 1 or program.knobs.decomposition is Decomposition.STREAM_K:
        return program.with_knobs(splits=1, decomposition=Decomposition.HEURISTIC)  # stream_k sums in a split's workspace
    return program


def random_program(rng: random.Random, gpu: Gpu, family: Family | None = None, *, b_layout: BLayout | None = None, tries: int = 10_000) -> Program:
    """A uniformly drawn *valid* program (rejection sampling over the slots)."""
    for _ in range(tries):
        fam = family or rng.choice(gpu.families())
        choices = {s.name: rng.choice(s.choices) for s in SLOTS[fam]}
        layout = b_layout or rng.choice(tuple(BLayout))
        program = sanitize(assemble(fam, choices, b_layout=layout))
        if is_valid(program, gpu):
            return program
    raise RuntimeError(f"no valid {family} program found in {tries} draws")
