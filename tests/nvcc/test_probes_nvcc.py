"""The timing probes (templates/probes.cu) with the real nvcc: they build for sm_90a and
sm_80, the cached build is reused, and the C ABI answers without a GPU where it can (a warm
flush touches nothing; bad arguments are refused before any launch)."""

from __future__ import annotations

import subprocess

import pytest

from l2gen.probes import PROBES_SOURCE, Probes, ProbeError, build_probes
from l2gen.toolchain import find_nvcc

pytestmark = pytest.mark.nvcc


@pytest.mark.parametrize("gencode", ["-gencode=arch=compute_90a,code=sm_90a", "-gencode=arch=compute_80,code=sm_80"])
def test_probes_compile_for_each_family(tmp_path, gencode):
    out = tmp_path / "probes.so"
    cmd = [str(find_nvcc()), "-std=c++17", "-O2", "-Xcompiler=-fPIC", "-shared", gencode, str(PROBES_SOURCE), "-o", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "warning" not in (run.stdout + run.stderr).lower()


def test_build_probes_is_cached_and_binds(tmp_path, monkeypatch):
    monkeypatch.setenv("L2GEN_CACHE_DIR", str(tmp_path / "cache"))
    path = build_probes()
    assert path.parent == tmp_path / "cache" / "probes" and path.name.startswith("probes-")
    mtime = path.stat().st_mtime_ns
    assert build_probes() == path and path.stat().st_mtime_ns == mtime
    probes = Probes(path)
    assert probes.flush_function  # a C function pointer for the cuBLAS shim
    warm = probes.flush_context("warm", 0, 0, 0)
    probes.flush(warm, 0)  # warm: nothing to enqueue, so no device needed
    probes.destroy_context(warm)
    with pytest.raises(ProbeError, match="bad argument"):
        probes.flush_context("clean", 0, 100, 0)  # no buffer, not a multiple of 16
    with pytest.raises(ProbeError, match="bad argument"):
        probes.read(0, 16, 0, 0)


def test_a_failed_build_says_how_to_reproduce_it(tmp_path, monkeypatch):
    fake = tmp_path / "nvcc"
    fake.write_text("#!/bin/sh\necho 'probes.cu(1): error: nope' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("L2GEN_NVCC", str(fake))
    monkeypatch.setenv("L2GEN_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(ProbeError, match=r"(?s)building the timing probes failed:.*nvcc.*error: nope"):
        build_probes()
    assert not list((tmp_path / "cache" / "probes").glob("*.so"))
