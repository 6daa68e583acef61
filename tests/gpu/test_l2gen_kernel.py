"""l2gen's own sm90a kernel on the GPU: correct for small and odd M with swap-AB on both B
layouts, correct with 64-, 128- and 256-row kernel tiles under every split of K and under
stream-K, bitwise deterministic under the cluster and ordered splits, one kernel node per
call in a CUDA graph (no memset, no second kernel), and, with the atomic and ordered splits
and stream-K, the workspace left zeroed across 1,000 calls that change shape, split count
and decomposition.

Each program is lowered, built (cached), loaded in this process and verified against an
fp64 reference with NaN-poisoned outputs. ``L2GEN_TEST_DEFINES="MACRO=1 ..."`` builds every
program with those template macros (a knob measured before it becomes the default, such as
``L2GEN_HINT_ACT=1``), so that all of these tests run on it.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from l2gen.runtime import device_count
from tests.gpu.splits import Workspace, call_relerr, defines_from_env, graph_node_kinds, kn_problems, verify_program

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(device_count() == 0, reason="no CUDA device")]

# name: program body (arch sm90a, impl l2gen)
PROGRAMS = {
    "swap_kn": "b kn\n tile 64 x 128 x 64\n swap_ab on\n stages 6\n split_k cluster",
    "swap_nk": "b nk\n tile 64 x 128 x 128\n swap_ab on\n stages 4\n split_k cluster\n hints stream",
    "swap_nk_m16_64": "b nk\n tile 16 x 64 x 128\n swap_ab on\n stages 6",
    "kn_128": "b kn\n tile 128 x 128 x 64\n stages 4\n split_k cluster",
    "nk_64x256": "b nk\n tile 64 x 256 x 64\n stages 4\n split_k cluster",
    "nk_wide_160": "b nk\n tile 128 x 160 x 64\n stages 3",
    "swap_kn_atomic": "b kn\n tile 64 x 128 x 64\n swap_ab on\n stages 6\n split_k atomic",
    "kn_128_atomic": "b kn\n tile 128 x 128 x 64\n stages 4\n split_k atomic",
    "swap_kn_ordered": "b kn\n tile 64 x 64 x 128\n swap_ab on\n stages 6\n split_k ordered\n hints stream",
    "nk_128_ordered": "b nk\n tile 128 x 128 x 64\n stages 4\n split_k ordered",
    # 256-deep K tiles: four 64-wide boxes per K-major row, one 256-row box MN-major
    "swap_nk_bk256": "b nk\n tile 16 x 64 x 256\n swap_ab on\n stages 5\n split_k atomic\n hints stream",
    "kn_bk256": "b kn\n tile 64 x 64 x 256\n stages 3\n split_k atomic",
    # multicast clusters: A shared along N, B along M, both; with and without swap, with
    # the atomic split, and clusters hanging over the problem's edge
    "swap_kn_mc4": "b kn\n tile 64 x 128 x 128\n swap_ab on\n stages 4\n split_k atomic\n hints stream\n cluster 1 x 4 x 1",
    "swap_nk_mc2x2": "b nk\n tile 32 x 64 x 128\n swap_ab on\n stages 6\n cluster 2 x 2 x 1",
    "mc_kn_2x2": "b kn\n tile 128 x 128 x 64\n stages 4\n split_k atomic\n cluster 2 x 2 x 1",
    "mc_nk_2x1_ordered": "b nk\n tile 64 x 128 x 64\n stages 4\n split_k ordered\n cluster 2 x 1 x 1",
    "mc_nk_8x1": "b nk\n tile 64 x 128 x 64\n stages 4\n cluster 8 x 1 x 1",
    # 256-row kernel tiles: two consumer warpgroups of 128 rows, two wgmma each per K step
    "nk_256_atomic": "b nk\n tile 256 x 128 x 64\n stages 4\n split_k atomic\n hints stream",
    "kn_256_cluster": "b kn\n tile 256 x 64 x 64\n stages 4\n split_k cluster",
    "swap_nk_256_ordered": "b nk\n tile 64 x 256 x 64\n swap_ab on\n stages 4\n split_k ordered",
    "mc_nk_256_1x2": "b nk\n tile 256 x 128 x 64\n stages 4\n split_k atomic\n cluster 1 x 2 x 1",
    # persistent multicast clusters storing C by TMA (one box buffer; two)
    "mc_kn_256_1x2": "b kn\n tile 256 x 128 x 64\n stages 4\n cluster 1 x 2 x 1",
    "mc_kn_128x256_2x1": "b kn\n tile 128 x 256 x 64\n stages 4\n cluster 2 x 1 x 1",
    # three stages leave room to stage the whole tile (a TMA-store buffer per box)
    "mc_kn_128x256_s3_2x1": "b kn\n tile 128 x 256 x 64\n stages 3\n cluster 2 x 1 x 1",
    "kn_128_whole": "b kn\n tile 128 x 128 x 64\n stages 4",
    # the wave-fitting widths of the prefill rows, on 2 x 1 clusters (B shared along M)
    "mc_nk_128x160_2x1": "b nk\n tile 128 x 160 x 64\n stages 5\n cluster 2 x 1 x 1",
    "mc_nk_128x192_2x1": "b nk\n tile 128 x 192 x 64\n stages 4\n cluster 2 x 1 x 1",
    "mc_nk_128x224_2x1": "b nk\n tile 128 x 224 x 64\n stages 4\n cluster 2 x 1 x 1",
    "mc_nk_128x224_s3_2x1": "b nk\n tile 128 x 224 x 64\n stages 3\n cluster 2 x 1 x 1",
    # K x N tiles whose width is not a multiple of 64: 32-wide (64-byte swizzle) and 16-wide
    # (32-byte) atoms of B, alone, split, persistent and multicast (B's K rows in pieces)
    "kn_128x96_stream": "b kn\n tile 128 x 96 x 64\n stages 8\n split_k atomic\n hints stream",
    "kn_64x80_bk128": "b kn\n tile 64 x 80 x 128\n stages 4\n split_k atomic",
    "kn_128x224_whole": "b kn\n tile 128 x 224 x 64\n stages 4",
    "mc_kn_128x160_2x1": "b kn\n tile 128 x 160 x 64\n stages 5\n cluster 2 x 1 x 1",
    "mc_kn_128x112_2x1": "b kn\n tile 128 x 112 x 64\n stages 6\n split_k atomic\n cluster 2 x 1 x 1",
}
SMALL_M = (1, 7, 16, 33, 64, 100, 256)
N_K = ((4104, 1024), (1000, 2056), (264, 520))  # odd N (multiples of 8), K tails


def _program(name):
    from l2gen.parse import parse

    return parse(f"kernel {name} {{\n arch sm90a\n impl l2gen\n {PROGRAMS[name]}\n}}")


@pytest.fixture(scope="module")
def libs():
    from l2gen.build import build_many
    from l2gen.lower import lower
    from l2gen.runtime import Library
    from l2gen.targets import GPUS

    programs = {name: _program(name) for name in PROGRAMS}
    defines = defines_from_env()
    results = build_many([lower(p, GPUS["h200"]).with_flags(*defines) for p in programs.values()])
    failed = [f"{r.source.program.name}: {r.error}" for r in results if not r.ok]
    assert not failed, failed
    return {name: (programs[name], Library.load(r.library, r.source.entry)) for name, r in zip(programs, results)}


def _streams_k(program) -> bool:
    """Whether the checker lets the program run decomposition stream_k (split_k atomic in a
    persistent kernel)."""
    from l2gen.check import is_valid
    from l2gen.ir import Decomposition
    from l2gen.targets import GPUS

    return is_valid(program.with_knobs(splits=1, decomposition=Decomposition.STREAM_K), GPUS["h200"])


def _split_knobs(program, splits):
    from l2gen.ir import Decomposition, Knobs, Raster, SplitK

    yield Knobs()
    yield Knobs(raster=Raster.ALONG_M, swizzle=2)
    if program.config.split_k is SplitK.CLUSTER:
        for s in splits:
            yield Knobs(splits=s, raster=Raster.ALONG_N, swizzle=1)
    if program.config.split_k in (SplitK.ATOMIC, SplitK.ORDERED):
        for s in (*splits, 16):
            yield Knobs(splits=s, raster=Raster.ALONG_N, swizzle=1)
    if _streams_k(program):
        yield Knobs(decomposition=Decomposition.STREAM_K)
        yield Knobs(decomposition=Decomposition.STREAM_K, raster=Raster.ALONG_M, swizzle=1)


def _verify_all(libs, names, shapes, splits):
    from l2gen.runtime import Stream
    from l2gen.verify import CudaDevice

    device = CudaDevice()
    failures = []
    with Stream() as stream:
        for name in names:
            program, lib = libs[name]
            # more splits than K tiles: the entry refuses (tested below)
            failures += verify_program(name, program, lib, _split_knobs(program, splits), shapes, stream, device,
                                       skip=lambda knobs, k, program=program: knobs.splits > -(-k // program.config.tile.k))
    return failures


def test_small_m_with_swap_ab_on_both_layouts(libs):
    names = [n for n in PROGRAMS if n.startswith("swap")]
    shapes = [(m, n, k) for m in SMALL_M for n, k in N_K]
    assert not (failures := _verify_all(libs, names, shapes, (2, 4, 8))), "\n".join(failures)


def test_unswapped_kernels_with_residues(libs):
    names = [n for n in PROGRAMS if not n.startswith("swap")]
    shapes = [(1, 8, 8), (100, 200, 72), (129, 136, 1000), (64, 4096, 4096), (1000, 1000, 1000), (1024, 256, 4096)]
    assert not (failures := _verify_all(libs, names, shapes, (2, 3, 8))), "\n".join(failures)


@pytest.mark.parametrize("name, splits", [("swap_nk", 8), ("nk_128_ordered", 4), ("nk_128_ordered", 16)])
def test_cluster_and_ordered_splits_are_bitwise_deterministic(libs, name, splits):
    from l2gen.ir import Knobs
    from l2gen.runtime import Stream
    from l2gen.verify import CudaDevice, make_inputs, reference, relerr

    device = CudaDevice()
    program, lib = libs[name]
    m, n, k = (64, 4096, 4096) if name == "swap_nk" else (1024, 256, 4096)
    a_host, b_host, _ = make_inputs(m, n, k, 5, "nk")
    ref = reference(a_host, b_host, "nk")
    a, b, c = device.alloc((m, k)), device.alloc((n, k)), device.alloc((m, n))
    device.write(a, a_host)
    device.write(b, b_host)
    ws = Workspace()
    buf, nbytes = ws.get(lib, m, n, k, Knobs(splits=splits))
    first = None
    with Stream() as stream:
        for _ in range(20):
            device.poison(c)
            lib.launch(a, b, c, m, n, k, k, k, n, Knobs(splits=splits), buf, nbytes, stream)
            stream.synchronize()
            out = device.read(c)
            if first is None:
                first = out
                assert relerr(out, ref) <= 1e-3
            assert np.array_equal(out.view(np.uint16), first.view(np.uint16))
    assert ws.is_zero()


@pytest.mark.parametrize(
    "name, shapes",
    [
        ("swap_nk_m16_64", [(16, 28680, 1024), (7, 37896, 520)]),  # 449 and 593 tiles of 64 rows
        ("nk_wide_160", [(2000, 2008, 264), (1000, 4104, 128)]),
        ("kn_128_atomic", [(1000, 1000, 1000), (2056, 2048, 200)]),
        ("swap_kn_ordered", [(100, 8200, 1024)]),
        ("swap_nk_bk256", [(16, 28680, 1000)]),  # 449 tiles, the last K tile short
        # multicast clusters looping over more clusters than the GPU holds, hanging over
        # both edges (17 x 17, 33 x 9 and 17 x 16 tiles), C stored by TMA
        ("mc_kn_256_1x2", [(4100, 2056, 136)]),
        ("mc_kn_128x256_2x1", [(4100, 2056, 136)]),
        ("mc_kn_2x2", [(2056, 2048, 200)]),
        ("mc_kn_128x256_s3_2x1", [(4100, 2056, 136), (2056, 4104, 1000)]),
        ("kn_128_whole", [(2056, 2056, 200), (4104, 1000, 72)]),
        # 33 x 13, 33 x 11 and 33 x 10 tiles (the 2 x 1 clusters hang over M's edge), a
        # short last K tile; 128 x 224 on 4 stages runs in waves, on 3 persistent
        ("mc_nk_128x160_2x1", [(4100, 2056, 136)]),
        ("mc_nk_128x192_2x1", [(4100, 2056, 1000)]),
        ("mc_nk_128x224_2x1", [(4100, 2056, 136)]),
        ("mc_nk_128x224_s3_2x1", [(4100, 2056, 136), (2056, 3592, 1000)]),
    ],
)
def test_more_units_than_the_gpu_holds_persistent_or_in_waves(libs, name, shapes):
    """Where tiles x splits outnumber the CTAs the GPU holds, the persistent grid
    (decomposition heuristic) and the waves of one CTA per unit (data_parallel) both verify,
    and give the same bits wherever the sum's order does not depend on arrival (no split, or
    the ordered split)."""
    from l2gen.ir import Decomposition, Knobs, SplitK
    from l2gen.runtime import Stream
    from l2gen.verify import CudaDevice, make_inputs, reference, relerr

    device = CudaDevice()
    program, lib = libs[name]
    layout = program.b_layout.value
    split = program.config.split_k is not SplitK.NONE
    bad = []
    ws = Workspace()
    with Stream() as stream:
        for m, n, k in shapes:
            a_host, b_host, _ = make_inputs(m, n, k, 7, layout)
            ref = reference(a_host, b_host, layout)
            a, b, c = device.alloc((m, k)), device.alloc((k, n) if layout == "kn" else (n, k)), device.alloc((m, n))
            device.write(a, a_host)
            device.write(b, b_host)
            for splits in (1, 3) if split else (1,):
                outs = {}
                for d in (Decomposition.HEURISTIC, Decomposition.DATA_PARALLEL, Decomposition.STREAM_K):
                    if d is Decomposition.STREAM_K and (splits != 1 or not _streams_k(program)):
                        continue
                    knobs = Knobs(splits=splits, decomposition=d)
                    buf, nbytes = ws.get(lib, m, n, k, knobs)
                    device.poison(c)
                    lib.launch(a, b, c, m, n, k, k, n if layout == "kn" else k, n, knobs, buf, nbytes, stream)
                    stream.synchronize()
                    outs[d] = device.read(c)
                    e = relerr(outs[d], ref)
                    if not e <= 1e-3:
                        bad.append(f"{m}x{n}x{k} splits {splits} {d.value}: relerr {e}")
                outs.pop(Decomposition.STREAM_K, None)  # partial sums in arrival order
                deterministic = splits == 1 or program.config.split_k is SplitK.ORDERED
                if deterministic and not np.array_equal(*(o.view(np.uint16) for o in outs.values())):
                    bad.append(f"{m}x{n}x{k} splits {splits}: the persistent grid's bits differ from the waves'")
    assert not bad, "\n".join(bad)
    assert ws.is_zero(), "the workspace was left dirty"


def test_one_call_is_one_kernel_node_in_a_cuda_graph(libs):
    from cuda.bindings import runtime as cudart

    from l2gen.ir import Decomposition, Knobs

    stream_k = Knobs(decomposition=Decomposition.STREAM_K)
    for name, knobs in (("swap_kn", Knobs(splits=4)), ("kn_128", Knobs(splits=4)), ("kn_128_atomic", Knobs(splits=4)),
                        ("swap_kn_ordered", Knobs(splits=4)), ("kn_128_atomic", stream_k), ("swap_nk_bk256", stream_k)):
        program, lib = libs[name]
        kinds = graph_node_kinds(lib, program.b_layout.value, knobs)
        assert kinds == [cudart.cudaGraphNodeType.cudaGraphNodeTypeKernel], f"{name}: graph nodes {kinds}"


def test_a_thousand_calls_changing_shape_and_splits(libs):
    from l2gen.ir import Decomposition, Knobs
    from l2gen.runtime import Stream
    from l2gen.verify import CudaDevice

    device = CudaDevice()
    rng = random.Random(3)
    shapes = [(m, n, k) for m in (1, 16, 64, 100) for n, k in ((1024, 2048), (4104, 1024))]
    data = kn_problems(device, shapes)
    bad = []
    ws = Workspace()
    rotation = ("swap_kn", "swap_kn_atomic", "swap_kn_ordered")
    stream_k = Knobs(decomposition=Decomposition.STREAM_K)
    for (m, n, k) in shapes:  # one workspace, sized for the largest call
        for name in rotation[1:]:
            ws.get(libs[name][1], m, n, k, Knobs(splits=16))
        ws.get(libs["swap_kn_atomic"][1], m, n, k, stream_k)
    with Stream() as stream:
        for i in range(1000):
            name = rng.choice(rotation)
            program, lib = libs[name]
            m, n, k = rng.choice(shapes)
            k_tiles = -(-k // program.config.tile.k)
            splits = rng.choice([s for s in (1, 2, 3, 4, 8, 16) if s <= k_tiles and (s < 16 or name != "swap_kn")])
            knobs = Knobs(splits=splits)
            if name == "swap_kn_atomic" and rng.random() < 0.4:
                knobs, splits = stream_k, "stream_k"
            e = call_relerr(lib, device, data[(m, n, k)], (m, n, k), knobs, ws, stream)
            if not e <= 1e-3:
                bad.append(f"call {i}: {name} {m}x{n}x{k} splits {splits}: relerr {e}")
    assert not bad, "\n".join(bad[:20])
    assert ws.is_zero(), "a split left its workspace dirty"


def test_bad_knobs_are_error_codes(libs):
    from l2gen.ir import Decomposition, Knobs
    from l2gen.runtime import DeviceBuffer, LaunchError

    program, lib = libs["kn_128"]
    m, n, k = 128, 128, 128  # two K tiles of 64
    buffers = [DeviceBuffer(2 * x) for x in (m * k, k * n, m * n)]
    for splits in (3, 9):  # more splits than K tiles; more than a cluster holds
        with pytest.raises(LaunchError, match="L2GEN_ERR_KNOB"):
            lib.launch(*buffers, m, n, k, k, n, n, Knobs(splits=splits), None, 0, None)
    _, unsplit = libs["nk_wide_160"]
    with pytest.raises(LaunchError, match="L2GEN_ERR_KNOB"):
        unsplit.launch(*buffers, m, n, k, k, k, n, Knobs(splits=2), None, 0, None)
    for d in (Decomposition.SPLIT_K, Decomposition.STREAM_K):  # the checker's l2gen.decomposition
        with pytest.raises(LaunchError, match="L2GEN_ERR_KNOB"):
            unsplit.launch(*buffers, m, n, k, k, k, n, Knobs(decomposition=d), None, 0, None)
    _, atomic = libs["kn_128_atomic"]
    need = atomic.workspace_size(m, n, k, Knobs(splits=2))
    assert need > 0
    with pytest.raises(LaunchError, match="L2GEN_ERR_WORKSPACE"):  # none given
        atomic.launch(*buffers, m, n, k, k, n, n, Knobs(splits=2), None, 0, None)
    small = DeviceBuffer(need - 16)
    with pytest.raises(LaunchError, match="L2GEN_ERR_WORKSPACE"):  # too small
        atomic.launch(*buffers, m, n, k, k, n, n, Knobs(splits=2), small, need - 16, None)
    small.free()
    stream_k = Knobs(decomposition=Decomposition.STREAM_K)
    assert atomic.workspace_size(m, n, k, stream_k) > 0
    with pytest.raises(LaunchError, match="L2GEN_ERR_WORKSPACE"):  # stream-K sums in the workspace too
        atomic.launch(*buffers, m, n, k, k, n, n, stream_k, None, 0, None)
    with pytest.raises(LaunchError, match="L2GEN_ERR_KNOB"):  # the checker's l2gen.stream_k_splits
        atomic.launch(*buffers, m, n, k, k, n, n, Knobs(splits=2, decomposition=Decomposition.STREAM_K), None, 0, None)
    _, multicast = libs["mc_kn_2x2"]  # no persistent kernel: the checker's l2gen.stream_k
    with pytest.raises(LaunchError, match="L2GEN_ERR_KNOB"):
        multicast.launch(*buffers, m, n, k, k, n, n, stream_k, None, 0, None)
    _, ordered = libs["nk_128_ordered"]  # 17 slots: over what the last CTA reads
    m2, k2 = 128, 64 * 17
    big = [DeviceBuffer(2 * x) for x in (m2 * k2, k2 * n, m2 * n)]
    with pytest.raises(LaunchError, match="L2GEN_ERR_KNOB"):
        ordered.launch(*big, m2, n, k2, k2, k2, n, Knobs(splits=17), None, 0, None)
    for buf in (*buffers, *big):
        buf.free()


@pytest.mark.parametrize(
    "name, m, k, knobs",
    [
        ("swap_nk_bk256", 16, 1024, "splits=4"),  # a decode chain: atomic split, its workspace shared
        ("swap_nk_m16_64", 7, 1032, ""),
        ("nk_256_atomic", 100, 2048, "splits=3"),
        ("kn_128_atomic", 1000, 1024, "decomposition=stream_k"),
        ("mc_kn_128x256_2x1", 4100, 2048, ""),  # a persistent multicast grid, C stored by TMA
        ("mc_nk_128x224_2x1", 2056, 1792, ""),
    ],
)
def test_pdl_chains_verify_back_to_back_and_in_a_graph(libs, name, m, k, knobs):
    """Calls launched with programmatic dependent launch (knob pdl on) in a chain
    x <- x @ W_i (each call's A the previous call's C, K = N), back to back with no
    synchronization: every call waits for the one before it. In distinct buffers, each
    step checked against the step before as the device left it (relerr <= 1e-3); in two
    buffers used in turn, each call also overwrites what the call before it read. Then the
    same chain captured in a CUDA graph and replayed. The workspace is left zeroed."""
    from dataclasses import replace

    from l2gen.ir import Decomposition, Knobs
    from l2gen.runtime import Stream, capture_graph
    from l2gen.verify import CudaDevice, relerr

    program, lib = libs[name]
    layout = program.b_layout.value
    given = dict(kv.split("=") for kv in knobs.split(",") if kv)
    base = Knobs(splits=int(given.get("splits", 1)), decomposition=Decomposition(given.get("decomposition", "heuristic")))
    on = replace(base, pdl=True)
    steps, n = 6, k
    rng = np.random.default_rng(11)
    x0 = rng.standard_normal((m, k), dtype=np.float32).astype(np.float16)
    ws_host = [(rng.standard_normal((k, n), dtype=np.float32) / np.sqrt(k)).astype(np.float16) for _ in range(steps)]
    device = CudaDevice()
    weights = []
    for w in ws_host:  # stored as the layout says: K x N, or N x K
        stored = w if layout == "kn" else np.ascontiguousarray(w.T)
        weights.append(device.alloc(stored.shape))
        device.write(weights[-1], stored)
    ws = Workspace()
    buf, nbytes = ws.get(lib, m, n, k, base)
    bad = []

    def run_chain(xs, stream):
        for i in range(steps):  # buffer xs[i] in, xs[i + 1] out (indices taken modulo len(xs))
            a, c = xs[i % len(xs)], xs[(i + 1) % len(xs)]
            lib.launch(a, weights[i], c, m, n, k, k, n, n, on, buf, nbytes, stream)

    with Stream() as stream:
        # distinct buffers: every intermediate kept, every step checked
        xs = [device.alloc((m, k)) for _ in range(steps + 1)]
        for x in xs[1:]:
            device.poison(x)
        device.write(xs[0], x0)
        device.synchronize()  # the poison and the copy (legacy stream) before the chain's stream
        run_chain(xs, stream)
        stream.synchronize()
        outs = [device.read(x) for x in xs]
        for i in range(steps):
            e = relerr(outs[i + 1], outs[i].astype(np.float64) @ ws_host[i].astype(np.float64))
            if not e <= 1e-3:
                bad.append(f"distinct buffers, step {i}: relerr {e}")
        # two buffers in turn, eagerly and then as a graph replayed three times
        pair = [device.alloc((m, k)) for _ in range(2)]
        graph = None
        for replay in range(4):
            device.write(pair[0], x0)
            device.poison(pair[1])
            device.synchronize()
            if replay == 0:
                run_chain(pair, stream)
            else:
                if graph is None:
                    graph = capture_graph(stream, lambda h: run_chain(pair, h))
                graph.launch(stream)
            stream.synchronize()
            final = device.read(pair[steps % 2])
            e = relerr(final, outs[steps].astype(np.float64))
            if not e <= 1e-2:  # the same chain, so the same result up to split arrival order
                bad.append(f"two buffers, {'eager' if replay == 0 else f'graph replay {replay}'}: relerr {e} against the first chain")
        if graph is not None:
            graph.destroy()
    assert not bad, "\n".join(bad)
    assert ws.is_zero(), "the workspace was left dirty"
