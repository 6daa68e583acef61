"""CUTLASS's sm90a shared memory, as the checker counts it (``l2gen.limits``), against the
values nvcc gave: each row's ``GemmKernel::SharedStorageSize`` and mainloop stage count were
static_asserted in a build with CUTLASS 4.2 and nvcc 13.0 (tests/nvcc/test_sm90_smem_formula.py
does this for two of them on every CI run)."""

import pytest

from l2gen.limits import sm90_epilogue_tile, sm90_stages_and_smem
from l2gen.parse import parse
from tests.unit.programs import sm90

# (program body, stages, bytes of shared memory)
MEASURED = [
    ("tile 128 x 128 x 64 mainloop cooperative epilogue_tile 64", 6, 231424),
    ("tile 256 x 128 x 64 mainloop cooperative epilogue_tile 128", 3, 215040),
    ("tile 64 x 128 x 64 mainloop pingpong epilogue_tile 128", 8, 215040),
    ("tile 64 x 256 x 64 mainloop ws epilogue_tile 64 stages 4", 4, 164864),
    ("tile 128 x 192 x 64 mainloop cooperative epilogue_tile 96", 4, 214016),
    ("tile 128 x 160 x 64 mainloop pingpong epilogue_tile 80", 5, 205312),
    ("tile 64 x 256 x 64 mainloop pingpong epilogue_tile 256", 4, 198656),
    ("tile 128 x 256 x 64 mainloop cooperative epilogue_tile 128", 3, 215040),
    ("tile 256 x 128 x 64 mainloop cooperative", 4, 214016),
    # epilogue_stages (StagesD): deeper or shallower store pipelines than the builder's
    ("tile 128 x 128 x 64 mainloop pingpong epilogue_tile 128 epilogue_stages 4", 5, 231424),
    ("tile 256 x 128 x 64 mainloop cooperative epilogue_stages 3", 4, 222208),
    ("tile 128 x 256 x 64 mainloop cooperative epilogue_tile 256 epilogue_stages 2", 2, 231424),
    ("tile 64 x 256 x 64 mainloop ws epilogue_tile 64 epilogue_stages 1 stages 4", 4, 164864),
    ("tile 128 x 128 x 64 mainloop cooperative epilogue_tile 64 epilogue_stages 3", 5, 215040),
]


@pytest.mark.parametrize("body, stages, smem", MEASURED)
def test_the_formula_gives_what_cutlass_lays_out(body, stages, smem):
    assert sm90_stages_and_smem(parse(sm90(f"b nk {body}")).config) == (stages, smem)


def test_the_epilogue_tile_rows_follow_the_mainloop_and_columns_default_to_cutlass():
    tile = lambda body: sm90_epilogue_tile(parse(sm90(body)).config)  # noqa: E731
    assert tile("tile 128 x 128 x 64 mainloop cooperative") == (128, 32)
    assert tile("tile 128 x 176 x 64 mainloop pingpong") == (64, 16)
    assert tile("tile 128 x 128 x 64 mainloop pingpong epilogue_tile 128") == (64, 128)
    assert tile("tile 256 x 128 x 64 mainloop cooperative epilogue_tile 64") == (128, 64)
