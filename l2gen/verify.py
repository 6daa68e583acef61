"""Verify: does a kernel compute ``C = A @ B``? Fresh inputs, poisoned output, fp64 reference.

For each seed: new random normal fp16 inputs go into the *same* buffers (a kernel that
caches results by pointer is caught on the second seed), C is poisoned with NaN, the kernel
runs, the device is synchronized, and C is compared with a float64 reference:

* any NaN in C fails the check outright: some output was never written;
* otherwise ``relerr = ‖C − ref‖₂ / ‖ref‖₂`` (Frobenius norms) must be at most
  :data:`TOLERANCE`. cuBLAS lands near 2e-4 on these problems; above 1e-3 is wrong.

The reference runs in float64 with torch on the GPU over the whole of C where torch and a
GPU are present; otherwise with numpy on the host over a sample of rows: all rows when
``M <= SAMPLE_ROWS``, else :data:`SAMPLE_ROWS` distinct rows drawn at random (from the
seed's generator, so a kernel cannot know them), and relerr is taken over those rows of C
and of the reference. The NaN check always covers the whole of C.

The device is a small protocol (:class:`HostDevice`, :class:`CudaDevice`), so the whole
procedure runs in CI with numpy standing in for the GPU and for the kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Protocol

import numpy as np

TOLERANCE = 1e-3  # relative Frobenius error above which a kernel is wrong
DEFAULT_SEEDS = 3
SAMPLE_ROWS = 256  # rows the host (numpy) reference computes for a large M
POISON_BYTE = 0x7E  # every byte 0x7E: each fp16 element reads 0x7E7E, a quiet NaN


# ---- inputs and reference (pure numpy) ------------------------------------------------


def b_shape(n: int, k: int, b_layout: str) -> tuple[int, int]:
    """Shape of operand B: K x N for layout "kn", N x K for "nk"."""
    if b_layout not in ("kn", "nk"):
        raise ValueError(f"unknown B layout {b_layout!r}")
    return (k, n) if b_layout == "kn" else (n, k)


@lru_cache(maxsize=DEFAULT_SEEDS)
def make_inputs(m: int, n: int, k: int, seed: int, b_layout: str = "kn"):
    """Random normal fp16 A (M x K) and B (see :func:`b_shape`), and the seed's generator
    state after drawing them (for row sampling). Cached: one entry per seed in use."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k), dtype=np.float32).astype(np.float16)
    b = rng.standard_normal(b_shape(n, k, b_layout), dtype=np.float32).astype(np.float16)
    a.setflags(write=False)
    b.setflags(write=False)
    return a, b, rng.bit_generator.state


def sample_rows(m: int, rng: np.random.Generator, limit: int = SAMPLE_ROWS) -> np.ndarray:
    """All row indices when ``m <= limit``, else ``limit`` distinct random ones, sorted."""
    if m <= limit:
        return np.arange(m)
    return np.sort(rng.choice(m, size=limit, replace=False))


def reference(a: np.ndarray, b: np.ndarray, b_layout: str = "kn", rows=None) -> np.ndarray:
    """``A[rows] @ B`` (or ``A[rows] @ B.T`` for "nk") in float64."""
    a64 = (a if rows is None else a[rows]).astype(np.float64)
    b64 = b.astype(np.float64)
    return a64 @ (b64 if b_layout == "kn" else b64.T)


def relerr(c: np.ndarray, ref: np.ndarray) -> float:
    """‖C − ref‖ / ‖ref‖ in float64 (‖C‖ when ref is zero); inf if C is not finite."""
    c64 = np.asarray(c, dtype=np.float64)
    if not np.all(np.isfinite(c64)):
        return float("inf")
    den = float(np.linalg.norm(ref))
    num = float(np.linalg.norm(c64 - ref))
    return num / den if den else num


def nan_count(c: np.ndarray) -> int:
    return int(np.count_nonzero(np.isnan(c)))


# ---- devices --------------------------------------------------------------------------


class Device(Protocol):
    """Where the operands live. Handles are opaque to :func:`verify`; the kernel gets them."""

    def alloc(self, shape: tuple[int, int]) -> Any: ...
    def write(self, handle: Any, array: np.ndarray) -> None: ...
    def poison(self, handle: Any) -> None: ...
    def synchronize(self) -> None: ...
    def read(self, handle: Any) -> np.ndarray: ...
    def free(self, handle: Any) -> None: ...


class HostDevice:
    """numpy arrays stand in for device memory (CI, tests: the "kernel" is numpy too)."""

    def alloc(self, shape):
        return np.zeros(shape, dtype=np.float16)

    def write(self, handle, array):
        handle[...] = array

    def poison(self, handle):
        handle.view(np.uint8)[...] = POISON_BYTE

    def synchronize(self):
        pass

    def read(self, handle):
        return handle.copy()

    def free(self, handle):
        pass


class CudaDevice:
    """Device memory through l2gen.runtime; handles are :class:`runtime.DeviceArray`."""

    def alloc(self, shape):
        from .runtime import DeviceBuffer

        return DeviceBuffer(2 * shape[0] * shape[1]).array(shape)

    def write(self, handle, array):
        if array.shape != handle.shape:
            raise ValueError(f"writing {array.shape} into a {handle.shape} buffer")
        handle.buffer.upload(np.ascontiguousarray(array, dtype=np.float16))

    def poison(self, handle):
        handle.buffer.fill_bytes(POISON_BYTE)

    def synchronize(self):
        from .runtime import synchronize

        synchronize()  # device-wide: work a kernel put on another stream counts here

    def read(self, handle):
        return handle.buffer.download(handle.shape)

    def free(self, handle):
        handle.buffer.free()


# ---- comparison backends --------------------------------------------------------------


class NumpyReference:
    """Host float64 reference over a sample of rows (see the module docstring)."""

    name = "numpy"

    def __init__(self, sample_limit: int = SAMPLE_ROWS):
        self.sample_limit = sample_limit

    def compare(self, device, c_handle, a, b, b_layout, rng, c_transposed) -> tuple[float, int]:
        c = device.read(c_handle)
        if c_transposed:
            c = c.T
        nans = nan_count(c)
        if nans:
            return float("inf"), nans
        rows = sample_rows(a.shape[0], rng, self.sample_limit)
        return relerr(c[rows], reference(a, b, b_layout, rows)), 0


class TorchReference:
    """Full float64 reference with torch on the GPU; C is read in place, without a copy."""

    name = "torch"

    def __init__(self, keep: int = DEFAULT_SEEDS):
        import torch

        self.torch = torch
        self.keep = keep  # references kept on the GPU: one per seed in use
        self._refs: list[tuple[np.ndarray, np.ndarray, str, Any]] = []

    def _reference(self, a, b, b_layout):
        for ca, cb, cl, ref in self._refs:  # make_inputs caches arrays: same seed, same objects
            if a is ca and b is cb and b_layout == cl:
                return ref
        torch = self.torch
        del self._refs[: max(0, len(self._refs) - self.keep + 1)]
        a64 = torch.tensor(a, device="cuda").double()  # copies: inputs are read-only
        b64 = torch.tensor(b, device="cuda").double()
        ref = a64 @ (b64 if b_layout == "kn" else b64.T)
        self._refs.append((a, b, b_layout, ref))
        return ref

    def compare(self, device, c_handle, a, b, b_layout, rng, c_transposed) -> tuple[float, int]:
        torch = self.torch
        ref = self._reference(a, b, b_layout)
        c = torch.as_tensor(c_handle, device="cuda")
        if c_transposed:
            c = c.T
        nans = int(torch.isnan(c).sum().item())
        if nans:
            return float("inf"), nans
        c64 = c.double()
        if not bool(torch.isfinite(c64).all()):
            return float("inf"), 0
        den = float(torch.linalg.vector_norm(ref))
        num = float(torch.linalg.vector_norm(c64 - ref))
        return (num / den if den else num), 0


def default_reference(device) -> NumpyReference | TorchReference:
    """Torch on the GPU for a CUDA device when torch sees one, else numpy (sampled rows)."""
    if isinstance(device, CudaDevice):
        try:
            import torch

            if torch.cuda.is_available():
                return TorchReference()
        except Exception:
            pass
    return NumpyReference()


# ---- the check ------------------------------------------------------------------------


@dataclass(frozen=True)
class VerifyResult:
    ok: bool
    relerr: float | None  # worst over the seeds run; None if the kernel never ran
    error: str | None = None
    seeds: int = 0  # seeds that ran
    reference: str = ""


Kernel = Callable[[Any, Any, Any], None]  # kernel(a, b, c) enqueues C = A @ B


def verify(
    kernel: Kernel,
    m: int,
    n: int,
    k: int,
    *,
    b_layout: str = "kn",
    seeds: int = DEFAULT_SEEDS,
    device: Device | None = None,
    reference: NumpyReference | TorchReference | None = None,
    buffers: tuple[Any, Any, Any] | None = None,
    c_transposed: bool = False,
    tolerance: float = TOLERANCE,
) -> VerifyResult:
    """Run ``kernel`` on ``seeds`` fresh input sets and check each output (module docstring).

    ``buffers`` = (a, b, c) handles to reuse (else allocated on ``device`` and freed after);
    ``c_transposed``: the kernel writes C column-major (an N x M row-major buffer). An
    exception from the kernel propagates: whether it is a wrong answer or a crash is the
    caller's call.
    """
    device = device or HostDevice()
    reference = reference or default_reference(device)
    own = buffers is None
    if own:
        c_shape = (n, m) if c_transposed else (m, n)
        buffers = (device.alloc((m, k)), device.alloc(b_shape(n, k, b_layout)), device.alloc(c_shape))
    a_h, b_h, c_h = buffers
    worst = 0.0
    try:
        for seed in range(seeds):
            a, b, state = make_inputs(m, n, k, seed, b_layout)
            rng = np.random.default_rng()
            rng.bit_generator.state = state
            device.write(a_h, a)
            device.write(b_h, b)
            device.poison(c_h)
            device.synchronize()  # a pageable cudaMemcpy may return before its DMA lands
            kernel(a_h, b_h, c_h)
            device.synchronize()
            err, nans = reference.compare(device, c_h, a, b, b_layout, rng, c_transposed)
            if nans:
                return VerifyResult(False, None, f"seed {seed}: {nans} of {m * n} outputs are "
                                    "NaN (poisoned output left unwritten)", seed + 1, reference.name)
            worst = max(worst, err)
            if not err <= tolerance:
                return VerifyResult(False, err, f"seed {seed}: relerr {err:.3g} > {tolerance:g}",
                                    seed + 1, reference.name)
    finally:
        if own:
            for h in buffers:
                device.free(h)
    return VerifyResult(True, worst, None, seeds, reference.name)
