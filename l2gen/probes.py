"""Probes: the device side of the timing protocols (``templates/probes.cu``), through ctypes.

**The clean flush.** Before each timed run the L2 must hold clean lines of other data, as it
does for a model layer whose predecessor read its own weights. The flush is a read pass over
a buffer of at least 4x the L2 (:func:`flush_bytes`: 256 MiB on the H200, whose L2 is 50 MB),
on the timed stream, by a small kernel: 16-byte vector loads, grid-stride, four loads in
flight per thread, the loaded values folded by XOR into one word that is stored only if it
equals a value the buffer cannot fold to (the buffer holds one byte value, so every vector
folds to 0), which the compiler cannot know, so no load is dropped. Reading 4x the L2
evicts everything in it: the lines the previous timed run wrote are written back *during
this pass*, and what is left is clean lines of the flush buffer, none of the next run's
operands. Why a read pass rather than rotating input copies: it costs one buffer per
process whatever the shape, keeps each shape's inputs at fixed addresses (the rounds
already move them), and is the same code for the candidates, the baselines and the
cuBLASLt auto-tuner (the shim calls it through a function pointer).

The *written* flush (``dirty``: cudaMemsetAsync of the same size, a new byte each time, as
l2gen used before) and ``warm`` (none) go through the same context, so all three are one
call from Python and from C (:class:`Flush`).

**The launch floor** is the event time of an empty one-thread kernel; **the stream rate**
the time of a read pass over a large buffer (:data:`STREAM_BYTES`); both are timed by the
worker's "probe" task (:mod:`l2gen.measure`) under the run's own protocol.

The library is built from one .cu file, cached beside the kernel build cache
(:func:`l2gen.build.build_helper`), for sm_80 and sm_90 with PTX for later GPUs.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from .lower import TEMPLATE_DIR
from .protocol import check_l2

PROBES_SOURCE = TEMPLATE_DIR / "probes.cu"
PROBES_FLAGS = ("-std=c++17", "-O2", "-Xcompiler=-fPIC", "-shared",
                "-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90,code=[sm_90,compute_90]")
PROBES_VERSION = "1"  # bump when the build command changes
FLUSH_BYTES = 256 * 2**20  # the flush buffer's least size (and at least FLUSH_L2_MULTIPLE x the L2)
FLUSH_L2_MULTIPLE = 4
STREAM_BYTES = 2**30  # the stream rate's read: large enough that its first microseconds do not count
SINK_BYTES = 16
PROTOCOL_CODES = {"warm": 0, "dirty": 1, "clean": 2}  # L2GEN_PROBE_* in probes.cu
FILL_BYTE = 0  # what the read buffers hold (one byte value: every 16-byte vector folds to 0)


class ProbeError(RuntimeError):
    """The probes library could not be built, or a call into it failed."""


def flush_bytes(l2_bytes: int) -> int:
    """The flush buffer for an L2 of ``l2_bytes``: at least 4x the L2, and 256 MiB; a
    multiple of 16 bytes (the read kernel's vector)."""
    nbytes = max(FLUSH_BYTES, FLUSH_L2_MULTIPLE * int(l2_bytes))
    return -(-nbytes // 16) * 16


def probes_command(nvcc: Path | str, out: Path | str) -> list[str]:
    return [str(nvcc), *PROBES_FLAGS, str(PROBES_SOURCE), "-o", str(out)]


def build_probes(*, timeout: float = 600, force: bool = False) -> Path:
    """Build the probes library (or find it in the cache) and return its path; raises
    :class:`ProbeError` with the command and nvcc's output."""
    from .build import HelperBuildError, build_helper
    from .toolchain import ToolchainError, find_nvcc

    try:
        nvcc = find_nvcc()
    except ToolchainError as e:
        raise ProbeError(str(e)) from None
    try:
        return build_helper("the timing probes", "probes", "probes", PROBES_SOURCE,
                            lambda out: probes_command(nvcc, out), version=PROBES_VERSION,
                            timeout=timeout, force=force)
    except HelperBuildError as e:
        raise ProbeError(str(e)) from None


_vp, _int, _size = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t


class Probes:
    """ctypes bindings of the probes' C ABI; every call checks its return code."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self._dll = d = ctypes.CDLL(str(path), mode=os.RTLD_NOW | os.RTLD_LOCAL)
        d.l2gen_probe_read.argtypes, d.l2gen_probe_read.restype = [_vp, _size, _vp, _vp], _int
        d.l2gen_probe_empty.argtypes, d.l2gen_probe_empty.restype = [_vp], _int
        d.l2gen_probe_flush_create.argtypes = [_int, _vp, _size, _vp]
        d.l2gen_probe_flush_create.restype = _vp
        d.l2gen_probe_flush_destroy.argtypes, d.l2gen_probe_flush_destroy.restype = [_vp], None
        d.l2gen_probe_flush.argtypes, d.l2gen_probe_flush.restype = [_vp, _vp], _int
        d.l2gen_probe_empty_grid.argtypes = [_int, _int, _int, _int, _vp]
        d.l2gen_probe_empty_grid.restype = _int
        d.l2gen_probe_max_active_clusters.argtypes = [_int, _int, _int, ctypes.POINTER(_int)]
        d.l2gen_probe_max_active_clusters.restype = _int
        d.l2gen_probe_error_string.argtypes = [_int]
        d.l2gen_probe_error_string.restype = ctypes.c_char_p
        # The flush as a C function pointer, for the cuBLAS shim's auto-tuner.
        self.flush_function = ctypes.cast(d.l2gen_probe_flush, _vp).value

    def _check(self, code: int, what: str) -> None:
        if code:
            raw = self._dll.l2gen_probe_error_string(code)
            raise ProbeError(f"{what} failed: {raw.decode() if raw else ''} (code {code})")

    def read(self, buffer: int, nbytes: int, sink: int, stream: int) -> None:
        """Enqueue a read pass over ``nbytes`` at ``buffer`` on ``stream``."""
        self._check(self._dll.l2gen_probe_read(buffer, nbytes, sink, stream or None), "l2gen_probe_read")

    def empty(self, stream: int) -> None:
        """Enqueue the empty kernel on ``stream``."""
        self._check(self._dll.l2gen_probe_empty(stream or None), "l2gen_probe_empty")

    def empty_grid(self, blocks: int, cluster: int, threads: int, smem_bytes: int, stream: int) -> None:
        """Enqueue an empty kernel launched like a GEMM: ``blocks`` CTAs in clusters of
        ``cluster``, ``threads`` threads and ``smem_bytes`` of dynamic shared memory each."""
        self._check(self._dll.l2gen_probe_empty_grid(blocks, cluster, threads, smem_bytes, stream or None),
                    f"l2gen_probe_empty_grid({blocks}, {cluster}, {threads}, {smem_bytes})")

    def max_active_clusters(self, cluster: int, threads: int, smem_bytes: int) -> int:
        """How many clusters of ``cluster`` CTAs (``threads`` threads and ``smem_bytes`` of
        dynamic shared memory each) the current device holds at once. A cluster's CTAs
        share a GPC, so this may be fewer than the SMs divided by the cluster's CTAs: a
        one-wave launch of more clusters than this runs in two."""
        out = _int(0)
        self._check(self._dll.l2gen_probe_max_active_clusters(cluster, threads, smem_bytes, ctypes.byref(out)),
                    f"l2gen_probe_max_active_clusters({cluster}, {threads}, {smem_bytes})")
        return out.value

    def flush_context(self, l2: str, buffer: int, nbytes: int, sink: int) -> int:
        ctx = self._dll.l2gen_probe_flush_create(PROTOCOL_CODES[check_l2(l2)], buffer or None, nbytes, sink or None)
        if not ctx:
            raise ProbeError(f"l2gen_probe_flush_create({l2!r}, {nbytes} bytes): bad argument")
        return int(ctx)

    def flush(self, context: int, stream: int) -> None:
        self._check(self._dll.l2gen_probe_flush(context, stream or None), "l2gen_probe_flush")

    def destroy_context(self, context: int) -> None:
        self._dll.l2gen_probe_flush_destroy(context)


class Flush:
    """Leaves the L2 as an L2 protocol says, on the timed stream: ``flush(stream)``.

    ``clean``: a read pass over :func:`flush_bytes` of a buffer that is never written;
    ``dirty``: a memset of a buffer of that size; ``warm``: nothing. :attr:`function` and
    :attr:`context` are the same flush for C callers (the cuBLAS shim)."""

    def __init__(self, probes: Probes, l2: str, l2_bytes: int):
        from .runtime import DeviceBuffer

        self.l2 = check_l2(l2)
        self.nbytes = 0 if l2 == "warm" else flush_bytes(l2_bytes)
        self._probes = probes
        self._buffers = []
        ptr = sink = 0
        if self.nbytes:
            buffer, sink_buffer = DeviceBuffer(self.nbytes), DeviceBuffer(SINK_BYTES)
            self._buffers = [buffer, sink_buffer]
            buffer.fill_bytes(FILL_BYTE)
            ptr, sink = buffer.ptr, sink_buffer.ptr
        self.context = probes.flush_context(l2, ptr, self.nbytes, sink)
        self.function = probes.flush_function

    def __call__(self, stream: int) -> None:
        self._probes.flush(self.context, stream)

    def free(self) -> None:
        if self.context:
            context, self.context = self.context, 0
            self._probes.destroy_context(context)
        for buffer in self._buffers:
            buffer.free()
        self._buffers = []


class ReadPass:
    """A read pass over ``nbytes`` of its own buffer, as a runner ``run(stream)``: what the
    stream rate is timed on (and the GPU tests' 32 MiB read)."""

    def __init__(self, probes: Probes, nbytes: int):
        from .runtime import DeviceBuffer

        self.nbytes = -(-int(nbytes) // 16) * 16
        self._probes = probes
        self._buffer, self._sink = DeviceBuffer(self.nbytes), DeviceBuffer(SINK_BYTES)
        self._buffer.fill_bytes(FILL_BYTE)

    def __call__(self, stream: int) -> None:
        self._probes.read(self._buffer.ptr, self.nbytes, self._sink.ptr, stream)

    def free(self) -> None:
        self._buffer.free()
        self._sink.free()
