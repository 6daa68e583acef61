"""Shared memory of l2gen's own sm90a kernel, as the checker and the launch count it
(``l2gen.limits``; every build static_asserts that the template's kSmemBytes and
kPersistentSmemBytes are these numbers)."""

import pytest

from l2gen.limits import l2gen_persistent, l2gen_persistent_smem_bytes, l2gen_smem_bytes
from l2gen.parse import parse
from l2gen.targets import GPUS
from tests.unit.programs import l2gen

H100_SMEM_PER_BLOCK = GPUS["h100"].smem_per_block

# (program body, bytes of the one-unit launch, bytes of the persistent one)
CASES = [
    # the pipeline (4 x 32 KB) and 80 bytes of barriers, 1 KB aligned, then the tile's two
    # 16 KB TMA-store boxes apart from it, + 1 KB to align the base
    ("tile 128 x 128 x 64 stages 4", 131072 + 80 + 1024, 132096 + 2 * 16384 + 1024),
    ("tile 64 x 64 x 64 stages 4", 65536 + 80 + 1024, 66560 + 8192 + 1024),
    # 128 x 256 on 4 stages: the tile's four boxes do not fit beside the pipeline; two do
    ("tile 128 x 256 x 64 stages 4", 196608 + 80 + 1024, 197632 + 2 * 16384 + 1024),
    # an atomic split of 64 accumulators a thread stores its sum by TMA: the two boxes
    ("tile 128 x 128 x 64 stages 4 split_k atomic", 131072 + 80 + 1024, 132096 + 2 * 16384 + 1024),
    # an ordered split stages the tile in padded rows for the threads' stores: no TMA boxes
    ("tile 128 x 128 x 64 stages 4 split_k ordered", 131072 + 80 + 1024, 132096 + 128 * 136 * 2 + 1024),
]


@pytest.mark.parametrize("body, one_unit, persistent", CASES)
def test_the_persistent_kernel_keeps_its_epilogue_buffers_apart_from_the_pipeline(body, one_unit, persistent):
    cfg = parse(l2gen(f"b kn {body}")).config
    assert l2gen_smem_bytes(cfg) == one_unit
    assert l2gen_persistent_smem_bytes(cfg) == persistent
    assert l2gen_persistent(cfg, H100_SMEM_PER_BLOCK)


def test_a_kernel_whose_epilogue_does_not_fit_apart_runs_one_unit_per_cta():
    cfg = parse(l2gen("b kn tile 128 x 256 x 64 stages 4 split_k atomic")).config  # 192 KB + 68 KB
    assert l2gen_smem_bytes(cfg) <= H100_SMEM_PER_BLOCK
    assert not l2gen_persistent(cfg, H100_SMEM_PER_BLOCK)
