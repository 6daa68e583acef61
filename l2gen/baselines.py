"""Baselines: what l2gen is measured against, in the same process and the same run.

* ``torch_matmul``: ``torch.matmul`` (where torch is installed);
* ``cublas``: ``cublasGemmEx``, row-major C computed as the column-major ``C^T = B^T A^T``;
* ``cublas_tt``: ``cublasGemmEx`` with both operands transposed, writing C column-major
  (the other operand order; its C is verified transposed);
* ``cublaslt_heuristic``: cuBLASLt with its heuristic's first algorithm;
* ``cublaslt_autotuned``: cuBLASLt with the fastest of the heuristic's first 16 algorithms.
  They are timed round-robin once per shape and process (median, the L2 flushed by the
  measurement's protocol); the :data:`AUTOTUNE_FINALISTS` fastest then go into the
  measurement's own interleaved, pooled timing as well, and the fastest there is the
  baseline's time. A pick made in one short stretch of time moved between runs; the
  pooled timing is the one that reproduces (bench/results/README.md, "How the numbers are
  made").

All fp16 in and out with fp32 compute (``CUBLAS_COMPUTE_32F``); cuBLAS and cuBLASLt get a
32 MB workspace each. "cuBLAS-best" (:func:`cublas_best`) is the fastest of those measured.
The cuBLAS ones live in a small C++ shim (``templates/cublas_shim.cu``), built once with
nvcc against ``toolchain.cublas_dirs()`` and cached beside the kernel build cache.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Callable, Mapping

from .lower import TEMPLATE_DIR

BASELINES = ("torch_matmul", "cublas", "cublas_tt", "cublaslt_heuristic", "cublaslt_autotuned")
SHIM_SOURCE = TEMPLATE_DIR / "cublas_shim.cu"
SHIM_FLAGS = ("-std=c++17", "-O2", "-Xcompiler=-fPIC", "-shared")
AUTOTUNE_REPS = 30  # timed rounds of the cuBLASLt candidates (median per algorithm); at 10 the pick
# varied between runs on large shapes, moving cuBLAS-best
AUTOTUNE_FINALISTS = 3  # the tuner's fastest algorithms timed again with the candidates
SHIM_VERSION = "1"  # bump when the build command changes


class ShimError(RuntimeError):
    """The cuBLAS shim could not be built or a call into it failed."""


def result_key(name: str) -> str:
    """The key a baseline's time has in results files: ``<name>_us``."""
    return f"{name}_us"


def cublas_best(times: Mapping[str, float | None]) -> float | None:
    """The fastest of the baselines that produced a time (None if none did)."""
    measured = [t for t in times.values() if t is not None]
    return min(measured) if measured else None


# ---- building the shim ----------------------------------------------------------------


def _link_flag(lib_dir: Path, name: str) -> str:
    """``-lname`` if the unversioned library exists, else ``-l:libname.so.N`` (pip wheels
    ship only the versioned file)."""
    if (lib_dir / f"lib{name}.so").exists():
        return f"-l{name}"
    versioned = sorted(lib_dir.glob(f"lib{name}.so.*"), key=lambda p: (len(p.name), p.name))
    if not versioned:
        raise ShimError(f"no lib{name}.so* in {lib_dir}")
    return f"-l:{versioned[0].name}"


def shim_command(nvcc: Path | str, include_dir: Path, lib_dir: Path, out: Path | str) -> list[str]:
    return [
        str(nvcc), *SHIM_FLAGS, f"-I{include_dir}", str(SHIM_SOURCE), "-o", str(out),
        f"-L{lib_dir}", _link_flag(lib_dir, "cublas"), _link_flag(lib_dir, "cublasLt"),
        f"-Xlinker=-rpath,{lib_dir}",
    ]


def build_shim(*, timeout: float = 600, force: bool = False) -> Path:
    """Build the shim (or find it in the cache) and return the library's path.

    Raises ShimError (with the command and nvcc's output) when cuBLAS or nvcc is missing or
    the build fails.
    """
    from .build import HelperBuildError, build_helper
    from .toolchain import ToolchainError, cublas_dirs, find_nvcc

    try:
        nvcc = find_nvcc()
    except ToolchainError as e:
        raise ShimError(str(e)) from None
    dirs = cublas_dirs()
    if dirs is None:
        raise ShimError("cuBLAS headers and libraries not found (pip install nvidia-cublas, "
                        "or point CUDA_HOME at a toolkit that has them)")
    include_dir, lib_dir = dirs
    try:
        return build_helper("the cuBLAS shim", "baselines", "cublas_shim", SHIM_SOURCE,
                            lambda out: shim_command(nvcc, include_dir, lib_dir, out),
                            version=SHIM_VERSION, timeout=timeout, force=force)
    except HelperBuildError as e:
        raise ShimError(str(e)) from None


# ---- the shim at run time -------------------------------------------------------------

_vp, _int = ctypes.c_void_p, ctypes.c_int
_GEMM_ARGS = [_int, _vp, _vp, _vp, _int, _int, _int, _int, _vp]


class Shim:
    """ctypes bindings of the shim's C ABI; every call checks its return code."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self._dll = ctypes.CDLL(str(path), mode=os.RTLD_NOW | os.RTLD_LOCAL)
        d = self._dll
        d.l2gen_shim_init.argtypes, d.l2gen_shim_init.restype = [], _int
        d.l2gen_shim_error_string.argtypes = [_int]
        d.l2gen_shim_error_string.restype = ctypes.c_char_p
        d.l2gen_cublas_gemm.argtypes, d.l2gen_cublas_gemm.restype = _GEMM_ARGS, _int
        d.l2gen_cublaslt_gemm.argtypes, d.l2gen_cublaslt_gemm.restype = _GEMM_ARGS, _int
        d.l2gen_cublaslt_autotune.argtypes = [
            _vp, _vp, _vp, _int, _int, _int, _int, _vp, _vp, _int, _vp,
            ctypes.POINTER(_int), ctypes.POINTER(_int), ctypes.POINTER(ctypes.c_float),
        ]
        d.l2gen_cublaslt_autotune.restype = _int
        self._check(d.l2gen_shim_init(), "l2gen_shim_init")

    def _check(self, code: int, what: str) -> None:
        if code:
            raw = self._dll.l2gen_shim_error_string(code)
            raise ShimError(f"{what} failed: {raw.decode() if raw else ''} (code {code})")

    def cublas(self, variant: int, a: int, b: int, c: int, m: int, n: int, k: int,
               nk: bool, stream: int) -> None:
        self._check(self._dll.l2gen_cublas_gemm(variant, a, b, c, m, n, k, int(nk), stream),
                    "cublasGemmEx")

    def cublaslt(self, tuned: int, a: int, b: int, c: int, m: int, n: int, k: int,
                 nk: bool, stream: int) -> None:
        """tuned 0: the heuristic's first algorithm; r >= 1: the auto-tune's r-th fastest."""
        self._check(self._dll.l2gen_cublaslt_gemm(int(tuned), a, b, c, m, n, k, int(nk), stream),
                    "cublasLtMatmul")

    def autotune(self, a: int, b: int, c: int, m: int, n: int, k: int, nk: bool,
                 flush_function: int, flush_context: int, reps: int, stream: int) -> tuple[int, int, float]:
        """(algorithms timed, index chosen, its median µs); cached per shape in the shim.
        ``flush_function(flush_context, stream)`` runs before each timed run (0: none)."""
        tried, chosen, best = _int(), _int(), ctypes.c_float()
        self._check(self._dll.l2gen_cublaslt_autotune(
            a, b, c, m, n, k, int(nk), flush_function or None, flush_context or None, reps, stream,
            ctypes.byref(tried), ctypes.byref(chosen), ctypes.byref(best)),
            "cublasLt autotune")
        return tried.value, chosen.value, best.value


Runner = Callable[[int], None]


class Baselines:
    """The baselines available in this process, each as a runner over given buffers.

    ``shim``: path of a built shim, or None to build (or find) it now. What cannot be had
    (no torch, no cuBLAS, a failed build) lands in :attr:`unavailable` with the reason.
    """

    def __init__(self, shim: Path | str | None = None, names=BASELINES):
        self.names = tuple(names)
        self.unavailable: dict[str, str] = {}
        self.tuning: dict[tuple, tuple[int, int, float]] = {}
        self._torch = None
        self._streams: dict[int, object] = {}
        self._shim: Shim | None = None
        if "torch_matmul" in self.names:
            try:
                import torch

                if not torch.cuda.is_available():
                    raise RuntimeError("torch sees no CUDA device")
                self._torch = torch
            except Exception as e:  # ImportError, or a torch without CUDA
                self.unavailable["torch_matmul"] = f"torch unavailable: {e}"
        if any(n.startswith("cublas") for n in self.names):
            try:
                self._shim = Shim(shim if shim is not None else build_shim())
            except (ShimError, OSError) as e:
                for n in self.names:
                    if n.startswith("cublas"):
                        self.unavailable[n] = str(e)

    @staticmethod
    def c_transposed(name: str) -> bool:
        """Whether the baseline writes C column-major."""
        return name == "cublas_tt"

    def runner(self, name: str, a, b, c, m: int, n: int, k: int, b_layout: str = "kn",
               *, stream: int = 0, flush=None, rank: int = 1) -> Runner:
        """A callable ``run(stream)`` enqueueing baseline ``name`` on A, B, C.

        ``a``, ``b``, ``c``: :class:`runtime.DeviceArray` (C shaped N x M for
        ``cublas_tt``). ``cublaslt_autotuned`` tunes here, on ``stream``, leaving the L2
        as ``flush`` (a :class:`probes.Flush`; None: no flush) says before each timed run;
        ``rank`` picks the tuner's fastest (1), second fastest (2), ... A process tunes a
        shape once: the protocol of the first call that needs it decides its candidates,
        which the measurement then times again under its own protocol.
        """
        if name in self.unavailable:
            raise ShimError(f"{name}: {self.unavailable[name]}")
        nk = b_layout == "nk"
        pa, pb, pc = a.ptr, b.ptr, c.ptr
        shim = self._shim
        if name == "torch_matmul":
            return self._torch_runner(a, b, c, nk)
        if name == "cublas":
            return lambda s: shim.cublas(0, pa, pb, pc, m, n, k, nk, s)
        if name == "cublas_tt":
            return lambda s: shim.cublas(1, pa, pb, pc, m, n, k, nk, s)
        if name == "cublaslt_heuristic":
            return lambda s: shim.cublaslt(0, pa, pb, pc, m, n, k, nk, s)
        if name == "cublaslt_autotuned":
            key = (m, n, k, nk)
            if key not in self.tuning:
                function, context = (flush.function, flush.context) if flush is not None else (0, 0)
                self.tuning[key] = shim.autotune(pa, pb, pc, m, n, k, nk, function, context,
                                                 AUTOTUNE_REPS, stream)
            return lambda s: shim.cublaslt(rank, pa, pb, pc, m, n, k, nk, s)
        raise ValueError(f"unknown baseline {name!r} (known: {', '.join(BASELINES)})")

    def finalists(self, m: int, n: int, k: int, b_layout: str = "kn") -> int:
        """How many of the auto-tune's algorithms to time with the candidates (its ranks
        1..this), once :meth:`runner` has tuned the shape; 0 before."""
        tuned = self.tuning.get((m, n, k, b_layout == "nk"))
        return min(AUTOTUNE_FINALISTS, tuned[0]) if tuned else 0

    def _torch_runner(self, a, b, c, nk: bool) -> Runner:
        torch = self._torch
        ta = torch.as_tensor(a, device="cuda")
        tb = torch.as_tensor(b, device="cuda")
        tc = torch.as_tensor(c, device="cuda")
        rhs = tb.T if nk else tb

        def run(s: int) -> None:
            ext = self._streams.get(s)
            if ext is None:
                ext = self._streams[s] = torch.cuda.ExternalStream(s)
            with torch.cuda.stream(ext):
                torch.matmul(ta, rhs, out=tc)

        return run
