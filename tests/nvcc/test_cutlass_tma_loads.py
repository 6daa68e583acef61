"""The sm90a CUTLASS family issues its TMA loads without an L2 cache policy.

CuTe's loads always carry ``.L2::cache_hint`` (CUTLASS's collectives pass evict-normal),
and the GPC's L2 request coalescer merges no load that carries a policy;
``templates/include/l2gen/cutlass_tma_loads.cuh`` issues those loads without one. In the
machine code a load with a policy names it as a descriptor operand (``desc[URn]``).

One program with a 1 x 2 cluster (plain and multicast loads), built as lowered and with
``-DL2GEN_CUTLASS_TMA_HINT=1`` (CuTe's loads kept): about 2 minutes on 2 cores. Skips
without cuobjdump and nvdisasm (the ``test`` extra installs them).
"""

from __future__ import annotations

import dataclasses
import os
import re

import pytest

from l2gen.build import build_many
from l2gen.lower import lower
from l2gen.parse import parse
from l2gen.sass import disassemble
from l2gen.targets import GPUS
from l2gen.toolchain import ToolchainError, find_disassembler

pytestmark = [pytest.mark.nvcc, pytest.mark.slow]

PROGRAM = """kernel ping_c12 {
    arch sm90a
    b nk
    tile 128 x 128 x 64
    cluster 1 x 2 x 1
    mainloop pingpong
    epilogue tma
}"""


@pytest.fixture(scope="module")
def loads(tmp_path_factory) -> dict[str, list[str]]:
    """The TMA load instructions of the program as lowered ("lowered") and built with CuTe's
    own loads ("hinted")."""
    try:
        find_disassembler()
    except ToolchainError:
        pytest.skip("no cuobjdump with nvdisasm (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
    source = lower(parse(PROGRAM), GPUS["h200"])
    hinted = dataclasses.replace(source, flags=(*source.flags, "-DL2GEN_CUTLASS_TMA_HINT=1"))
    old = os.environ.get("L2GEN_CACHE_DIR")
    os.environ["L2GEN_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    try:
        results = build_many([source, hinted], jobs=2, timeout=900)
    finally:
        if old is None:
            del os.environ["L2GEN_CACHE_DIR"]
        else:
            os.environ["L2GEN_CACHE_DIR"] = old
    out = {}
    for name, result in zip(("lowered", "hinted"), results):
        assert result.ok, result.error
        code = [line for lines in disassemble(result.library).values() for line in lines]
        out[name] = [line for line in code if re.search(r"\bUTMALDG\b", line)]
    return out


def test_cutlass_loads_carry_no_policy(loads):
    found = loads["lowered"]
    assert any(".MULTICAST" in line for line in found), found
    assert any(".MULTICAST" not in line for line in found), found
    assert not [line for line in found if "desc[" in line]


def test_the_macro_keeps_cutes_policy_loads(loads):
    """The comparison's other side: CuTe's loads name their policy, so the test above would
    see a header that stopped taking the loads."""
    found = loads["hinted"]
    assert found and all("desc[" in line for line in found), found
