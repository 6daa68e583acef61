"""Checker: programs that would not compile or run get a diagnostic naming the rule."""

import pytest

from l2gen.check import check
from l2gen.parse import parse
from l2gen.targets import GPUS, get_gpu
from l2gen.diagnostics import DiagnosticError
from tests.unit.programs import l2gen, sm80, sm90

H200 = GPUS["h200"]
A100 = GPUS["a100"]


GOOD = [
    sm80("tile 128 x 128 x 32 warps 2 x 2 stages 3"),
    sm80("tile 64 x 128 x 64 warps 2 x 2 stages 4 split_k parallel splits 4"),
    sm80("tile 16 x 64 x 64 warps 1 x 4 stages 4 b nk"),
    sm90("tile 128 x 256 x 64 cluster 2 x 1 x 1 mainloop cooperative"),
    sm90("tile 64 x 128 x 64 mainloop pingpong"),
    sm90("tile 128 x 128 x 64 scheduler stream_k splits 2 decomposition split_k"),
    sm90("tile 128 x 128 x 64 scheduler stream_k splits 1 decomposition stream_k"),
    sm90("tile 128 x 128 x 64 scheduler stream_k splits 4"),
    l2gen("tile 64 x 128 x 128 swap_ab on split_k atomic cluster 1 x 4 x 1 splits 4"),
    l2gen("tile 128 x 128 x 64 b nk cluster 2 x 2 x 1"),
    l2gen("tile 64 x 128 x 64 b nk cluster 8 x 1 x 1"),
    l2gen("tile 64 x 128 x 64 b kn cluster 1 x 8 x 1"),
    l2gen("tile 16 x 64 x 256 swap_ab on b nk stages 5 split_k atomic splits 4"),
    l2gen("tile 64 x 64 x 256 b kn stages 3"),
]


@pytest.mark.parametrize("text", GOOD)
def test_good_programs_pass(text):
    assert check(parse(text), H200) == []


# (program, target, code, fragment, line of the offending decision)
BAD = [
    (sm80("tile 100 x 128 x 32"), H200, "E-RANGE", "tile BM 100", 3),
    (sm80("tile 128 x 128 x 48"), H200, "E-RANGE", "tile BK 48", 3),
    (sm80("tile 128 x 128 x 32 warps 3 x 2"), H200, "E-RANGE", "warps WM 3", 3),
    (sm80("tile 128 x 128 x 32 warps 4 x 4"), H200, "E-WARPS", "512 threads", 3),
    (sm80("tile 32 x 128 x 32 warps 4 x 1"), H200, "E-ATOM", "multiple of 16 x WM", 3),
    (sm80("tile 256 x 256 x 32 warps 2 x 2"), H200, "E-REGS", "register budget", 3),
    (sm80("tile 128 x 128 x 64 warps 2 x 2 stages 8"), H200, "E-SMEM", "shared memory", 3),
    (sm80("tile 128 x 128 x 64 warps 2 x 2 stages 6"), A100, "E-SMEM", "a100", 3),
    (sm80("tile 128 x 128 x 32 stages 1"), H200, "E-RANGE", "stages 1", 3),
    (sm80("tile 128 x 128 x 32 smem_swizzle 3 2 3"), H200, "E-SWIZZLE", "not supported", 3),
    (sm80("tile 128 x 256 x 32 warps 2 x 4 min_blocks 2 stages 2"), H200, "E-REGS", "would spill", 3),
    (sm80("tile 128 x 128 x 32 splits 4"), H200, "E-SPLITS", "split_k parallel", 3),
    (sm80("tile 128 x 128 x 32 split_k parallel splits 100"), H200, "E-RANGE", "splits 100", 3),
    (sm80("tile 128 x 128 x 32 swizzle 5"), H200, "E-RANGE", "swizzle 5", 3),
    (sm80("tile 128 x 128 x 32 min_blocks 9"), H200, "E-RANGE", "min_blocks 9", 3),
    (sm80("tile 128 x 128 x 64 stages 4 min_blocks 2"), H200, "E-OCCUPANCY", "do not fit", 3),
    (sm90("tile 128 x 128 x 64"), A100, "E-ARCH", "does not run on a100", 2),
    (sm90("tile 64 x 128 x 64 mainloop cooperative"), H200, "E-SCHED", "BM of 128 or 256", 3),
    (sm90("tile 256 x 192 x 128 mainloop cooperative"), H200, "E-SMEM", "needs 2", 3),
    (sm90("tile 128 x 128 x 64 mainloop pingpong scheduler stream_k"), H200, "E-SCHED", "stream-K", 3),
    (sm90("tile 128 x 128 x 64 cluster 4 x 4 x 1"), H200, "E-CLUSTER", "at most 8", 3),
    (sm90("tile 128 x 128 x 64 cluster 1 x 1 x 2"), H200, "E-CLUSTER", "cluster K", 3),
    (sm90("tile 128 x 128 x 64 cluster 3 x 1 x 1"), H200, "E-RANGE", "cluster M 3", 3),
    (sm90("tile 96 x 128 x 64"), H200, "E-RANGE", "tile BM 96", 3),
    (sm90("tile 128 x 256 x 128 stages 7"), H200, "E-SMEM", "shared memory", 3),
    (sm90("tile 128 x 128 x 64 splits 2"), H200, "E-SPLITS", "stream_k", 3),
    (sm90("tile 128 x 128 x 64 decomposition stream_k"), H200, "E-SCHED", "only to 'scheduler stream_k'", 3),
    # seen on the H200: the binary refused these knobs at launch (L2GEN_ERR_KNOB)
    (sm90("tile 128 x 128 x 64 scheduler stream_k splits 2 decomposition data_parallel"), H200, "E-SPLITS", "'data_parallel' chooses its own split", 3),
    (sm90("tile 128 x 128 x 64 scheduler stream_k splits 3 decomposition stream_k"), H200, "E-SPLITS", "needs 'decomposition heuristic' or 'split_k'", 3),
    (sm90("tile 256 x 256 x 64 mainloop cooperative"), H200, "E-REGS", "accumulators", 3),
    (sm90("tile 128 x 256 x 64 mainloop pingpong"), H200, "E-REGS", "accumulators", 3),
    (sm90("tile 256 x 256 x 128 mainloop cooperative epilogue direct"), H200, "E-REGS", "accumulators", 3),
    (l2gen("tile 128 x 128 x 64 cluster 4 x 4 x 1"), H200, "E-CLUSTER", "at most 8", 3),
    (l2gen("tile 64 x 64 x 512"), H200, "E-RANGE", "tile BK 512", 3),
    (l2gen("tile 64 x 128 x 256 stages 4"), H200, "E-SMEM", "shared memory", 3),
    (l2gen("tile 128 x 128 x 64 cluster 3 x 1 x 1"), H200, "E-RANGE", "cluster M 3", 3),
    (l2gen("tile 128 x 128 x 64 cluster 2 x 1 x 2"), H200, "E-CLUSTER", "cluster K", 3),
    (l2gen("tile 128 x 128 x 64 split_k cluster cluster 2 x 1 x 1"), H200, "E-CLUSTER", "'split_k none', 'atomic' or 'ordered'", 3),
    # swap_ab: A (16 rows, K-major) is the kernel's Q, shared along C's N by 4 CTAs: 4 rows each
    (l2gen("tile 16 x 128 x 64 swap_ab on cluster 1 x 4 x 1"), H200, "E-CLUSTER", "the A tile's 16 rows", 3),
]


@pytest.mark.parametrize("text,gpu,code,fragment,line", BAD)
def test_bad_programs_are_diagnosed(text, gpu, code, fragment, line):
    diags = check(parse(text, "p.l2"), gpu)
    assert diags, "expected a diagnostic"
    match = [d for d in diags if d.code == code]
    assert match, [str(d) for d in diags]
    assert fragment in match[0].message, str(match[0])
    assert match[0].span.line == line and match[0].span.file == "p.l2"


def test_unknown_gpu_is_a_diagnostic():
    with pytest.raises(DiagnosticError) as info:
        get_gpu("v100")
    assert "known: a100, h100, h200" in str(info.value)
