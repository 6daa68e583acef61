"""The CUTLASS sm90a family compiles with its launch cache, and its library behaves
without a device.

One program (a cluster launch with the TMA epilogue, whose store descriptor the cache
re-points) is built with nvcc and loaded: its entries answer as the ABI says when there is
no CUDA device, and it looks up the driver's cuTensorMapReplaceAddress, which re-points
the cached descriptors. Whether the re-pointed launches compute the right thing takes a
GPU: tests/gpu/test_launch_cache.py. About a minute of nvcc on 2 cores.
"""

from __future__ import annotations

import pytest

from l2gen.build import build
from l2gen.ir import Knobs
from l2gen.lower import build_program, lower
from l2gen.parse import parse
from l2gen.printer import format_program
from l2gen.runtime import Library, device_count
from l2gen.targets import GPUS
from l2gen.toolchain import ToolchainError, find_nvcc

pytestmark = pytest.mark.nvcc

PROGRAM = """kernel launch_cache_pingpong {
    arch      sm90a
    b         kn
    tile      64 x 128 x 64
    cluster   1 x 2 x 1
    mainloop  pingpong
    epilogue  tma
}"""

L2GEN_ERR_PROBLEM, L2GEN_ERR_LAUNCH, L2GEN_ERR_KNOB = 1, 3, 4


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    try:
        find_nvcc()
    except ToolchainError as e:
        pytest.skip(f"no nvcc: {str(e).splitlines()[0]}")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("L2GEN_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        source = lower(build_program(parse(PROGRAM)), GPUS["h200"])
        result = build(source, timeout=900)
    assert result.ok, result.error
    return source, result


def test_the_library_builds_with_the_launch_cache(built):
    source, result = built
    assert "LaunchCache" in source.code and "cudaLaunchKernelExC" in source.code
    # The driver entry point it re-points descriptors through, looked up by name at run time.
    assert b"cuTensorMapReplaceAddress" in result.library.read_bytes()


def test_without_a_device_the_entries_fail_cleanly(built):
    if device_count() > 0:
        pytest.skip("a CUDA device is present: tests/gpu covers the launches")
    source, result = built
    lib = Library.load(result.library, source.entry)
    assert lib.program_text() == format_program(source.program)
    assert lib.workspace_size(128, 256, 512) == 0
    buf = 1 << 20  # addresses 16-byte aligned: only the missing device stops the launch
    assert lib.launch(buf, buf, buf, 128, 256, 512, 512, 256, 256, check=False) == L2GEN_ERR_LAUNCH
    # The checks before any device call answer as the ABI says.
    assert lib.launch(buf, buf, buf, 128, 256, 500, 500, 256, 256, check=False) == L2GEN_ERR_PROBLEM
    assert lib.launch(buf, buf, buf, 128, 256, 512, 512, 256, 256, Knobs(splits=2), check=False) == L2GEN_ERR_KNOB
    assert lib.launch(buf, buf, buf, 0, 256, 512, 512, 256, 256, check=False) == 0
