"""The sm80 family's one-launch split of K, held to nvcc: `split_k atomic` and `split_k ordered`
build to a library of one kernel (no reduction kernel, as `split_k parallel` has), whose machine
code (where cuobjdump is found) takes one ticket per tile with a single atomic, adds into the
workspace with reductions (atomic) or plain stores (ordered, none), traps on a ticket it should
never see, and spills nothing."""

from __future__ import annotations

import re

import pytest

from l2gen.build import build_many
from l2gen.lower import lower
from l2gen.parse import parse
from l2gen.sass import disassemble
from l2gen.targets import GPUS
from l2gen.toolchain import ToolchainError, find_disassembler

pytestmark = pytest.mark.nvcc

PROGRAMS = {
    "atomic": "b kn\n tile 64 x 128 x 64\n warps 2 x 2\n stages 4\n epilogue smem\n split_k atomic\n splits 4",
    "ordered": "b nk\n tile 64 x 64 x 64\n warps 2 x 1\n stages 4\n epilogue direct\n split_k ordered\n splits 4",
}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    programs = [parse(f"kernel sm80_split_{name} {{\n arch sm80\n {text}\n}}") for name, text in PROGRAMS.items()]
    with pytest.MonkeyPatch.context() as mp:  # a cache of this module's own: the builds are its
        mp.setenv("L2GEN_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        results = build_many([lower(p, GPUS["h200"]) for p in programs], jobs=2, timeout=900)
    return dict(zip(PROGRAMS, results))


def kernels(result) -> dict[str, str]:
    assert result.ok, f"{result.error}\n{result.command}"
    try:
        find_disassembler()
    except ToolchainError:
        pytest.skip("no cuobjdump with nvdisasm (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
    return {name: "\n".join(lines) for name, lines in disassemble(result.library).items()}


@pytest.mark.parametrize("mode", list(PROGRAMS))
def test_one_kernel_one_ticket_a_trap_and_no_spills(built, mode):
    code = kernels(built[mode])
    assert len(code) == 1 and next(iter(code)).endswith("_gemm"), f"kernels: {sorted(code)}"
    sass = next(iter(code.values()))
    assert len(re.findall(r"\bATOMG\.E\.ADD", sass)) == 1, "the tile's ticket is one atomic"
    assert re.search(r"\bBPT\.TRAP", sass), "no trap for a workspace that was not zeroed"
    assert not re.search(r"\b(LDL|STL)\b", sass), "local-memory traffic (spills)"
    reductions = re.findall(r"\bREDG\.E\.ADD\.F32", sass)
    if mode == "atomic":
        assert reductions, "the atomic split adds its partial with reductions"
    else:
        assert not reductions, "the ordered split stores its partial (no reduction: its sum is in slot order)"
