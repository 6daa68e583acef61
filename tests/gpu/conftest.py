"""Fixtures the GPU tests share: the cuBLAS shim (skipping when it cannot be built) and
one isolated worker per test module."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def shim():
    from l2gen.baselines import ShimError, build_shim

    try:
        return str(build_shim())
    except ShimError as e:
        pytest.skip(f"cuBLAS shim unavailable: {e}")


@pytest.fixture(scope="module")
def worker():
    from l2gen.worker import Worker

    w = Worker(timeout=300)
    yield w
    w.close()
