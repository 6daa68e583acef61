"""The run-time knob ``grid`` on the GPU: a persistent launch keeps to at most ``grid`` CTAs
and still computes every tile.

For l2gen's own kernel (persistent, atomic split and stream-K, a persistent multicast
cluster, swap-AB) and CUTLASS's (cooperative stream-K on a 2 x 1 cluster, ping-pong on a
1 x 2 cluster), each call is captured once into a CUDA graph to read the kernel node's grid
(at most ``grid`` CTAs), then run with NaN-poisoned outputs against an fp32 reference
(relerr <= 1e-3); where the sum's order does not depend on arrival (no split of K), its
bits must equal those of the uncapped grid. l2gen's split workspaces must be left zeroed.
Caps a launch cannot keep to are L2GEN_ERR_KNOB. ``L2GEN_TEST_DEFINES="MACRO=1 ..."`` builds
l2gen's own programs with those template macros (as tests/gpu/test_l2gen_kernel.py does).
Needs nvcc, CUTLASS headers, torch and an sm90 GPU; skips cleanly without them.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from l2gen.ir import BLayout, Decomposition, Family, Knobs  # noqa: E402
from l2gen.parse import parse  # noqa: E402
from tests.gpu.splits import defines_from_env  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="torch has no CUDA device"),
]

MAX_RELERR = 1e-3

# The configurations of the other GPU tests (tests/gpu/test_l2gen_kernel.py,
# test_launch_cache.py): the same libraries.
PROGRAMS = {
    "kn_128_whole": "arch sm90a impl l2gen b kn tile 128 x 128 x 64 stages 4",
    "kn_128_atomic": "arch sm90a impl l2gen b kn tile 128 x 128 x 64 stages 4 split_k atomic",
    "mc_kn_128x256_2x1": "arch sm90a impl l2gen b kn tile 128 x 256 x 64 stages 4 cluster 2 x 1 x 1",
    "swap_nk_m16_64": "arch sm90a impl l2gen b nk tile 16 x 64 x 128 swap_ab on stages 6",
    "kn_128_cluster": "arch sm90a impl l2gen b kn tile 128 x 128 x 64 stages 4 split_k cluster",
    "cutlass_coop_sk": ("arch sm90a b kn tile 128 x 128 x 64 cluster 2 x 1 x 1 mainloop cooperative epilogue tma "
                        "scheduler stream_k"),
    "cutlass_ping_nk": "arch sm90a b nk tile 64 x 128 x 64 cluster 1 x 2 x 1 mainloop pingpong epilogue direct",
}

# (program, knobs besides grid, grids, shapes): shapes of more units than the smaller grids
CASES = [
    ("kn_128_whole", {}, (1, 7, 64, 132), [(1000, 1000, 512), (4100, 2056, 256)]),
    ("kn_128_atomic", {"splits": 3}, (5, 64), [(1000, 1000, 1024)]),
    ("kn_128_atomic", {"decomposition": Decomposition.STREAM_K}, (1, 7, 64), [(1000, 1000, 1024), (64, 1024, 4096)]),
    ("mc_kn_128x256_2x1", {}, (2, 6, 64), [(4100, 2056, 256)]),
    ("swap_nk_m16_64", {}, (3, 32), [(16, 4104, 1024), (7, 1000, 2056)]),
    ("cutlass_coop_sk", {"decomposition": Decomposition.STREAM_K}, (2, 64), [(1000, 1000, 1024)]),
    ("cutlass_coop_sk", {}, (2, 64), [(4100, 2056, 256)]),
    ("cutlass_ping_nk", {}, (2, 64), [(1000, 1000, 512)]),
]


@pytest.fixture(scope="module")
def libraries(gpu):
    if gpu.sm < 90:
        pytest.skip("the knob grid is an sm90a one")
    from l2gen.build import build_many
    from l2gen.lower import build_program, lower
    from l2gen.runtime import Library

    programs = {name: parse(f"kernel {name} {{ {body} }}") for name, body in PROGRAMS.items()}
    defines = defines_from_env()
    sources = [lower(build_program(p), gpu) for p in programs.values()]
    sources = [s.with_flags(*defines) if defines and p.family is Family.SM90_L2GEN else s
               for p, s in zip(programs.values(), sources)]
    results = build_many(sources)
    failed = [f"{r.source.program.name}: {r.error}" for r in results if not r.ok]
    assert not failed, failed
    return {name: (programs[name], Library.load(r.library, s.entry)) for name, s, r in zip(programs, sources, results)}


def operands(m, n, k, layout, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn((m, k), device="cuda", dtype=torch.float16, generator=g)
    b = torch.randn((n, k) if layout is BLayout.NK else (k, n), device="cuda", dtype=torch.float16, generator=g) / k**0.5
    return a, b


def reference(a, b, layout):
    return a.float() @ (b.float().t() if layout is BLayout.NK else b.float())


class Launcher:
    """One library's launches on a side stream, each with its own zeroed workspace."""

    def __init__(self, program, lib):
        self.program, self.lib = program, lib
        self.layout = program.b_layout
        self.stream = torch.cuda.Stream()
        self.workspaces = []

    def __call__(self, a, b, c, knobs: Knobs, *, check: bool = True) -> int:
        m, k = a.shape
        n = c.shape[1]
        nbytes = self.lib.workspace_size(m, n, k, knobs)
        buf = torch.zeros(max(nbytes, 16), dtype=torch.uint8, device="cuda") if nbytes else None
        if buf is not None:
            self.workspaces.append(buf)
        torch.cuda.current_stream().synchronize()
        ldb = k if self.layout is BLayout.NK else n
        status = self.lib.launch(a, b, c, m, n, k, k, ldb, n, knobs, buf, nbytes, self.stream.cuda_stream, check=check)
        self.stream.synchronize()
        return status

    def grid_of(self, a, b, c, knobs: Knobs) -> int:
        """The CTAs of the call's kernel node, captured into a CUDA graph (CUTLASS's stream-K
        adds a memset node: kernel nodes only)."""
        from cuda.bindings import driver
        from cuda.bindings import runtime as cudart

        from l2gen.runtime import call

        self(a, b, c, knobs)  # set-up outside the capture
        m, k = a.shape
        n = c.shape[1]
        nbytes = self.lib.workspace_size(m, n, k, knobs)
        buf = self.workspaces[-1] if nbytes else None
        ldb = k if self.layout is BLayout.NK else n
        handle = self.stream.cuda_stream
        call("cudaStreamBeginCapture", handle, cudart.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal)
        self.lib.launch(a, b, c, m, n, k, k, ldb, n, knobs, buf, nbytes, handle)
        graph = call("cudaStreamEndCapture", handle)
        try:
            err, _, count = cudart.cudaGraphGetNodes(graph, 0)
            assert int(err) == 0
            err, nodes, count = cudart.cudaGraphGetNodes(graph, count)
            assert int(err) == 0
            ctas = []
            for node in nodes:
                err, kind = cudart.cudaGraphNodeGetType(node)
                if kind == cudart.cudaGraphNodeType.cudaGraphNodeTypeKernel:
                    # through the driver: the runtime's call answers cudaErrorInvalidDeviceFunction
                    # for a kernel that another runtime (the library's own) registered
                    err, params = driver.cuGraphKernelNodeGetParams(driver.CUgraphNode(int(node)))
                    assert int(err) == 0, err
                    ctas.append(params.gridDimX * params.gridDimY * params.gridDimZ)
            assert len(ctas) == 1, f"{len(ctas)} kernel nodes"
            return ctas[0]
        finally:
            call("cudaGraphDestroy", graph)

    def workspaces_zero(self) -> bool:
        return all(not torch.any(w) for w in self.workspaces)


@pytest.mark.parametrize("name, extra, grids, shapes", CASES,
                         ids=[f"{c[0]}-{'-'.join(f'{k}' for k in c[1]) or 'plain'}" for c in CASES])
def test_a_capped_grid_keeps_to_its_ctas_and_computes_every_tile(libraries, name, extra, grids, shapes):
    program, lib = libraries[name]
    run = Launcher(program, lib)
    # No split of K: the same sums whichever CTA makes them. (CUTLASS's stream-K scheduler
    # chooses its decomposition by the grid: its bits may change with it.)
    splits_k = extra.get("decomposition") is Decomposition.STREAM_K or extra.get("splits", 1) > 1
    deterministic = not splits_k and "scheduler stream_k" not in PROGRAMS[name]
    bad = []
    for m, n, k in shapes:
        a, b = operands(m, n, k, run.layout, m + n + k)
        ref = reference(a, b, run.layout)
        c = torch.empty((m, n), device="cuda", dtype=torch.float16)
        c.fill_(float("nan"))
        run(a, b, c, Knobs(**extra))
        uncapped = c.clone()
        for grid in grids:
            knobs = Knobs(grid=grid, **extra)
            ctas = run.grid_of(a, b, c, knobs)
            if ctas > grid:
                bad.append(f"{m}x{n}x{k} grid {grid}: the kernel ran {ctas} CTAs")
            c.fill_(float("nan"))
            run(a, b, c, knobs)
            err = float((c.float() - ref).norm() / ref.norm())
            if not err <= MAX_RELERR:  # NaN (a tile never written) fails too
                bad.append(f"{m}x{n}x{k} grid {grid}: relerr {err:.2e}")
            elif deterministic and not torch.equal(c.view(torch.int16), uncapped.view(torch.int16)):
                bad.append(f"{m}x{n}x{k} grid {grid}: other bits than the uncapped grid's")
    assert not bad, "\n".join(bad)
    # l2gen's kernel leaves its workspace zeroed; CUTLASS's stream-K zeroes it before each call
    assert "impl l2gen" not in PROGRAMS[name] or run.workspaces_zero(), "a capped launch left its workspace dirty"


def test_stream_k_sizes_its_workspace_by_the_capped_grid(libraries):
    _, lib = libraries["kn_128_atomic"]
    m, n, k = 1000, 1000, 1024
    sizes = {g: lib.workspace_size(m, n, k, Knobs(decomposition=Decomposition.STREAM_K, grid=g)) for g in (0, 7, 64)}
    assert 0 < sizes[7] < sizes[64] < sizes[0], sizes


@pytest.mark.parametrize("name, knobs, shape", [
    ("kn_128_whole", Knobs(grid=7, decomposition=Decomposition.DATA_PARALLEL), (1000, 1000, 512)),  # waves
    ("mc_kn_128x256_2x1", Knobs(grid=7), (4100, 2056, 256)),  # not whole clusters of 2
    ("kn_128_whole", Knobs(grid=-1), (1000, 1000, 512)),
    ("kn_128_cluster", Knobs(grid=8, splits=2), (1000, 1000, 512)),  # a cluster per tile: 128 CTAs
    ("cutlass_coop_sk", Knobs(grid=3), (1000, 1000, 1024)),  # not whole clusters of 2
])
def test_a_cap_the_launch_cannot_keep_is_a_knob_error(libraries, name, knobs, shape):
    from l2gen.runtime import ERR_KNOB

    program, lib = libraries[name]
    run = Launcher(program, lib)
    m, n, k = shape
    a, b = operands(m, n, k, run.layout, 1)
    c = torch.empty((m, n), device="cuda", dtype=torch.float16)
    assert run(a, b, c, knobs, check=False) == ERR_KNOB


def test_a_cap_over_the_grid_a_cluster_split_needs_is_served(libraries):
    program, lib = libraries["kn_128_cluster"]
    run = Launcher(program, lib)
    m, n, k = 256, 256, 512  # 4 tiles x 2 splits: 8 CTAs
    a, b = operands(m, n, k, run.layout, 2)
    c = torch.empty((m, n), device="cuda", dtype=torch.float16)
    assert run.grid_of(a, b, c, Knobs(grid=8, splits=2)) == 8
    err = float((c.float() - reference(a, b, run.layout)).norm() / reference(a, b, run.layout).norm())
    assert err <= MAX_RELERR
