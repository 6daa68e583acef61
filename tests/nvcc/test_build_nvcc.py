"""The build stage with the real nvcc, on tiny translation units (no CUTLASS headers)."""

from __future__ import annotations

import ctypes
import subprocess

import pytest

from l2gen.build import build, build_bundle
from l2gen.ir import BLayout, Family, Program, Sm80Config, Tile
from l2gen.lower import KernelSource
from l2gen.toolchain import ToolchainError, find_nvcc

pytestmark = pytest.mark.nvcc

PROGRAM = Program(
    name="t", family=Family.SM80, b_layout=BLayout.KN, config=Sm80Config(tile=Tile(128, 128, 32))
)
SM80 = "-gencode=arch=compute_80,code=sm_80"


def tiny(entry: str, add: int, extra: str = "") -> KernelSource:
    """A translation unit shaped like a generated one: includes, a static helper with the
    same name in every program, a kernel, and an extern "C" entry."""
    code = f"""#include <cstdint>
#include <cuda_runtime.h>

static int helper(int x) {{ return x + {add}; }}

__global__ void touch(int* p) {{ *p = {add}; }}

extern "C" int {entry}(int x) {{ return helper(x); }}
{extra}
"""
    return KernelSource(program=PROGRAM, gpu="a100", entry=entry, code=code, gencode=SM80)


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    try:
        find_nvcc()
    except ToolchainError as e:
        pytest.skip(f"no nvcc: {str(e).splitlines()[0]}")
    monkeypatch.setenv("L2GEN_CACHE_DIR", str(tmp_path / "cache"))


def call(result, entry: str, x: int) -> int:
    return getattr(ctypes.CDLL(str(result.library)), entry)(x)


def test_build_load_call_and_cache_hit():
    src = tiny("l2gen_nvcc_add1", 1)
    first = build(src)
    assert first.ok, first.log
    assert not first.cached and first.seconds > 0
    assert call(first, "l2gen_nvcc_add1", 41) == 42
    second = build(src)
    assert second.ok and second.cached and second.library == first.library


def test_bundle_of_two_shares_a_library():
    a, b = tiny("l2gen_nvcc_add2", 2), tiny("l2gen_nvcc_add3", 3)
    results = build_bundle([a, b])
    assert all(r.ok for r in results), results[0].log
    assert results[0].library == results[1].library
    assert call(results[0], "l2gen_nvcc_add2", 40) == 42
    assert call(results[0], "l2gen_nvcc_add3", 39) == 42


def test_compile_error_is_short_and_reproducible():
    result = build(tiny("l2gen_nvcc_bad", 1, extra="int broken = undefined_name;"))
    assert not result.ok and result.library is None
    assert "error" in result.error and "undefined_name" in result.error
    assert len(result.error.splitlines()) <= 3
    again = subprocess.run(result.command, shell=True, capture_output=True, text=True)
    assert again.returncode != 0 and "undefined_name" in again.stdout + again.stderr
