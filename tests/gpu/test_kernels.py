"""Generated kernels are correct on the GPU: every example and a few random valid programs,
on odd shapes (residues in M, N and K) and under every run-time knob they take.

Each program is lowered, built (cached), loaded in this process and verified against an
fp64 reference with NaN-poisoned outputs; the worker-isolated path is exercised by bench.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from l2gen.runtime import device_count

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(device_count() == 0, reason="no CUDA device")]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.l2"))
# CUTLASS's TMA epilogue in tiles wider than its own (decision epilogue_tile) and with more or
# fewer of them staged (epilogue_stages), both B layouts
EPILOGUE_TILES = [ROOT / "bench/programs/epilogue" / f"{name}.l2" for name in
                  ("coop_kn_256x128x64_c12_e128", "coop_kn_128x256x64_c21_e256", "ping_kn_128x128x64_c12_e128",
                   "ping_kn_128x128x64_c12_e128_d4", "coop_kn_128x256x64_c21_e256_d2")]
EPILOGUE_TILE_NK = """kernel ping_nk_64x256x64_e64 {
    arch sm90a
    b nk
    tile 64 x 256 x 64
    mainloop pingpong
    epilogue tma
    epilogue_tile 64
}"""
# stream-K's partial tiles go through the same staged stores
EPILOGUE_STAGES_NK = """kernel sk_nk_128x128x64_d3 {
    arch sm90a
    b nk
    tile 128 x 128 x 64
    mainloop cooperative
    epilogue tma
    epilogue_stages 3
    scheduler stream_k
}"""
SHAPES = [(1, 8, 8), (100, 200, 72), (129, 136, 1000), (64, 4096, 4096), (1000, 1000, 1000)]


def _programs():
    from l2gen.ir import Family
    from l2gen.parse import parse, parse_file
    from l2gen.space import random_program
    from l2gen.targets import GPUS

    out = [parse_file(p) for p in EXAMPLES + EPILOGUE_TILES] + [parse(EPILOGUE_TILE_NK), parse(EPILOGUE_STAGES_NK)]
    rng = random.Random(7)
    for family in (Family.SM80, Family.SM90, Family.SM90_L2GEN):
        out += [random_program(rng, GPUS["h200"], family) for _ in range(3)]
    return out


@pytest.fixture(scope="module")
def built():
    from l2gen.build import build_many
    from l2gen.lower import lower
    from l2gen.targets import GPUS

    programs = _programs()
    results = build_many([lower(p, GPUS["h200"]) for p in programs])
    failed = [f"{r.source.program.name}: {r.error}" for r in results if not r.ok]
    assert not failed, failed
    return [(p, r) for p, r in zip(programs, results)]


def _knob_variants(program):
    from l2gen.ir import Decomposition, Raster, Scheduler, SplitK, Sm80Config, Sm90Config, Sm90L2genConfig

    cfg = program.config
    yield program.knobs
    yield program.knobs.__class__(raster=Raster.ALONG_M, swizzle=3, splits=1)
    yield program.knobs.__class__(raster=Raster.ALONG_N, swizzle=1, splits=1)
    if isinstance(cfg, Sm80Config) and cfg.split_k is not SplitK.NONE:
        yield program.knobs.__class__(splits=3)
        yield program.knobs.__class__(splits=64)  # more slices than k-tiles: empty slices
    if isinstance(cfg, Sm90L2genConfig) and cfg.split_k is not SplitK.NONE:
        for splits in (2, 3, 8):
            yield program.knobs.__class__(splits=splits)
    if isinstance(cfg, Sm90Config) and cfg.scheduler is Scheduler.STREAM_K:
        for d in Decomposition:
            yield program.knobs.__class__(splits=1, decomposition=d)
        yield program.knobs.__class__(splits=3, decomposition=Decomposition.SPLIT_K)


def _refused(program, knobs, k: int) -> bool:
    """A split count the entry refuses by contract: l2gen's own sm90a kernel takes no more
    splits than K has tiles (tests/gpu/test_l2gen_kernel.py checks the error code)."""
    from l2gen.ir import Sm90L2genConfig

    return isinstance(program.config, Sm90L2genConfig) and knobs.splits > -(-k // program.config.tile.k)


def test_generated_kernels_are_correct(built):
    from l2gen.printer import format_program
    from l2gen.runtime import DeviceBuffer, Library, Stream
    from l2gen.verify import CudaDevice, verify

    device = CudaDevice()
    failures = []
    with Stream() as stream:
        for program, result in built:
            lib = Library.load(result.library, result.source.entry)
            assert lib.program_text() == format_program(program)
            ldb_of = (lambda n, k: n) if program.b_layout.value == "kn" else (lambda n, k: k)
            for knobs in _knob_variants(program):
                for m, n, k in SHAPES:
                    if _refused(program, knobs, k):
                        continue
                    ws_bytes = lib.workspace_size(m, n, k, knobs)
                    ws = DeviceBuffer(max(ws_bytes, 16))
                    ws.fill_bytes(0)

                    def kernel(a, b, c, m=m, n=n, k=k, knobs=knobs, ws=ws, ws_bytes=ws_bytes):
                        lib.launch(a, b, c, m, n, k, k, ldb_of(n, k), n, knobs, ws, ws_bytes, stream)

                    try:
                        r = verify(kernel, m, n, k, b_layout=program.b_layout.value, seeds=2, device=device)
                        if not r.ok:
                            failures.append(f"{program.name} {knobs} {m}x{n}x{k}: {r.error}")
                    finally:
                        ws.free()
    assert not failures, "\n".join(failures)
