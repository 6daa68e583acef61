"""Shared memory of l2gen's own sm90a kernel, as the checker and the launch count it
(``l2gen.limits``; every build static_asserts that the template's kSmemBytes and
kPersistentSmemBytes are these numbers)."""

import pytest

from l2gen.limits import L2GEN_SMEM_PER_SM, l2gen_persistent_smem_bytes, l2gen_smem_bytes
from l2gen.parse import parse
from tests.unit.programs import l2gen


def _cfg(body: str):
    return parse(l2gen(f"b kn {body}")).config


# (program body, bytes of the one-unit launch, bytes of the persistent one, C tiles staged)
CASES = [
    # 160 KB with one tile's two 16 KB boxes: a second tile's still leaves one CTA an SM
    ("tile 128 x 128 x 64 stages 4", 132176, 198656, 2),
    # 64 x 64: three CTAs an SM with one tile's box, two with two: one tile
    ("tile 64 x 64 x 64 stages 4", 66640, 75776, 1),
    # 128 x 256 on 4 stages: one tile's four boxes do not fit beside the pipeline; two do
    ("tile 128 x 256 x 64 stages 4", 197712, 231424, None),
    # a split of K reduces and stores through the threads: no TMA boxes
    ("tile 128 x 128 x 64 stages 4 split_k atomic", 132176, 167936, None),
]


@pytest.mark.parametrize("body, one_unit, persistent, tiles", CASES)
def test_the_persistent_kernel_stages_two_tiles_of_c_only_where_no_cta_per_sm_is_lost(body, one_unit, persistent, tiles):
    cfg = _cfg(body)
    assert l2gen_smem_bytes(cfg) == one_unit
    assert l2gen_persistent_smem_bytes(cfg) == persistent
    if tiles is not None:
        box_bytes = cfg.tile.m * 128 * (cfg.tile.n // 64)  # one tile of C in 64-column boxes
        one_tile = persistent - (tiles - 1) * box_bytes
        assert L2GEN_SMEM_PER_SM // (persistent + 1024) == L2GEN_SMEM_PER_SM // (one_tile + 1024)
        if tiles == 1:  # a second tile would have cost an SM a CTA
            assert L2GEN_SMEM_PER_SM // (persistent + box_bytes + 1024) < L2GEN_SMEM_PER_SM // (persistent + 1024)
