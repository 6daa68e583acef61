"""l2gen's kernel built with -DL2GEN_WG_RELEASE=1 (a consumed stage released by one thread
per consumer warpgroup and destination CTA, CUTLASS's pattern, instead of one per warp):
verified on the programs whose release it changes most, multicast clusters of 2, 4 and 8
CTAs, persistent and not, split and not, and a plain program. A separate file, so that a
release that deadlocked could not take the other GPU tests' results with it."""

from __future__ import annotations

import pytest

from l2gen.runtime import device_count

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(device_count() == 0, reason="no CUDA device")]

FLAG = "-DL2GEN_WG_RELEASE=1"
PROGRAMS = {  # name: (program body, shapes)
    "mc_nk_2x1_atomic": ("b nk\n tile 128 x 128 x 64\n stages 6\n split_k atomic\n cluster 2 x 1 x 1", [(256, 4104, 2048), (1000, 1000, 1000)]),
    "mc_kn_1x4_swap": ("b kn\n tile 64 x 128 x 128\n swap_ab on\n stages 4\n split_k atomic\n cluster 1 x 4 x 1", [(64, 4104, 4096), (7, 1000, 520)]),
    "mc_kn_2x2": ("b kn\n tile 128 x 128 x 64\n stages 4\n split_k atomic\n cluster 2 x 2 x 1", [(2056, 2048, 200)]),
    "mc_nk_8x1": ("b nk\n tile 64 x 128 x 64\n stages 4\n cluster 8 x 1 x 1", [(1000, 2056, 1000)]),
    "mc_kn_128x256_2x1": ("b kn\n tile 128 x 256 x 64\n stages 4\n cluster 2 x 1 x 1", [(4100, 2056, 136)]),  # persistent
    "plain_nk_atomic": ("b nk\n tile 128 x 128 x 64\n stages 5\n split_k atomic", [(256, 4096, 4096)]),
}


@pytest.fixture(scope="module")
def libs():
    from l2gen.build import build_many
    from l2gen.lower import lower
    from l2gen.parse import parse
    from l2gen.runtime import Library
    from l2gen.targets import GPUS

    programs = {n: parse(f"kernel {n} {{\n arch sm90a\n impl l2gen\n {body}\n}}") for n, (body, _) in PROGRAMS.items()}
    sources = [lower(p, GPUS["h200"]) for p in programs.values()]
    results = build_many([s.with_flags(FLAG) for s in sources])
    failed = [f"{r.source.program.name}: {r.error}" for r in results if not r.ok]
    assert not failed, failed
    return {n: (programs[n], Library.load(r.library, r.source.entry)) for n, r in zip(programs, results)}


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_warpgroup_release_verifies(libs, name):
    """Every knob setting test_l2gen_kernel's programs are verified under (splits 1 and 2
    where the program splits K), with the same verification and workspace check."""
    from tests.gpu.test_l2gen_kernel import _verify_all

    failures = _verify_all(libs, [name], PROGRAMS[name][1], (2,))
    assert not failures, "\n".join(failures)
