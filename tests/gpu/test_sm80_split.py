"""The sm80 family's split of K in one launch (split_k atomic and ordered) on the GPU.

Every slice of a tile adds its partial into the workspace (atomic) or stores it into a slot
of its own (ordered), takes the tile's ticket, and the last to arrive writes C and leaves
the workspace zeroed: one kernel node per call in a CUDA graph (split_k parallel's second
kernel makes two), results right on odd shapes under every split count (more slices than K
tiles included) on both B layouts and both epilogues, the ordered split the same bits over
20 runs, 1,000 calls changing shape, split count and program on one workspace, and a
workspace that was not zeroed failing the call rather than writing a wrong C.
"""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from l2gen.runtime import device_count
from tests.gpu.splits import Workspace, call_relerr, graph_node_kinds, kn_problems, ldb_of, verify_program

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(device_count() == 0, reason="no CUDA device")]

PROGRAMS = {
    "kn_atomic_smem": "b kn\n tile 64 x 128 x 64\n warps 2 x 2\n stages 4\n epilogue smem\n split_k atomic",
    "nk_atomic_direct": "b nk\n tile 128 x 64 x 32\n warps 2 x 2\n stages 3\n epilogue direct\n split_k atomic",
    "kn_ordered_direct": "b kn\n tile 64 x 64 x 64\n warps 2 x 1\n stages 4\n epilogue direct\n split_k ordered",
    "nk_ordered_smem": "b nk\n tile 128 x 128 x 32\n warps 2 x 2\n stages 4\n epilogue smem\n split_k ordered",
    "nk_parallel": "b nk\n tile 64 x 64 x 64\n warps 2 x 2\n stages 4\n split_k parallel",
}
SHAPES = [(1, 8, 8), (100, 200, 72), (129, 136, 1000), (64, 1024, 4096), (33, 4104, 1024), (1000, 264, 520)]


@pytest.fixture(scope="module")
def libs():
    from l2gen.build import build_many
    from l2gen.lower import lower
    from l2gen.parse import parse
    from l2gen.runtime import Library
    from l2gen.targets import GPUS

    programs = {name: parse(f"kernel sm80_{name} {{\n arch sm80\n {text}\n}}") for name, text in PROGRAMS.items()}
    results = build_many([lower(p, GPUS["h200"]) for p in programs.values()])
    failed = [f"{r.source.program.name}: {r.error}" for r in results if not r.ok]
    assert not failed, failed
    return {name: (programs[name], Library.load(r.library, r.source.entry), r.library) for name, r in zip(programs, results)}


def test_one_launch_splits_are_right_on_odd_shapes(libs):
    from l2gen.ir import Knobs, Raster
    from l2gen.runtime import Stream
    from l2gen.verify import CudaDevice

    device = CudaDevice()
    settings = (Knobs(), Knobs(splits=2), Knobs(splits=3, raster=Raster.ALONG_M, swizzle=2),
                Knobs(splits=8, raster=Raster.ALONG_N, swizzle=1), Knobs(splits=64))
    failures = []
    with Stream() as stream:
        for name in [n for n in PROGRAMS if "parallel" not in n]:
            program, lib, _ = libs[name]
            failures += verify_program(name, program, lib, settings, SHAPES, stream, device)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("name, splits", [("kn_ordered_direct", 4), ("nk_ordered_smem", 16), ("kn_atomic_smem", 8)])
def test_ordered_is_bitwise_deterministic_and_atomic_close(libs, name, splits):
    from l2gen.ir import Knobs
    from l2gen.runtime import Stream
    from l2gen.verify import CudaDevice, make_inputs, reference, relerr

    device = CudaDevice()
    program, lib, _ = libs[name]
    layout = program.b_layout.value
    m, n, k = 256, 512, 4096
    a_host, b_host, _ = make_inputs(m, n, k, 5, layout)
    ref = reference(a_host, b_host, layout)
    a, c = device.alloc((m, k)), device.alloc((m, n))
    b = device.alloc((k, n) if layout == "kn" else (n, k))
    device.write(a, a_host)
    device.write(b, b_host)
    ws = Workspace()
    knobs = Knobs(splits=splits)
    buf, nbytes = ws.get(lib, m, n, k, knobs)
    outs = []
    with Stream() as stream:
        for _ in range(20):
            device.poison(c)
            lib.launch(a, b, c, m, n, k, k, ldb_of(layout, n, k), n, knobs, buf, nbytes, stream)
            stream.synchronize()
            outs.append(device.read(c))
    assert all(relerr(out, ref) <= 1e-3 for out in outs)
    if "ordered" in name:
        assert all(np.array_equal(out.view(np.uint16), outs[0].view(np.uint16)) for out in outs)
    assert ws.is_zero()


def test_one_call_is_one_kernel_node_in_a_cuda_graph(libs):
    from cuda.bindings import runtime as cudart

    from l2gen.ir import Knobs

    kernel = cudart.cudaGraphNodeType.cudaGraphNodeTypeKernel
    for name in PROGRAMS:
        program, lib, _ = libs[name]
        expected = 2 if "parallel" in name else 1  # parallel: the GEMM, then its reduction kernel
        kinds = graph_node_kinds(lib, program.b_layout.value, Knobs(splits=4))
        assert kinds == [kernel] * expected, f"{name}: graph nodes {kinds}"


def test_a_thousand_calls_changing_shape_splits_and_program(libs):
    from l2gen.ir import Knobs
    from l2gen.runtime import Stream
    from l2gen.verify import CudaDevice

    device = CudaDevice()
    rng = random.Random(11)
    names = ("kn_atomic_smem", "kn_ordered_direct")  # one workspace serves both, in turn
    shapes = [(m, n, k) for m in (1, 16, 100) for n, k in ((1024, 2048), (4104, 1024))]
    data = kn_problems(device, shapes)
    ws = Workspace()
    for m, n, k in shapes:
        for name in names:
            ws.get(libs[name][1], m, n, k, Knobs(splits=16))
    bad = []
    with Stream() as stream:
        for i in range(1000):
            name = rng.choice(names)
            _, lib, _ = libs[name]
            m, n, k = rng.choice(shapes)
            splits = rng.choice((1, 2, 3, 5, 8, 16))
            e = call_relerr(lib, device, data[(m, n, k)], (m, n, k), Knobs(splits=splits), ws, stream)
            if not e <= 1e-3:
                bad.append(f"call {i}: {name} {m}x{n}x{k} splits {splits}: relerr {e}")
    assert not bad, "\n".join(bad[:20])
    assert ws.is_zero(), "a split left its workspace dirty"


def test_a_workspace_smaller_than_asked_is_an_error_code(libs):
    from l2gen.ir import Knobs
    from l2gen.runtime import DeviceBuffer, LaunchError

    program, lib, _ = libs["kn_atomic_smem"]
    m, n, k = 64, 1024, 4096
    need = lib.workspace_size(m, n, k, Knobs(splits=4))
    assert need == 8 * 64 * 128 * 4 + 32  # 8 tiles' fp32 sums, then their tickets (16-byte rounded)
    buffers = [DeviceBuffer(2 * x) for x in (m * k, n * k, m * n)]
    small = DeviceBuffer(need - 16)
    try:
        with pytest.raises(LaunchError) as e:
            lib.launch(*buffers, m, n, k, k, n, n, Knobs(splits=4), small, need - 16)
        assert e.value.status_name == "L2GEN_ERR_WORKSPACE"
        with pytest.raises(LaunchError):
            lib.launch(*buffers, m, n, k, k, n, n, Knobs(splits=4), None, 0)
    finally:
        small.free()
        for b in buffers:
            b.free()


@pytest.mark.parametrize("name", ["kn_atomic_smem", "kn_ordered_direct"])
def test_a_workspace_that_was_not_zeroed_fails_the_call(libs, name):
    """Tickets left at 0xff..: the kernel traps, so the call's stream reports an error
    (in a process of its own: a trap ends the CUDA context)."""
    _, lib, path = libs[name]
    script = textwrap.dedent(f"""
        from l2gen.ir import Knobs
        from l2gen.runtime import DeviceBuffer, Library, Stream
        lib = Library.load({str(path)!r}, {lib.entry!r})
        m, n, k = 64, 1024, 4096
        knobs = Knobs(splits=4)
        need = lib.workspace_size(m, n, k, knobs)
        a, b, c = (DeviceBuffer(2 * x) for x in (m * k, n * k, m * n))
        a.fill_bytes(0); b.fill_bytes(0)
        ws = DeviceBuffer(need)
        ws.fill_bytes(0xFF)
        with Stream() as stream:
            lib.launch(a, b, c, m, n, k, k, n, n, knobs, ws, need, stream)
            try:
                stream.synchronize()
            except Exception as e:
                print("FAILED:", e)
            else:
                print("RAN")
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "FAILED:" in run.stdout, run.stdout + run.stderr
