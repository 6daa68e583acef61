"""The checker's shared-memory formula for CUTLASS's sm90a kernels is exact, for the
epilogue tiles and store depths a program may choose: each program below is rendered, a static_assert that
``GemmKernel::SharedStorageSize`` and the mainloop's stage count equal what
``l2gen.limits.sm90_stages_and_smem`` says is appended, and nvcc's front end (``--cuda``: it
instantiates every template, then stops before code generation) must accept it. A wrong
formula would let the checker accept a program over the shared memory, or refuse one that
fits. About 40 s of nvcc per program on 2 cores; the rest of the epilogue tiles were checked
the same way when the decisions were added (tests/unit/test_sm90_smem.py holds their values).
"""

from __future__ import annotations

import subprocess

import pytest

from l2gen.limits import sm90_stages_and_smem
from l2gen.lower import build_program, lower
from l2gen.parse import parse
from l2gen.targets import GPUS
from l2gen.toolchain import ToolchainError, cutlass_include_dirs, find_nvcc
from tests.unit.programs import sm90

pytestmark = pytest.mark.nvcc

PROGRAMS = [
    # one TMA store tile per output tile (StagesD 1): the smallest case of the formula
    sm90("b nk tile 64 x 128 x 64 mainloop pingpong epilogue_tile 128"),
    # a 128-byte swizzle atom on the cooperative mainloop, three stores in flight: the
    # collective assembled without the builder (epilogue_stages)
    sm90("b kn tile 128 x 128 x 64 mainloop cooperative epilogue_tile 64 epilogue_stages 3"),
]


@pytest.fixture(scope="module")
def nvcc():
    try:
        return find_nvcc()
    except ToolchainError as e:
        pytest.skip(f"no nvcc: {str(e).splitlines()[0]}")


@pytest.mark.parametrize("text", PROGRAMS)
def test_cutlass_lays_out_the_shared_memory_the_checker_counts(text, nvcc, tmp_path):
    program = build_program(parse(text))
    source = lower(program, GPUS["h200"])
    stages, smem = sm90_stages_and_smem(program.config)
    cu = tmp_path / "t.cu"
    cu.write_text(
        source.code
        + f'\nstatic_assert(GemmKernel::SharedStorageSize == {smem}, "l2gen.limits: shared memory");\n'
        + f'static_assert(CollectiveMainloop::DispatchPolicy::Stages == {stages}, "l2gen.limits: stages");\n'
    )
    flags = [f for f in source.flags if f != "-shared"]
    includes = [f"-I{d}" for d in cutlass_include_dirs()]
    run = subprocess.run([str(nvcc), *flags, source.gencode, *includes, "--cuda", str(cu), "-o", str(tmp_path / "t.ii")],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
