"""Reading SASS, without the CUDA tools: a fake cuobjdump prints a canned listing."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from l2gen import toolchain
from l2gen.sass import disassemble, wgmma_shapes
from l2gen.toolchain import ToolchainError, find_disassembler

LISTING = """
Fatbin elf code:
================
arch = sm_90a
code version = [1,8]

	code for sm_90a
		Function : kernel_a
	.headerflags	@"EF_CUDA_SM90"
        /*0000*/                   LDC R1, c[0x0][0x28] ;          /* 0x00000a00ff017b82 */
                                                                   /* 0x000fe20000000800 */
        /*0010*/                   HGMMA.64x160x16.F32 R24, gdesc[UR4], RZ, !UPT ;   /* 0x1 */
                                                                   /* 0x2 */
        /*0020*/                   HGMMA.64x160x16.F32 R24, gdesc[UR8], R24 ;        /* 0x3 */
                                                                   /* 0x4 */
		..........

		Function : kernel_b
        /*0000*/                   HMMA.16816.F32 R4, R36, R40, R4 ;  /* 0x5 */
                                                                       /* 0x6 */
"""

FAKE = """#!{python}
import sys
assert sys.argv[1] == "-sass"
sys.stdout.write(open({listing!r}).read())
"""


def tool(folder: Path, name: str, text: str = "#!/bin/sh\n") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_no_disassembler_says_how_to_get_one(bare):
    with pytest.raises(ToolchainError, match="pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm"):
        find_disassembler()


def test_disassembler_from_the_wheels(bare, monkeypatch):
    wheel = bare / "site" / "nvidia"
    cuobjdump = tool(wheel / "cu13" / "bin", "cuobjdump")
    monkeypatch.setattr(toolchain, "_wheel_dirs", lambda: [wheel])
    with pytest.raises(ToolchainError, match="nvdisasm not found"):
        find_disassembler()
    nvdisasm = tool(wheel / "cu13" / "bin", "nvdisasm")
    assert find_disassembler() == (cuobjdump, nvdisasm)


def test_l2gen_cuobjdump_must_exist(bare, monkeypatch):
    monkeypatch.setenv("L2GEN_CUOBJDUMP", str(bare / "nowhere" / "cuobjdump"))
    with pytest.raises(ToolchainError, match="L2GEN_CUOBJDUMP"):
        find_disassembler()


def test_disassemble_reads_each_kernel(bare, monkeypatch):
    listing = bare / "listing.txt"
    listing.write_text(LISTING)
    cuobjdump = tool(bare / "cuda", "cuobjdump", FAKE.format(python=sys.executable, listing=str(listing)))
    tool(bare / "cuda", "nvdisasm")
    monkeypatch.setenv("L2GEN_CUOBJDUMP", str(cuobjdump))
    kernels = disassemble(bare / "lib.so")
    assert list(kernels) == ["kernel_a", "kernel_b"]
    assert kernels["kernel_a"][0] == "LDC R1, c[0x0][0x28] ; /* 0x00000a00ff017b82 */ /* 0x000fe20000000800 */"
    assert len(kernels["kernel_a"]) == 3 and len(kernels["kernel_b"]) == 1
    assert wgmma_shapes(kernels["kernel_a"]) == {"64x160x16": 2}
    assert not wgmma_shapes(kernels["kernel_b"])
