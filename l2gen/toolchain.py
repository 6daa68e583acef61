"""The toolchain a build needs: nvcc, the CUTLASS/CuTe headers and (for baselines) cuBLAS;
and the disassembler that reads what a build made.

Every lookup reads the environment when it is called, never at import, so a user or a test
can point l2gen elsewhere with a variable:

- ``L2GEN_NVCC``: the nvcc executable (wins over everything else);
- ``CUDA_HOME`` / ``CUDA_PATH``: a CUDA toolkit;
- ``L2GEN_CUTLASS_DIR``: a CUTLASS checkout (instead of the ``nvidia-cutlass`` wheel);
- ``L2GEN_CUOBJDUMP``: cuobjdump, with nvdisasm beside it (only for reading what a build
  made, :mod:`l2gen.sass`).

A missing or broken piece raises :class:`ToolchainError`, whose message says how to fix it.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

# Toolkit locations tried last, after the environment and pip wheels.
SYSTEM_CUDA_DIRS: tuple[Path, ...] = (Path("/usr/local/cuda"),)

# Where NVIDIA's pip wheels put things, relative to the `nvidia` namespace package: the
# CUDA 13 wheels share one `cu13` tree, the CUDA 12 ones have a folder per component.
NVCC_WHEEL_PATHS = ("cu13/bin/nvcc", "cuda_nvcc/bin/nvcc")
# cuobjdump -sass runs nvdisasm, which comes in a wheel of its own.
DISASSEMBLER_WHEEL_DIRS = ("cu13/bin", "cuda_cuobjdump/bin", "cuda_nvdisasm/bin")
CUBLAS_WHEEL_DIRS = (("cu13/include", "cu13/lib"), ("cublas/include", "cublas/lib"))
TOOLKIT_CUBLAS_DIRS = (
    ("include", "lib64"),
    ("include", "lib"),
    ("targets/x86_64-linux/include", "targets/x86_64-linux/lib"),
    ("targets/sbsa-linux/include", "targets/sbsa-linux/lib"),
)

NVCC_MISSING = """\
nvcc, the CUDA compiler, was not found. l2gen looked for it in:
{looked}
To fix this, do one of:
  - install the CUDA toolkit (12.x or 13.x) and put its bin/ directory on PATH;
  - set CUDA_HOME to an installed toolkit (l2gen uses $CUDA_HOME/bin/nvcc);
  - pip install 'l2gen[nvcc]'   (NVIDIA's nvidia-cuda-nvcc wheel);
  - set L2GEN_NVCC to the nvcc executable."""

CUTLASS_MISSING = """\
The CUTLASS/CuTe headers were not found ({why}).
To fix this, do one of:
  - pip install nvidia-cutlass   (the wheel ships the headers under cutlass_library/source);
  - set L2GEN_CUTLASS_DIR to a CUTLASS checkout (with include/ and tools/util/include/)."""


class ToolchainError(Exception):
    """A piece of the toolchain is missing or broken; the message says how to fix it."""


@dataclass(frozen=True)
class Toolchain:
    """Everything about the compiler that a build's cache key and command depend on."""

    nvcc: Path
    nvcc_version: str
    include_dirs: tuple[Path, ...]
    cutlass_version: str


def detect_toolchain() -> Toolchain:
    """Find nvcc and the CUTLASS headers now. Raises ToolchainError."""
    nvcc = find_nvcc()
    includes = cutlass_include_dirs()
    return Toolchain(nvcc, nvcc_version(nvcc), includes, cutlass_version(includes[0]))


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _wheel_dirs() -> list[Path]:
    """The directories of the ``nvidia`` namespace package, where NVIDIA's wheels install."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(p) for p in spec.submodule_search_locations]


def _toolkit_dirs() -> list[Path]:
    names = ("CUDA_HOME", "CUDA_PATH")
    return [Path(os.environ[v]).expanduser() for v in names if os.environ.get(v)]


def find_nvcc() -> Path:
    """The nvcc to use: ``$L2GEN_NVCC``, then PATH, ``$CUDA_HOME`` / ``$CUDA_PATH``, the
    ``nvidia-cuda-nvcc`` wheel, and ``/usr/local/cuda``. Raises ToolchainError."""
    explicit = os.environ.get("L2GEN_NVCC")
    if explicit:
        path = Path(explicit).expanduser()
        if _is_executable(path):
            return path
        raise ToolchainError(
            f"L2GEN_NVCC is set to '{explicit}', which is not an executable file.\n"
            "Point it at nvcc, or unset it to let l2gen search PATH and CUDA_HOME."
        )
    on_path = shutil.which("nvcc")
    if on_path:
        return Path(on_path)
    candidates = [d / "bin" / "nvcc" for d in _toolkit_dirs()]
    candidates += [d / rel for d in _wheel_dirs() for rel in NVCC_WHEEL_PATHS]
    candidates += [d / "bin" / "nvcc" for d in SYSTEM_CUDA_DIRS]
    for path in candidates:
        if _is_executable(path):
            return path
    looked = ["  - $L2GEN_NVCC (not set)", "  - nvcc on PATH"]
    looked += [f"  - {p}" for p in candidates]
    if not _toolkit_dirs():
        looked.append("  - $CUDA_HOME/bin/nvcc, $CUDA_PATH/bin/nvcc (neither is set)")
    raise ToolchainError(NVCC_MISSING.format(looked="\n".join(looked)))


def find_disassembler() -> tuple[Path, Path]:
    """cuobjdump and the nvdisasm that its ``-sass`` runs, for checking what a build made
    (a build never needs them). Looks in the folder of ``$L2GEN_CUOBJDUMP``, on PATH,
    beside nvcc, in ``$CUDA_HOME/bin``, in the ``nvidia-cuda-cuobjdump`` and
    ``nvidia-cuda-nvdisasm`` wheels and in ``/usr/local/cuda/bin``. Raises ToolchainError."""
    explicit = os.environ.get("L2GEN_CUOBJDUMP")
    if explicit and not _is_executable(Path(explicit).expanduser()):
        raise ToolchainError(f"L2GEN_CUOBJDUMP is set to '{explicit}', which is not an executable file.")
    dirs = [Path(explicit).expanduser().parent] if explicit else []
    dirs += [Path(p).parent for p in (shutil.which("cuobjdump"), shutil.which("nvdisasm")) if p]
    try:
        dirs.append(find_nvcc().resolve().parent)
    except ToolchainError:
        pass
    dirs += [d / "bin" for d in _toolkit_dirs()]
    dirs += [d / rel for d in _wheel_dirs() for rel in DISASSEMBLER_WHEEL_DIRS]
    dirs += [d / "bin" for d in SYSTEM_CUDA_DIRS]
    found = [next((d / name for d in dirs if _is_executable(d / name)), None)
             for name in ("cuobjdump", "nvdisasm")]
    if explicit:
        found[0] = Path(explicit).expanduser()
    if None in found:
        missing = " and ".join(n for n, f in zip(("cuobjdump", "nvdisasm"), found) if f is None)
        raise ToolchainError(
            f"{missing} not found (PATH, nvcc's folder, CUDA_HOME, the pip wheels, /usr/local/cuda).\n"
            "To fix this: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm (or the 'test' "
            "extra), install the CUDA toolkit, or set L2GEN_CUOBJDUMP with nvdisasm beside it.")
    return found[0], found[1]


def nvcc_version(nvcc: Path) -> str:
    """nvcc's version, e.g. "13.0.88" (from "release 13.0, V13.0.88"); cached per binary."""
    try:
        stat = Path(nvcc).stat()
    except OSError as e:
        raise ToolchainError(f"cannot use nvcc at {nvcc}: {e}") from None
    return _nvcc_version(str(nvcc), stat.st_mtime_ns, stat.st_size)


def found_nvcc_version() -> str | None:
    """The version of the nvcc :func:`find_nvcc` finds, or None if there is none (for
    recording the environment of a result, where a missing compiler is not an error)."""
    try:
        return nvcc_version(find_nvcc())
    except ToolchainError:
        return None


@lru_cache(maxsize=None)
def _nvcc_version(nvcc: str, _mtime: int, _size: int) -> str:
    try:
        run = subprocess.run(
            [nvcc, "--version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ToolchainError(f"cannot run '{nvcc} --version': {e}") from None
    found = re.search(r"release (\d+\.\d+), V(\d+\.\d+\.\d+)", run.stdout)
    if found:
        return found.group(2)
    found = re.search(r"release (\d+\.\d+)", run.stdout)
    if found:
        return found.group(1)
    output = (run.stdout + run.stderr).strip() or f"(no output, exit status {run.returncode})"
    raise ToolchainError(f"'{nvcc} --version' did not report a release:\n{output}")


def cutlass_include_dirs() -> tuple[Path, Path]:
    """CUTLASS's ``include`` and ``tools/util/include``: from ``$L2GEN_CUTLASS_DIR`` if
    set, else from the ``nvidia-cutlass`` wheel. Raises ToolchainError."""
    checkout = os.environ.get("L2GEN_CUTLASS_DIR")
    if checkout:
        root = Path(checkout).expanduser()
        origin = f"L2GEN_CUTLASS_DIR={checkout}"
    else:
        spec = importlib.util.find_spec("cutlass_library")
        if spec is None or not spec.submodule_search_locations:
            why = "the nvidia-cutlass wheel is not installed"
            raise ToolchainError(CUTLASS_MISSING.format(why=why))
        root = Path(next(iter(spec.submodule_search_locations))) / "source"
        origin = f"the nvidia-cutlass wheel at {root}"
    dirs = (root / "include", root / "tools" / "util" / "include")
    if not (dirs[0] / "cutlass" / "version.h").is_file() or not (dirs[0] / "cute").is_dir():
        why = f"no cutlass/version.h and cute/ in {dirs[0]}, from {origin}"
        raise ToolchainError(CUTLASS_MISSING.format(why=why))
    if not dirs[1].is_dir():
        raise ToolchainError(CUTLASS_MISSING.format(why=f"no {dirs[1]}, from {origin}"))
    return dirs


def cutlass_version(include_dir: Path | None = None) -> str:
    """CUTLASS's version, e.g. "4.2.0", from ``cutlass/version.h``."""
    include_dir = include_dir or cutlass_include_dirs()[0]
    header = include_dir / "cutlass" / "version.h"
    try:
        text = header.read_text(errors="replace")
    except OSError as e:
        raise ToolchainError(f"cannot read {header}: {e}") from None
    parts = []
    for name in ("MAJOR", "MINOR", "PATCH"):
        found = re.search(rf"#define\s+CUTLASS_{name}\s+(\d+)", text)
        if not found:
            raise ToolchainError(f"{header} does not define CUTLASS_{name}")
        parts.append(found.group(1))
    return ".".join(parts)


def _cublas_in(include: Path, lib: Path) -> tuple[Path, Path] | None:
    if (include / "cublas_v2.h").is_file() and any(lib.glob("libcublas.so*")):
        return include, lib
    return None


def cublas_dirs() -> tuple[Path, Path] | None:
    """cuBLAS's (include, lib) directories, or None: from the CUDA toolkit (CUDA_HOME,
    CUDA_PATH, nvcc's own, /usr/local/cuda), else the ``nvidia-cublas`` wheel."""
    roots = _toolkit_dirs()
    try:
        roots.append(find_nvcc().resolve().parent.parent)
    except ToolchainError:
        pass
    roots += SYSTEM_CUDA_DIRS
    for root in roots:
        for include, lib in TOOLKIT_CUBLAS_DIRS:
            found = _cublas_in(root / include, root / lib)
            if found:
                return found
    for wheel in _wheel_dirs():
        for include, lib in CUBLAS_WHEEL_DIRS:
            found = _cublas_in(wheel / include, wheel / lib)
            if found:
                return found
    return None
