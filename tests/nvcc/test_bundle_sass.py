"""A bundled build of a program is the same machine code as the program built alone.

Builds a few programs of both families alone and in bundles, and compares every kernel's
SASS (cuobjdump -sass) and, on sm90a, the wgmma shapes it issues. The fixed sample holds
a tile width that needs CuTe's extended wgmma shapes (128x160: one 64x160x16 wgmma per
64 rows and k-step, where without them CuTe issues five 64x32x16). About 4 minutes on
2 cores; ``L2GEN_BUNDLE_SAMPLE_COUNT=N`` adds N random valid programs (``L2GEN_SAMPLE_SEED``)
for a longer run on a bigger machine. Skips without cuobjdump and nvdisasm (the ``test``
extra installs them).
"""

from __future__ import annotations

import os
import random
from concurrent.futures import ThreadPoolExecutor

import pytest

from l2gen import build as build_mod
from l2gen.build import build_bundle, build_many
from l2gen.lower import lower
from l2gen.parse import parse
from l2gen.sample import draw
from l2gen.targets import GPUS
from l2gen.toolchain import ToolchainError, find_disassembler

pytestmark = [pytest.mark.nvcc, pytest.mark.slow]

H200 = GPUS["h200"]

# Two programs per family, so that each family makes one bundle of two; the sm90a pair
# needs the extended shapes (bundles group by flags, so both do).
FIXED = [
    """kernel wide_160 {
    arch sm90a
    b kn
    tile 128 x 160 x 64
    cluster 1 x 1 x 1
    mainloop ws
    epilogue tma
}""",
    """kernel narrow_80_nk {
    arch sm90a
    b nk
    tile 64 x 80 x 64
    cluster 1 x 2 x 1
    mainloop pingpong
    epilogue direct
}""",
    """kernel splitk_kn {
    arch sm80
    b kn
    tile 64 x 128 x 64
    warps 2 x 2
    stages 3
    split_k parallel
}""",
    """kernel plain_nk {
    arch sm80
    b nk
    tile 128 x 64 x 32
    warps 2 x 2
    stages 4
    epilogue direct
}""",
]


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    try:
        find_disassembler()
    except ToolchainError as e:
        pytest.skip(f"no disassembler: {str(e).splitlines()[0]}")
    programs = [parse(text) for text in FIXED]
    count = int(os.environ.get("L2GEN_BUNDLE_SAMPLE_COUNT", "0"))
    seed = int(os.environ.get("L2GEN_SAMPLE_SEED", random.SystemRandom().randrange(1 << 30)))
    programs += draw(count, seed, H200) if count else []
    sources = [lower(p, H200) for p in programs]
    # Lone builds and bundles at once, in one cache (nvcc_slots keeps it to one nvcc per
    # core): without the members' aliases, a lone build and a bundle never share an entry.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("L2GEN_CACHE_DIR", str(tmp_path_factory.mktemp("bundle-sass")))
        patch.setattr(build_mod, "_alias_members", lambda *args: None)
        with ThreadPoolExecutor(2) as pool:
            alone = pool.submit(build_many, sources, jobs=2, timeout=900)
            bundled = pool.submit(build_bundle, sources, max_size=2, jobs=2, timeout=900, force=True)
            alone, bundled = alone.result(), bundled.result()
    for result in alone + bundled:
        assert result.ok, f"(seed {seed}) {result.error}\n{result.command}"
    return programs, alone, bundled, seed


def test_every_program_was_bundled(builds):
    programs, alone, bundled, _ = builds
    assert len({r.library for r in alone}) == len(programs)
    assert len({r.library for r in bundled[:4]}) == 2  # the fixed sample: two pairs
    assert not {r.library for r in alone} & {r.library for r in bundled}


def test_bundled_sass_is_the_lone_sass(builds):
    from l2gen.sass import disassemble

    programs, alone, bundled, seed = builds
    libraries = {}
    for program, lone, member in zip(programs, alone, bundled):
        mine = disassemble(lone.library)
        assert mine, f"{program.name}: no kernels in {lone.library}"
        bundle = libraries.setdefault(member.library.resolve(), disassemble(member.library))
        for name, instructions in mine.items():
            assert name in bundle, f"(seed {seed}) {program.name}: {name} not in its bundle"
            assert bundle[name] == instructions, f"(seed {seed}) {program.name}: {name} differs"


def test_bundled_wgmma_shapes_are_the_lone_ones(builds):
    from l2gen.sass import disassemble, wgmma_shapes

    programs, alone, bundled, _ = builds
    for program, lone, member in zip(programs, alone, bundled):
        if program.family.value != "sm90a":
            continue
        mine = {n: wgmma_shapes(i) for n, i in disassemble(lone.library).items()}
        bundle = {n: wgmma_shapes(i) for n, i in disassemble(member.library).items()}
        assert any(mine.values()), f"{program.name}: no wgmma"
        for name, shapes in mine.items():
            assert bundle[name] == shapes, f"{program.name}: {dict(bundle[name])} != {dict(shapes)}"
        if program.config.tile.n == 160:  # the whole width in one wgmma, 8 per k-block of 64
            [shapes] = [s for s in mine.values() if s]
            assert set(shapes) == {"64x160x16"}, dict(shapes)
