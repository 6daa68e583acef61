"""Fixtures the GPU tests share: the cuBLAS shim (skipping when it cannot be built), one
isolated worker per test module, and the dispatcher's target record of this GPU."""

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


@pytest.fixture(scope="module")
def gpu():
    """The l2gen target record of the GPU torch sees (skips when there is none)."""
    torch = pytest.importorskip("torch")
    from l2gen.dispatch import detect_gpu

    found = detect_gpu()
    if found is None:
        pytest.skip(f"no l2gen target record for {torch.cuda.get_device_name()}")
    return found
