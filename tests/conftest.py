"""Test groups by what they need: unit/ and property/ run anywhere, nvcc/ needs the CUDA
compiler, gpu/ needs an NVIDIA GPU. Tests marked ``nvcc`` or ``gpu`` skip cleanly when
what they need is missing."""

from __future__ import annotations

import functools

import pytest


@functools.lru_cache(maxsize=1)
def nvcc_missing() -> str | None:
    try:
        from l2gen.toolchain import find_nvcc

        find_nvcc()
    except Exception as exc:  # ToolchainError, or the module not importable
        return f"nvcc not available: {str(exc).splitlines()[0]}"
    return None


@functools.lru_cache(maxsize=1)
def gpu_missing() -> str | None:
    try:
        from cuda.bindings import runtime as cudart

        err, count = cudart.cudaGetDeviceCount()
    except Exception as exc:
        return f"no CUDA runtime: {exc}"
    if err != cudart.cudaError_t.cudaSuccess or count == 0:
        return "no CUDA GPU"
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "nvcc" in item.keywords or "gpu" in item.keywords:
            reason = nvcc_missing()
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))
                continue
        if "gpu" in item.keywords:
            reason = gpu_missing()
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))
