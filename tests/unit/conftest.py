"""Fixtures the unit tests share."""

from __future__ import annotations

import pytest

from l2gen import toolchain


@pytest.fixture
def bare(tmp_path, monkeypatch):
    """No CUDA tools anywhere: empty PATH, no L2GEN_NVCC / L2GEN_CUOBJDUMP / CUDA_HOME /
    CUDA_PATH, no wheels, no /usr/local/cuda. Returns the test's tmp_path."""
    for name in ("L2GEN_NVCC", "L2GEN_CUOBJDUMP", "CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(toolchain, "SYSTEM_CUDA_DIRS", ())
    monkeypatch.setattr(toolchain, "_wheel_dirs", lambda: [])
    return tmp_path
