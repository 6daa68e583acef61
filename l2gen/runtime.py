"""Run: load a built kernel library and drive the device through cuda-python.

Two halves, both thin:

* :class:`Library` binds the C ABI every generated library exports (``templates/
  common.cuh.j2``): ``E``, ``E_workspace`` and ``E_program``. A library is loaded once per
  path and process.
* Device helpers on the CUDA runtime (``cuda.bindings.runtime``): :class:`DeviceBuffer`,
  :class:`Stream`, :class:`Event`, copies and fills. Every runtime call goes through
  :func:`call`, which raises :class:`CudaError` naming the call that failed.

Pointers and streams may be given as plain integers, as the records here, or, where torch
is installed, as torch tensors (``data_ptr()``) and ``torch.cuda.Stream`` objects; with a
tensor operand and no stream, the launch goes on torch's current stream.
"""

from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .ir import Knobs

try:  # cuda-python: importable without a GPU or a driver; every call then fails cleanly
    from cuda.bindings import runtime as cudart
except ImportError:  # pragma: no cover - cuda-python is a declared dependency
    cudart = None


# ---- errors ---------------------------------------------------------------------------


class CudaError(RuntimeError):
    """A CUDA runtime call failed; ``call`` names it, ``code`` is the cudaError_t value."""

    def __init__(self, call_name: str, code: int, name: str, message: str = ""):
        self.call = call_name
        self.code = code
        self.name = name
        super().__init__(f"{call_name} failed: {name} ({code}){': ' + message if message else ''}")


# Return codes of a generated entry point (templates/common.cuh.j2).
STATUS_NAMES = {
    0: "L2GEN_OK",
    1: "L2GEN_ERR_PROBLEM",
    2: "L2GEN_ERR_WORKSPACE",
    3: "L2GEN_ERR_LAUNCH",
    4: "L2GEN_ERR_KNOB",
}
ERR_KNOB = 4
STATUS_MEANINGS = {
    1: "M, N, K, leading dimensions or alignment not served",
    2: "workspace missing or smaller than E_workspace() asked for",
    3: "the CUDA launch failed",
    4: "a run-time knob outside what this binary serves",
}


class LaunchError(RuntimeError):
    """A generated entry point returned a non-zero status."""

    def __init__(self, entry: str, status: int):
        self.entry = entry
        self.status = status
        self.status_name = STATUS_NAMES.get(status, f"unknown status {status}")
        meaning = STATUS_MEANINGS.get(status, "")
        super().__init__(f"{entry} returned {self.status_name}{': ' + meaning if meaning else ''}")


def _error_name(err) -> tuple[int, str, str]:
    code = int(err)
    name, message = f"cudaError {code}", ""
    if cudart is not None:
        try:
            ok, raw = cudart.cudaGetErrorName(err)
            if int(ok) == 0:
                name = raw.decode() if isinstance(raw, bytes) else str(raw)
            ok, raw = cudart.cudaGetErrorString(err)
            if int(ok) == 0:
                message = raw.decode() if isinstance(raw, bytes) else str(raw)
        except Exception:  # naming an error must never hide it
            pass
    return code, name, message


def _check(result, call_name: str):
    """Unpack a cuda-python result tuple ``(err, *values)``; raise CudaError unless success.

    Returns None, the single value, or a tuple of values.
    """
    if isinstance(result, tuple):
        err, values = result[0], result[1:]
    else:
        err, values = result, ()
    if int(err) != 0:
        code, name, message = _error_name(err)
        raise CudaError(call_name, code, name, message)
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def call(name: str, *args):
    """Call ``cudart.<name>(*args)`` and check it (see :func:`_check`)."""
    if cudart is None:
        raise CudaError(name, -1, "cuda-python missing", "pip install cuda-python")
    return _check(getattr(cudart, name)(*args), name)


def device_count() -> int:
    """Number of visible CUDA devices; 0 when there is no driver, no device or no cuda-python."""
    try:
        return int(call("cudaGetDeviceCount"))
    except Exception:
        return 0


@dataclass(frozen=True)
class DeviceInfo:
    name: str
    sm: int  # compute capability as an integer, e.g. 90
    sms: int
    l2_bytes: int


def device_info(device: int = 0) -> DeviceInfo:
    attr = cudart.cudaDeviceAttr

    def get(a) -> int:
        return int(call("cudaDeviceGetAttribute", a, device))

    try:
        raw = call("cudaGetDeviceProperties", device).name
        name = raw.split(b"\0")[0].decode() if isinstance(raw, bytes) else str(raw)
    except Exception:  # the name is only for reports
        name = f"CUDA device {device}"
    return DeviceInfo(
        name=name.strip(),
        sm=10 * get(attr.cudaDevAttrComputeCapabilityMajor)
        + get(attr.cudaDevAttrComputeCapabilityMinor),
        sms=get(attr.cudaDevAttrMultiProcessorCount),
        l2_bytes=get(attr.cudaDevAttrL2CacheSize),
    )


def synchronize() -> None:
    """Wait for all work on the device, on every stream (what the escape check needs)."""
    call("cudaDeviceSynchronize")


# ---- pointers and streams -------------------------------------------------------------


def _torch():
    """The torch module if it is already importable, else None (torch is optional)."""
    try:
        import torch
    except Exception:
        return None
    return torch


def pointer(x) -> int:
    """A device address from an int, a DeviceBuffer/DeviceArray, or a torch tensor."""
    if x is None:
        return 0
    if isinstance(x, int):
        return x
    if hasattr(x, "ptr"):
        return int(x.ptr)
    if hasattr(x, "data_ptr"):
        return int(x.data_ptr())
    raise TypeError(f"cannot take a device pointer from {type(x).__name__}")


def stream_handle(stream, *operands) -> int:
    """A cudaStream_t as an integer.

    Accepts an int, a :class:`Stream`, a cuda-python ``cudaStream_t``/``CUstream``, or a
    ``torch.cuda.Stream``. With no stream and a torch tensor among ``operands``, torch's
    current stream; otherwise the legacy default stream (0).
    """
    if stream is None:
        if any(hasattr(o, "data_ptr") for o in operands):
            torch = _torch()
            if torch is not None:
                return int(torch.cuda.current_stream().cuda_stream)
        return 0
    if isinstance(stream, int):
        return stream
    if isinstance(stream, Stream):
        return stream.handle
    if hasattr(stream, "cuda_stream"):  # torch.cuda.Stream / ExternalStream
        return int(stream.cuda_stream)
    return int(stream)  # cudaStream_t, CUstream


# ---- device memory, streams, events ---------------------------------------------------


class DeviceBuffer:
    """``nbytes`` of device memory (cudaMalloc), freed by :meth:`free` or on ``with`` exit."""

    def __init__(self, nbytes: int):
        self.nbytes = int(nbytes)
        self.ptr = int(call("cudaMalloc", max(self.nbytes, 1)))

    def free(self) -> None:
        if self.ptr:
            ptr, self.ptr = self.ptr, 0
            call("cudaFree", ptr)

    def __enter__(self) -> "DeviceBuffer":
        return self

    def __exit__(self, *exc) -> None:
        self.free()

    def __del__(self):  # a safety net only; owners free explicitly
        if getattr(self, "ptr", 0):
            try:
                self.free()
            except Exception:
                pass

    def _fits(self, nbytes: int) -> None:
        if nbytes > self.nbytes:
            raise ValueError(f"{nbytes} bytes do not fit a buffer of {self.nbytes}")

    def upload(self, array: np.ndarray, stream=None) -> None:
        """Copy a host array into the start of the buffer (synchronous unless ``stream``)."""
        array = np.ascontiguousarray(array)
        self._fits(array.nbytes)
        kind = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        if stream is None:
            call("cudaMemcpy", self.ptr, array.ctypes.data, array.nbytes, kind)
        else:
            call("cudaMemcpyAsync", self.ptr, array.ctypes.data, array.nbytes, kind,
                 stream_handle(stream))
            call("cudaStreamSynchronize", stream_handle(stream))  # `array` may go away

    def download(self, shape, dtype=np.float16) -> np.ndarray:
        """Copy the start of the buffer into a new host array (synchronous)."""
        out = np.empty(shape, dtype=dtype)
        self._fits(out.nbytes)
        call("cudaMemcpy", out.ctypes.data, self.ptr, out.nbytes,
             cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost)
        return out

    def fill_bytes(self, value: int, nbytes: int | None = None, stream=None) -> None:
        """Set every byte to ``value`` (cudaMemset, or cudaMemsetAsync on ``stream``)."""
        nbytes = self.nbytes if nbytes is None else nbytes
        self._fits(nbytes)
        if stream is None:
            call("cudaMemset", self.ptr, value & 0xFF, nbytes)
        else:
            call("cudaMemsetAsync", self.ptr, value & 0xFF, nbytes, stream_handle(stream))

    def copy_from(self, other: "DeviceBuffer", nbytes: int | None = None) -> None:
        """Copy the start of another buffer into the start of this one (synchronous)."""
        nbytes = min(self.nbytes, other.nbytes) if nbytes is None else nbytes
        self._fits(nbytes)
        other._fits(nbytes)
        call("cudaMemcpy", self.ptr, other.ptr, nbytes, cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice)

    def array(self, shape, dtype=np.float16) -> "DeviceArray":
        return DeviceArray(self, tuple(int(s) for s in shape), np.dtype(dtype))


@dataclass(frozen=True)
class DeviceArray:
    """A typed view of a DeviceBuffer; torch can wrap it without a copy
    (``torch.as_tensor(view, device="cuda")``) through ``__cuda_array_interface__``."""

    buffer: DeviceBuffer
    shape: tuple
    dtype: np.dtype

    @property
    def ptr(self) -> int:
        return self.buffer.ptr

    @property
    def __cuda_array_interface__(self) -> dict:
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (self.buffer.ptr, False),
            "version": 3,
            "strides": None,
            "stream": None,  # the caller orders the work; no implicit synchronization
        }


class Stream:
    """A non-blocking stream: it does not synchronize with the legacy default stream, so
    work a kernel puts on stream 0 is not counted in this stream's event times."""

    def __init__(self):
        raw = call("cudaStreamCreateWithFlags", cudart.cudaStreamNonBlocking)
        self.handle = int(raw)

    def synchronize(self) -> None:
        call("cudaStreamSynchronize", self.handle)

    def destroy(self) -> None:
        if self.handle:
            handle, self.handle = self.handle, 0
            call("cudaStreamDestroy", handle)

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc) -> None:
        self.destroy()

    def __int__(self) -> int:
        return self.handle


class Event:
    """A CUDA event with timing enabled."""

    def __init__(self):
        self.handle = int(call("cudaEventCreateWithFlags", cudart.cudaEventDefault))

    def record(self, stream) -> None:
        call("cudaEventRecord", self.handle, stream_handle(stream))

    def synchronize(self) -> None:
        call("cudaEventSynchronize", self.handle)

    def elapsed_ms(self, end: "Event") -> float:
        """Milliseconds from this event to ``end`` (both recorded and complete)."""
        return float(call("cudaEventElapsedTime", self.handle, end.handle))

    def destroy(self) -> None:
        if self.handle:
            handle, self.handle = self.handle, 0
            call("cudaEventDestroy", handle)


# ---- CUDA graphs ----------------------------------------------------------------------


class CaptureError(RuntimeError):
    """Work could not be captured into a CUDA graph (it allocated, synchronized, raised, ...)."""


class Graph:
    """An instantiated CUDA graph: :meth:`launch` replays it on a stream."""

    def __init__(self, graph, exec_):
        self._graph, self._exec = graph, exec_

    def launch(self, stream) -> None:
        call("cudaGraphLaunch", self._exec, stream_handle(stream))

    def destroy(self) -> None:
        graph, exec_, self._graph, self._exec = self._graph, self._exec, None, None
        if exec_ is not None:
            call("cudaGraphExecDestroy", exec_)
        if graph is not None:
            call("cudaGraphDestroy", graph)


def capture_graph(stream, enqueue) -> Graph:
    """Capture what ``enqueue(stream_handle)`` puts on ``stream`` into a graph and
    instantiate it. Thread-local capture: a call this thread makes that is unsafe while
    capturing (a synchronize, an allocation) fails the capture. Raises
    :class:`CaptureError` saying why; the stream is left not capturing either way."""
    h = stream_handle(stream)
    call("cudaStreamBeginCapture", h, cudart.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal)
    try:
        enqueue(h)
    except Exception as exc:
        _destroy_graph(_end_capture(h))
        raise CaptureError(f"{type(exc).__name__}: {exc}") from None
    graph = _end_capture(h)
    if graph is None:
        raise CaptureError("the capture was invalidated: something it ran is not allowed while a stream "
                           "is being captured (a synchronize, an allocation, work on the legacy stream)")
    try:
        exec_ = call("cudaGraphInstantiate", graph, 0)
    except CudaError as exc:
        _destroy_graph(graph)
        cudart.cudaGetLastError()
        raise CaptureError(f"the captured graph cannot be instantiated: {exc}") from None
    return Graph(graph, exec_)


def _end_capture(h: int):
    """End a capture on stream ``h``: the graph, or None if the capture had failed (its
    error is cleared, so that it does not surface in a later call)."""
    err, graph = cudart.cudaStreamEndCapture(h)
    if int(err) == 0 and graph is not None and int(graph):
        return graph
    _destroy_graph(graph)
    cudart.cudaGetLastError()
    return None


def _destroy_graph(graph) -> None:
    try:
        if graph is not None and int(graph):
            cudart.cudaGraphDestroy(graph)
    except Exception:  # tidying up after a failed capture must not hide why it failed
        pass


# ---- generated libraries --------------------------------------------------------------

_LIBRARIES: dict[tuple[str, str], "Library"] = {}
_LOCK = threading.Lock()

_c_int = ctypes.c_int
_ENTRY_ARGS = [
    ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,  # A, B, C
    _c_int, _c_int, _c_int,  # M, N, K
    _c_int, _c_int, _c_int,  # lda, ldb, ldc
    _c_int, _c_int, _c_int, _c_int, _c_int,  # raster, swizzle_log2, splits, decomposition, grid
    ctypes.c_void_p, ctypes.c_size_t,  # workspace, workspace_bytes
    ctypes.c_void_p,  # cudaStream_t
]
_WORKSPACE_ARGS = [_c_int] * 8
ABI_VERSION = 2  # templates/common.cuh.j2 L2GEN_ABI_VERSION: the arguments above


class Library:
    """A built kernel library: ``E``, ``E_workspace`` and ``E_program`` bound with ctypes.

    Use :meth:`load` (cached per path and entry) rather than the constructor.
    """

    def __init__(self, path: Path | str, entry: str):
        self.path = Path(path)
        self.entry = entry
        self._dll = ctypes.CDLL(str(self.path), mode=os.RTLD_NOW | os.RTLD_LOCAL)
        # Called with another argument list, an entry would read garbage: check first.
        abi = getattr(self._dll, f"{entry}_abi", None)
        if abi is not None:
            abi.argtypes, abi.restype = [], _c_int
        version = int(abi()) if abi is not None else 1
        if version != ABI_VERSION:
            raise ValueError(f"{self.path}: {entry} takes the arguments of l2gen's entry ABI {version}, this l2gen calls "
                             f"ABI {ABI_VERSION} (templates/common.cuh.j2): rebuild the library from its program")
        self._run = getattr(self._dll, entry)
        self._run.argtypes = _ENTRY_ARGS
        self._run.restype = _c_int
        # E_pdl, where the kernel takes the knob pdl (l2gen's own sm90a kernel): E's
        # arguments, launched with programmatic dependent launch.
        self._run_pdl = getattr(self._dll, f"{entry}_pdl", None)
        if self._run_pdl is not None:
            self._run_pdl.argtypes = _ENTRY_ARGS
            self._run_pdl.restype = _c_int
        self._workspace = getattr(self._dll, f"{entry}_workspace")
        self._workspace.argtypes = _WORKSPACE_ARGS
        self._workspace.restype = ctypes.c_size_t
        self._program = getattr(self._dll, f"{entry}_program")
        self._program.argtypes = []
        self._program.restype = ctypes.c_char_p

    @classmethod
    def load(cls, path: Path | str, entry: str) -> "Library":
        key = (str(Path(path).resolve()), entry)
        with _LOCK:
            lib = _LIBRARIES.get(key)
            if lib is None:
                lib = _LIBRARIES[key] = cls(key[0], entry)
            return lib

    def entry_for(self, knobs: Knobs):
        """The ctypes function a launch with these knobs calls, its argument types set
        (``_ENTRY_ARGS``): the entry ``E``, or ``E_pdl`` for ``pdl on`` (:class:`LaunchError`
        with L2GEN_ERR_KNOB where the library has none). For a caller that converts the
        arguments of many calls once (:meth:`constant_args`)."""
        if not knobs.pdl:
            return self._run
        if self._run_pdl is None:
            raise LaunchError(self.entry, ERR_KNOB)
        return self._run_pdl

    @staticmethod
    def constant_args(m: int, n: int, k: int, lda: int, ldb: int, ldc: int, knobs: Knobs = Knobs()) -> tuple:
        """The entry's arguments from M to the knobs (ABI order), as ctypes integers made once:
        ctypes passes them as they are, where it converts a Python int on every call.
        ``entry_for(knobs)(a, b, c, *constant_args(...), workspace, workspace_bytes, stream)``
        is :meth:`launch` without its conversions."""
        return tuple(ctypes.c_int(v) for v in (m, n, k, lda, ldb, ldc, *knobs.as_args()))

    def program_text(self) -> str:
        """The canonical DSL text the library was built from."""
        return self._program().decode()

    def workspace_size(self, m: int, n: int, k: int, knobs: Knobs = Knobs()) -> int:
        return int(self._workspace(m, n, k, *knobs.as_args()))

    def launch(self, a, b, c, m: int, n: int, k: int, lda: int, ldb: int, ldc: int,
               knobs: Knobs = Knobs(), workspace=None, ws_bytes: int = 0, stream=None,
               *, check: bool = True) -> int:
        """Enqueue ``C = A @ B`` on ``stream``; returns the entry's status (0 = L2GEN_OK).

        With ``check`` (the default) a non-zero status raises :class:`LaunchError`.
        """
        status = int(self.entry_for(knobs)(
            pointer(a), pointer(b), pointer(c), m, n, k, lda, ldb, ldc,
            *knobs.as_args(), pointer(workspace), ws_bytes,
            stream_handle(stream, a, b, c),
        ))
        if status and check:
            raise LaunchError(self.entry, status)
        return status
