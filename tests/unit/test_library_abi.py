"""A library built for another entry ABI is refused with a clear error, never called: the
loader checks ``E_abi()`` (templates/common.cuh.j2) before it binds the entry, whose
argument list it would otherwise get wrong. Built with the host C compiler (no CUDA);
skips without one."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from l2gen.runtime import ABI_VERSION, Library

CC = shutil.which("cc") or shutil.which("gcc")

BODY = """
#include <stddef.h>
int E(void) { return 0; }
size_t E_workspace(void) { return 0; }
const char* E_program(void) { return "kernel e {}"; }
"""


def build(tmp_path, name: str, abi: int | None) -> str:
    src = tmp_path / f"{name}.c"
    src.write_text(BODY + (f"int E_abi(void) {{ return {abi}; }}\n" if abi is not None else ""))
    lib = tmp_path / f"{name}.so"
    subprocess.run([CC, "-shared", "-fPIC", str(src), "-o", str(lib)], check=True, capture_output=True)
    return str(lib)


@pytest.mark.skipif(CC is None, reason="no host C compiler")
def test_the_loader_takes_its_own_abi_and_refuses_others(tmp_path):
    lib = Library(build(tmp_path, "now", ABI_VERSION), "E")
    assert lib.program_text() == "kernel e {}"
    for name, abi, says in (("before", None, "ABI 1"), ("later", ABI_VERSION + 1, f"ABI {ABI_VERSION + 1}")):
        with pytest.raises(ValueError, match=f"{says}.*rebuild the library"):
            Library(build(tmp_path, name, abi), "E")
