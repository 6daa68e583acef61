"""l2gen's own sm90a kernel, held to nvcc: a fixed set of programs covering swap-AB on both
B layouts, the cluster split, cache hints, a K x N tile of narrower swizzle atoms, a wgmma width outside CuTe's base set and a
256-row kernel tile builds, and (where cuobjdump is found, through l2gen.sass) its machine code issues exactly one wgmma shape, the
kernel tile's width, and spills nothing; the atomic split publishes its additions without a full fence, the ordered split
with plain stores, the 128x128 atomic split
storing C by TMA from its loop with no stack (and, under -DL2GEN_TMA_STORE_SPLIT=0
-DL2GEN_SK_ALIGNED=0 -DL2GEN_SK_PIECES_LAST=1 -DL2GEN_SK_SPREAD=1, the builds kept to compare, without); the timeline build
(bench/timeline.py) is a library of its own."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from l2gen.build import build_many
from l2gen.lower import lower
from l2gen.parse import parse
from l2gen.targets import GPUS
from l2gen.sass import disassemble
from l2gen.toolchain import ToolchainError, find_disassembler

pytestmark = pytest.mark.nvcc

H200 = GPUS["h200"]

PROGRAMS = {
    # name: (program text, expected wgmma N)
    "swap_kn_cluster": ("b kn\n tile 64 x 128 x 128\n swap_ab on\n stages 4\n split_k cluster\n hints stream\n splits 4", 64),
    "swap_nk_m16_ordered": ("b nk\n tile 16 x 128 x 64\n swap_ab on\n stages 6\n split_k ordered\n splits 2", 16),
    "kn_cluster": ("b kn\n tile 128 x 128 x 64\n stages 4\n split_k cluster\n splits 2", 128),
    "nk_wide_extended": ("b nk\n tile 64 x 160 x 64\n stages 4", 160),
    "swap_kn_multicast": ("b kn\n tile 64 x 128 x 128\n swap_ab on\n stages 4\n split_k atomic\n cluster 1 x 4 x 1", 64),
    "swap_nk_bk256": ("b nk\n tile 16 x 64 x 256\n swap_ab on\n stages 5\n split_k atomic\n hints stream\n splits 2", 16),
    "nk_256_rows": ("b nk\n tile 256 x 128 x 64\n stages 4\n split_k atomic\n hints stream", 128),
    # a K x N B tile 96 wide: 32-column atoms under the 64-byte swizzle, TMA boxes to match
    "kn_narrow_atoms": ("b kn\n tile 128 x 96 x 64\n stages 8\n split_k atomic\n hints stream", 96),
}
# Built only with a template macro, by the test that names it.
MACRO_PROGRAMS = {
    # a 128x128 atomic split, persistent: its loop kernel stores C by TMA
    "kn_128_atomic_s5": ("b kn\n tile 128 x 128 x 64\n stages 5\n split_k atomic\n hints stream", 128),
}


def program(name: str):
    body, _ = PROGRAMS[name] if name in PROGRAMS else MACRO_PROGRAMS[name]
    return parse(f"kernel {name} {{\n arch sm90a\n impl l2gen\n {body}\n}}")


def kernels(library) -> dict[str, str]:
    """Each kernel of ``library`` (:func:`l2gen.sass.disassemble`) and its machine code, one
    instruction a line; skips the test where no cuobjdump with nvdisasm is found. A
    persistent program has two: ``gemm_kernel<false>`` (one unit per CTA) and
    ``gemm_kernel<true>`` (the loop over units)."""
    try:
        find_disassembler()
    except ToolchainError:
        pytest.skip("no cuobjdump with nvdisasm (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
    return {name: "\n".join(lines) for name, lines in disassemble(library).items()}


def kernels_built_with(name: str, flag: str | tuple[str, ...] | None, tmp_path, monkeypatch) -> dict[str, str]:
    """:func:`kernels` of program ``name`` built with more nvcc flags (template macros; None:
    as the library builds it), in a cache of its own so the build is this test's."""
    monkeypatch.setenv("L2GEN_CACHE_DIR", str(tmp_path))
    source = lower(program(name), H200)
    flags = (flag,) if isinstance(flag, str) else flag or ()
    result = build_many([source.with_flags(*flags) if flags else source], jobs=2, timeout=900)[0]
    assert result.ok, result.error
    return kernels(result.library)


def sass(library) -> str:
    """The machine code of every kernel in ``library``, one instruction a line."""
    return "\n".join(kernels(library).values())


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    import os

    old = os.environ.get("L2GEN_CACHE_DIR")
    os.environ["L2GEN_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    try:
        sources = [lower(program(name), H200) for name in PROGRAMS]
        results = build_many(sources, jobs=2, timeout=900)
    finally:
        if old is None:
            del os.environ["L2GEN_CACHE_DIR"]
        else:
            os.environ["L2GEN_CACHE_DIR"] = old
    return dict(zip(PROGRAMS, results))


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_l2gen_program_builds(built, name):
    result = built[name]
    assert result.ok, f"{name}:\n{result.error}\n{result.command}"


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_l2gen_machine_code_has_one_wgmma_shape_and_no_spills(built, name):
    result = built[name]
    assert result.ok, result.error
    code = sass(result.library)
    shapes = set(re.findall(r"HGMMA\.64x(\d+)x16", code))
    assert shapes == {str(PROGRAMS[name][1])}, f"{name}: wgmma widths {sorted(shapes)}"
    assert not re.search(r"\b(LDL|STL)\b", code), f"{name}: local-memory traffic (spills)"


def test_a_256_row_tile_gives_each_consumer_two_wgmma_rows_per_k_step(built):
    """A 256-row kernel tile has two consumer warpgroups of 128 rows: each K step (bk 64,
    four k16 slices) issues eight wgmma of 64 rows into two accumulator blocks, then waits."""
    result = built["nk_256_rows"]
    assert result.ok, result.error
    code = sass(result.library)
    steps = re.findall(r"WARPGROUP\.ARRIVE(.*?)WARPGROUP\.DEPBAR", code, flags=re.S)
    assert steps, "no wgmma batch"
    for step in steps:
        accumulators = re.findall(r"HGMMA\.64x128x16\.F32 (R\d+),", step)
        assert len(accumulators) == 8 and len(set(accumulators)) == 2, accumulators


def test_multicast_cluster_loads_shared_tiles_once(built):
    """With `cluster 1 x 4 x 1` and swap_ab the four CTAs along N share A, the kernel's Q
    operand: its loads are multicast, the B (P) loads are each CTA's own."""
    result = built["swap_kn_multicast"]
    assert result.ok, result.error
    code = sass(result.library)
    assert re.search(r"UTMALDG\.2D\.MULTICAST", code), "no multicast TMA load"
    assert re.search(r"UTMALDG\.2D\s", code), "no plain TMA load for the unshared operand"


def test_atomic_split_publishes_without_a_full_fence(built):
    """The atomic split publishes its additions with one acq_rel ticket after the consumer
    barrier: no sequentially consistent fence (MEMBAR.SC) is left on the reduction's path,
    and the ticket is one atomic."""
    result = built["swap_kn_multicast"]
    assert result.ok, result.error
    for name, code in kernels(result.library).items():
        assert re.search(r"REDG\.E\.ADD\.F32x4", code), f"{name}: no vector fp32 reduction into the workspace"
        assert not re.search(r"MEMBAR\.SC", code), f"{name}: a sequentially consistent fence on the reduction's path"
        assert len(re.findall(r"\bATOMG\.E\.ADD", code)) == 1, f"{name}: the ticket is one atomic"


def test_the_atomic_split_stores_c_by_tma_and_keeps_no_stack(tmp_path, monkeypatch):
    """The persistent loop of a 128x128 atomic split stores C by TMA (a tile written whole,
    or the sum its last split read back), as the split-free builds do, and touches no local
    memory; under -DL2GEN_TMA_STORE_SPLIT=0 (to compare) its loop kernel stages the tile for
    the threads' stores and keeps a 32-byte stack (53 local loads and stores). The one-unit
    kernel keeps the threads' stores."""
    code = kernels_built_with("kn_128_atomic_s5", None, tmp_path, monkeypatch)
    looped = [name for name in code if "ILb1E" in name]  # gemm_kernel<true>, mangled
    assert looped and len(code) == 2, list(code)
    for name, text in code.items():
        assert not re.search(r"\b(LDL|STL)\b", text), f"{name}: local-memory traffic"
        assert (re.search(r"\bUTMASTG\b", text) is not None) == (name in looped), f"{name}: TMA stores where they should not be, or none"
        assert re.search(r"REDG\.E\.ADD\.F32x4", text), f"{name}: the split's additions are gone"


def test_the_builds_kept_to_compare_still_build(tmp_path, monkeypatch):
    """-DL2GEN_TMA_STORE_SPLIT=0 (the atomic split's loop stages its tile for the threads'
    stores: no TMA store), -DL2GEN_SK_ALIGNED=0 (stream-K's runs laid end to end),
    -DL2GEN_SK_PIECES_LAST=1 (a CTA's whole tiles before its shares of the rest) and
    -DL2GEN_SK_SPREAD=1 (left-over tiles cut in more pieces than the grid holds), built
    together: what bench/probe.py --define compares the defaults against."""
    code = kernels_built_with("kn_128_atomic_s5",
                              ("-DL2GEN_TMA_STORE_SPLIT=0", "-DL2GEN_SK_ALIGNED=0", "-DL2GEN_SK_PIECES_LAST=1",
                               "-DL2GEN_SK_SPREAD=1"),
                              tmp_path, monkeypatch)
    assert len(code) == 2, list(code)
    for name, text in code.items():
        assert not re.search(r"\bUTMASTG\b", text), f"{name}: a TMA store under L2GEN_TMA_STORE_SPLIT=0"
        assert re.search(r"REDG\.E\.ADD\.F32x4", text), f"{name}: the split's additions are gone"


def test_ordered_split_stores_its_partials_and_takes_one_ticket(built):
    """The ordered split writes its partial tile with plain (L2) stores, never an atomic
    addition, publishes it with one acq_rel ticket and no sequentially consistent fence."""
    result = built["swap_nk_m16_ordered"]
    assert result.ok, result.error
    for name, code in kernels(result.library).items():
        assert not re.search(r"\bREDG\b", code), f"{name}: an atomic addition in the ordered split"
        assert re.search(r"STG\.E\.128\.STRONG\.GPU", code), f"{name}: no L2 stores of the partial tile"
        assert not re.search(r"MEMBAR\.SC", code), f"{name}: a sequentially consistent fence on the reduction's path"
        assert len(re.findall(r"\bATOMG\.E\.ADD", code)) == 1, f"{name}: the ticket is one atomic"


@pytest.mark.parametrize("name", ["swap_nk_m16_ordered", "swap_nk_bk256"])
def test_both_kernels_of_a_persistent_program_keep_their_wgmma_descriptors_uniform(built, name):
    """A persistent program builds two kernels: one unit per CTA, and the loop over units.
    Both step their wgmma descriptors with uniform-datapath adds (UIADD3 between the
    wgmmas), with no move from ordinary registers (R2UR) before each. Inside the loop over
    units ptxas could not prove the stage index warp-uniform and moved every descriptor
    (4 R2UR a wgmma), which once cost a fifth of the time on few-CTA decode shapes; the
    stage's count taken from lane 0 (L2GEN_UNIFORM_STAGE) keeps it uniform."""
    result = built[name]
    assert result.ok, result.error
    code = kernels(result.library)
    assert len(code) == 2, sorted(code)
    for kernel, text in code.items():
        lines = text.splitlines()
        at = [i for i, line in enumerate(lines) if "HGMMA" in line]
        between = lines[at[0]:at[-1] + 1]
        which = "loop" if "ILb1E" in kernel else "one-unit"
        assert any(re.search(r"\bUIADD3\b", line) for line in between), f"the {which} kernel's wgmma descriptors left the uniform datapath"
        moves = sum(bool(re.search(r"\bR2UR\b", line)) for line in between)
        assert moves <= len(at) // 2, f"the {which} kernel moves descriptors to uniform registers {moves} times over {len(at)} wgmmas"


def test_every_kernel_waits_for_the_grid_before_it_and_lets_the_next_one_start(built):
    """Programmatic dependent launch (knob pdl): every kernel of every program waits for
    the grid before it (griddepcontrol.wait: ACQBULK) once, before its first load, has the
    TMA prefetches into L2 that E_pdl runs before that wait (UTMAPF.L2), and lets the next
    grid launch (griddepcontrol.launch_dependents: PREEXIT); the library exports the entry
    that launches it so (E_pdl) beside E."""
    import ctypes

    for name, result in built.items():
        assert result.ok, result.error
        for kernel, code in kernels(result.library).items():
            lines = code.splitlines()
            waits = [i for i, line in enumerate(lines) if re.search(r"\bACQBULK\b", line)]
            loads = [i for i, line in enumerate(lines) if re.search(r"\bUTMALDG\b", line)]
            assert len(waits) == 1, f"{name} {kernel}: {len(waits)} griddepcontrol.wait"
            assert loads and waits[0] < min(loads), f"{name} {kernel}: a TMA load before the wait"
            assert re.search(r"\bPREEXIT\b", code), f"{name} {kernel}: no launch_dependents"
            assert re.search(r"\bUTMAPF\.L2\.2D\b", code), f"{name} {kernel}: no TMA prefetch into L2"
        library = ctypes.CDLL(str(result.library))
        assert hasattr(library, result.source.entry) and hasattr(library, f"{result.source.entry}_pdl"), name


def test_the_timeline_build_is_its_own_library(tmp_path, monkeypatch):
    """bench/timeline.py's build (-DL2GEN_TRACE) exports the trace (its first unit's points and
    every unit's end) and marker entries and
    reads %globaltimer; the plain build of the same program exports neither and reads no
    timer, under another cache key."""
    monkeypatch.setenv("L2GEN_CACHE_DIR", str(tmp_path))
    plain = lower(program("kn_cluster"), H200)
    traced = plain.with_flags("-DL2GEN_TRACE")
    results = build_many([plain, traced], jobs=2, timeout=900)
    assert all(r.ok for r in results), [r.error for r in results]
    assert results[0].library != results[1].library
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("no nm to list the exported symbols")

    def exports(lib) -> set[str]:
        out = subprocess.run([nm, "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True).stdout
        return {line.split()[-1] for line in out.splitlines() if line.strip()}

    entry = plain.entry
    extra = {f"{entry}_trace", f"{entry}_trace_units", f"{entry}_trace_reset", f"{entry}_mark", f"{entry}_marks"}
    assert extra <= exports(results[1].library)
    assert not extra & exports(results[0].library)
    plain_code, traced_code = (sass(r.library) for r in results)
    assert "GLOBALTIMER" not in plain_code and "GLOBALTIMER" in traced_code


def test_a_multicast_kernel_keeps_only_its_set_up_cluster_barrier(built):
    """A multicast kernel, one-unit and persistent, meets its cluster once, at set-up (the
    barriers initialized before any CTA multicasts into another); it ends on its producer's
    tail, which waits for each stage's last release, not on a cluster barrier."""
    found = {
        name: len(re.findall(r"\bUCGABAR_ARV\b", code))
        for name, code in kernels(built["swap_kn_multicast"].library).items()
    }
    assert found and len(found) == 2, found  # the one-unit kernel and the persistent one
    assert all(n == 1 for n in found.values()), found
