"""The typed IR of an l2gen program: frozen records, one per decision.

A :class:`Program` is what the parser produces and what every later stage consumes.
Records compare by value and ignore source spans, so ``parse(print(p)) == p`` holds for
any program ``p``. Compile-time decisions (those that change the binary) live in the
family configs; run-time knobs (raster order, swizzle, split count, stream-K
decomposition) live in :class:`Knobs` and are only the *defaults* a launch uses: the
entry point of a built kernel takes them as arguments.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class Span:
    """A location in DSL source text (1-based line and column)."""

    file: str = "<string>"
    line: int = 1
    col: int = 1
    end_line: int = 1
    end_col: int = 1

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


NOWHERE = Span()


def _span_field():
    return field(default=NOWHERE, compare=False, repr=False, hash=False)


class Family(enum.Enum):
    """Kernel family: which template lowers the program.

    A program names its family with ``arch`` and, on sm90a, ``impl``: CUTLASS's kernels
    (the default) or l2gen's own. The value is the family's name in results and symbols.
    """

    SM80 = "sm80"  # CuTe mma.sync + cp.async + ldmatrix; runs on sm_80 and newer
    SM90 = "sm90a"  # CUTLASS 3.x collective builders, wgmma + TMA; sm_90a only
    SM90_L2GEN = "sm90a_l2gen"  # l2gen's own wgmma + TMA kernel: swap-AB, split-K in one launch

    @property
    def arch(self) -> str:
        """The ``arch`` word of the family's programs."""
        return "sm80" if self is Family.SM80 else "sm90a"

    @property
    def impl(self) -> str | None:
        """The ``impl`` word (sm90a only): ``cutlass`` or ``l2gen``."""
        return {Family.SM90: "cutlass", Family.SM90_L2GEN: "l2gen"}.get(self)

    @classmethod
    def of(cls, arch: str, impl: str | None = None) -> "Family":
        """The family of an ``arch`` and ``impl`` pair (no ``impl``: the arch's default, its
        CUTLASS kernels on sm90a); ValueError if there is none."""
        for family in cls:
            if family.arch == arch and family.impl == (impl or ("cutlass" if arch == "sm90a" else None)):
                return family
        raise ValueError(f"no kernel family for arch {arch!r} with impl {impl!r}")


class BLayout(enum.Enum):
    """How operand B is stored. A is always M x K row-major and C M x N row-major."""

    KN = "kn"  # B is K x N row-major: C = A @ B (torch.matmul on row-major tensors)
    NK = "nk"  # B is N x K row-major: C = A @ W.T (an nn.Linear weight)


class Raster(enum.Enum):
    """Order in which output tiles are assigned to consecutive blocks (run-time knob)."""

    HEURISTIC = "heuristic"
    ALONG_M = "along_m"
    ALONG_N = "along_n"


class Decomposition(enum.Enum):
    """Stream-K work decomposition (sm90 stream-K scheduler; run-time knob)."""

    HEURISTIC = "heuristic"
    DATA_PARALLEL = "data_parallel"
    SPLIT_K = "split_k"
    STREAM_K = "stream_k"


class SplitK(enum.Enum):
    """How a kernel splits K (compile-time; the slice count is a run-time knob)."""

    NONE = "none"  # one block owns a whole output tile
    PARALLEL = "parallel"  # sm80: slices write fp32 partials to a workspace, a second kernel reduces
    CLUSTER = "cluster"  # sm90a l2gen: the CTAs of a cluster reduce through distributed shared memory
    ATOMIC = "atomic"  # sm80, sm90a l2gen: atomic adds into a workspace, the last split writes C
    ORDERED = "ordered"  # sm80, sm90a l2gen: a workspace slot per split, the last sums them in split order


class Sm80Epilogue(enum.Enum):
    SMEM = "smem"  # stage the tile through shared memory, then 128-bit coalesced stores
    DIRECT = "direct"  # write accumulators straight from registers


class Mainloop(enum.Enum):
    """sm90 mainloop schedule (CUTLASS KernelTmaWarpSpecialized*)."""

    WS = "ws"
    PINGPONG = "pingpong"
    COOPERATIVE = "cooperative"


class Sm90Epilogue(enum.Enum):
    TMA = "tma"  # TMA-store epilogue matching the mainloop's warp specialization
    DIRECT = "direct"  # no shared memory: registers to global (NoSmemWarpSpecialized)


class Hints(enum.Enum):
    """L2 cache policies of the operand loads (sm90a l2gen)."""

    NONE = "none"  # the default policy for both
    STREAM = "stream"  # B evict-first, 128-byte L2 fills (read once); A no policy (its shared loads stay mergeable)


class Scheduler(enum.Enum):
    """sm90 tile scheduler."""

    PERSISTENT = "persistent"
    STREAM_K = "stream_k"


@dataclass(frozen=True)
class Knobs:
    """Run-time knobs: defaults for a launch, overridable per call without a recompile.

    ``swizzle`` is the log2 of the block-swizzle group size (0 = no swizzle);
    ``splits`` is the split-K slice count (sm80 split-K, sm90 stream-K, l2gen's split-K);
    ``decomposition`` only applies to the sm90 stream-K scheduler (and l2gen's kernel).
    ``pdl``: launch with programmatic dependent launch (l2gen's own sm90a kernel): the
    kernel's set-up overlaps the end of the kernel before it on the stream. It shows only
    where calls run back to back (CUDA graphs, a busy stream); it picks the library's entry
    (``E_pdl``), not an argument of it.
    ``grid``: the most CTAs a persistent launch may have (so the most SMs it keeps busy;
    sm90a kernels that loop over their tiles), 0 for as many as the GPU holds at once. Less
    leaves SMs to work on other streams, or sizes stream-K's runs.
    """

    raster: Raster = Raster.HEURISTIC
    swizzle: int = 0
    splits: int = 1
    decomposition: Decomposition = Decomposition.HEURISTIC
    pdl: bool = False
    grid: int = 0
    span: Span = _span_field()

    def as_args(self) -> tuple[int, int, int, int, int]:
        """The integers the generated entry point takes, in ABI order."""
        return (
            list(Raster).index(self.raster),
            self.swizzle,
            self.splits,
            list(Decomposition).index(self.decomposition),
            self.grid,
        )


@dataclass(frozen=True)
class Tile:
    m: int
    n: int
    k: int
    span: Span = _span_field()

    def __str__(self) -> str:
        return f"{self.m}x{self.n}x{self.k}"


@dataclass(frozen=True)
class Sm80Config:
    """Compile-time decisions of the sm80 family (our own CuTe kernel template)."""

    tile: Tile
    warps: tuple[int, int] = (2, 2)  # warp grid over the block tile (M, N)
    stages: int = 3  # cp.async shared-memory pipeline depth
    swizzle: tuple[int, int, int] = (3, 3, 3)  # shared-memory Swizzle<B, M, S>
    epilogue: Sm80Epilogue = Sm80Epilogue.SMEM
    split_k: SplitK = SplitK.NONE
    min_blocks: int = 1  # __launch_bounds__ minimum resident blocks per SM
    spans: dict = field(default_factory=dict, compare=False, repr=False, hash=False)

    @property
    def threads(self) -> int:
        return 32 * self.warps[0] * self.warps[1]


@dataclass(frozen=True)
class Sm90Config:
    """Compile-time decisions of the sm90 family (CUTLASS 3.x collective builders)."""

    tile: Tile
    cluster: tuple[int, int, int] = (1, 1, 1)
    mainloop: Mainloop = Mainloop.COOPERATIVE
    epilogue: Sm90Epilogue = Sm90Epilogue.TMA
    stages: int = 0  # 0 = auto: as many as fit beside the epilogue's shared memory
    scheduler: Scheduler = Scheduler.PERSISTENT
    # Columns of the TMA epilogue's tile (the block of C staged in shared memory and stored
    # by one TMA store; its rows follow the mainloop: 128 cooperative, 64 otherwise). 0:
    # CUTLASS's choice (32 columns, or 16 where the tile width is not a multiple of 32).
    epilogue_tile: int = 0
    # Tiles of C staged in shared memory at once, i.e. TMA stores in flight before the next
    # tile's epilogue must wait for one to have read its buffer (CUTLASS's StagesD). 0:
    # CUTLASS's choice, min(epilogue tiles per output tile, 2).
    epilogue_stages: int = 0
    spans: dict = field(default_factory=dict, compare=False, repr=False, hash=False)


@dataclass(frozen=True)
class Sm90L2genConfig:
    """Compile-time decisions of l2gen's own sm90a kernel (templates/sm90_l2gen_gemm.cu.j2).

    ``tile`` is the output tile of C (BM rows of M, BN columns of N) and the K tile. With
    ``swap_ab`` the kernel computes C^T = B^T A^T, so BN runs along wgmma's 64-row side and
    BM along its N side (8..256): the layout for small M.

    ``cluster`` (M x N x 1, in C's coordinates) groups neighbouring output tiles into one
    thread-block cluster that loads each shared operand tile once and multicasts it: the
    CTAs along M share a tile of B, those along N a tile of A.
    """

    tile: Tile
    swap_ab: bool = False
    stages: int = 4
    split_k: SplitK = SplitK.NONE
    hints: Hints = Hints.NONE
    cluster: tuple[int, int, int] = (1, 1, 1)
    spans: dict = field(default_factory=dict, compare=False, repr=False, hash=False)

    @property
    def kernel_tile(self) -> tuple[int, int]:
        """(rows, columns) of the kernel's own tile: the wgmma M side, then its N."""
        t = self.tile
        return (t.n, t.m) if self.swap_ab else (t.m, t.n)

    @property
    def kernel_cluster(self) -> tuple[int, int]:
        """The multicast cluster in the kernel's coordinates (rows, columns of tiles)."""
        cm, cn, _ = self.cluster
        return (cn, cm) if self.swap_ab else (cm, cn)

    @property
    def multicast(self) -> bool:
        return self.cluster[0] * self.cluster[1] > 1

    @property
    def consumers(self) -> int:
        """Consumer warpgroups: one for a 64-row kernel tile, two for 128 or 256 rows (each
        owning half the rows: one wgmma of 64 rows per K step, or two)."""
        return 1 if self.kernel_tile[0] <= 64 else 2


@dataclass(frozen=True)
class Program:
    """One kernel: its name, family, operand layout, compile-time config, knob defaults."""

    name: str
    family: Family
    b_layout: BLayout
    config: Sm80Config | Sm90Config | Sm90L2genConfig
    knobs: Knobs = Knobs()
    span: Span = _span_field()
    spans: dict = field(default_factory=dict, compare=False, repr=False, hash=False)

    def span_of(self, decision: str) -> Span:
        """Where a decision was written (falls back to the kernel header)."""
        return self.spans.get(decision) or self.config.spans.get(decision) or self.span

    def with_knobs(self, **changes) -> "Program":
        return replace(self, knobs=replace(self.knobs, **changes))


def given(values: dict, **fields) -> dict:
    """Keyword arguments for a record from the decisions that were made, each through its
    converter (None: as is); the rest are left to the record's own defaults."""
    return {name: (convert or (lambda v: v))(values[name]) for name, convert in fields.items() if name in values}
