"""Inspect: what machine code a built library holds (cuobjdump -sass), per kernel.

For checking the build, not part of it: that a bundled program compiles to the same code
as the program alone, and which wgmma shapes a Hopper kernel issues. Needs cuobjdump and
nvdisasm (:func:`l2gen.toolchain.find_disassembler`).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections import Counter
from pathlib import Path

from .toolchain import ToolchainError, find_disassembler

_FUNCTION = re.compile(r"^\s*Function : (\S+)\s*$")
_ADDRESS = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s*")
_HGMMA = re.compile(r"\bHGMMA\.(\d+x\d+x\d+)\b")


def disassemble(library: Path | str, timeout: float = 300) -> dict[str, list[str]]:
    """Every kernel in ``library`` (a shared library, cubin or fatbin): its name and its
    instructions as cuobjdump prints them, each with its encoding, without its address
    and with runs of blanks collapsed.
    Raises ToolchainError if cuobjdump is missing or fails."""
    cuobjdump, nvdisasm = find_disassembler()
    env = {**os.environ, "PATH": f"{nvdisasm.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    try:
        run = subprocess.run([str(cuobjdump), "-sass", str(library)], capture_output=True,
                             text=True, timeout=timeout, env=env, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ToolchainError(f"cannot run {cuobjdump}: {e}") from None
    if run.returncode != 0:
        raise ToolchainError(f"cuobjdump -sass {library} failed:\n{(run.stdout + run.stderr).strip()}")
    kernels: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in run.stdout.splitlines():
        function = _FUNCTION.match(line)
        if function:
            current = kernels.setdefault(function.group(1), [])
            continue
        if current is None:
            continue
        if _ADDRESS.match(line):
            current.append(" ".join(_ADDRESS.sub("", line).split()))
        elif current and line.strip().startswith("/*"):  # the second half of an encoding
            current[-1] += " " + line.strip()
    return kernels


def wgmma_shapes(instructions: list[str]) -> Counter:
    """How many wgmma instructions of each shape (``"64x160x16"``) a kernel issues."""
    return Counter(m.group(1) for line in instructions for m in _HGMMA.finditer(line))
