"""Floors: the worker's "probe" task, which measures what bounds a GEMM in this run.

Three figures (:class:`l2gen.protocol.Floors`), in the worker process that times the
candidates, before them: the launch floor (an empty kernel, timed under the task's protocol
and mode exactly as the candidates will be), the stream rate (a read pass over
:data:`l2gen.probes.STREAM_BYTES`) and the fp16 peak (cublasGemmEx on :data:`PEAK_SHAPE`
with random inputs), the last two in events mode under the task's L2 protocol. The bench
turns them into each row's ``floor_pct``.
"""

from __future__ import annotations

from .protocol import DEFAULT_L2, Protocol
from .session import device_record, session, time_mode
from .timing import MIN_REPS
from .worker import Note

PEAK_SHAPE = (8192, 8192, 8192)  # the cuBLAS GEMM the peak is measured on


def probe(task: dict, note: Note) -> dict:
    """The "probe" task (see the module docstring). A figure that cannot be had is None,
    with ``<figure>_error`` saying why; the task itself fails only if the device does."""
    from .baselines import ShimError
    from .probes import STREAM_BYTES, ReadPass
    from .runtime import CudaError
    from .timing import time_interleaved

    note({"phase": "setup"})
    protocol = Protocol.of(task, missing_l2=DEFAULT_L2)
    s = session(task.get("probes"))
    flush, h = s.flush(protocol.l2), s.stream.handle
    reps, warmup = max(MIN_REPS, int(task.get("reps", MIN_REPS))), int(task.get("warmup", 5))
    out: dict = {"status": "ok", "error": None, "device": device_record(s), "protocol": protocol.to_dict()}

    note({"phase": "probe", "what": "launch floor"})
    timed, _, uncaptured = time_mode(protocol, {"empty": [s.probes.empty]}, h, flush, reps=reps,
                                     warmup=warmup, wall_check=False)
    if "empty" in timed:
        out["launch_floor_us"] = timed["empty"].median_us
        out["launch_source"] = f"measured: an empty kernel, {protocol.describe()}"
    else:
        out["launch_floor_us"], out["launch_error"] = None, uncaptured.get("empty", "not timed")

    note({"phase": "probe", "what": "stream rate"})
    events = Protocol("events", protocol.l2)
    read = ReadPass(s.probes, int(task.get("stream_bytes", STREAM_BYTES)))
    try:
        t = time_interleaved({"read": read}, h, flush, reps=MIN_REPS, warmup=2, wall_check=False)["read"].median_us
    finally:
        read.free()
    out["stream_tbs"] = read.nbytes / (t * 1e6)
    out["stream_source"] = f"measured: a {read.nbytes / 2**20:.0f} MiB read pass, {events.describe()}"

    note({"phase": "probe", "what": "peak"})
    out["peak_tflops"] = None
    bl = s.baselines(task.get("shim"))
    if "cublas" in bl.unavailable:
        out["peak_error"] = f"no cuBLAS: {bl.unavailable['cublas']}"
        return out
    m, n, k = (int(x) for x in task.get("peak_shape", PEAK_SHAPE))
    owned = [s.device.alloc(shape) for shape in ((m, k), (k, n), (m, n))]
    try:
        for i, array in enumerate(owned[:2]):
            _fill_random(array.buffer, seed=i)
        try:
            run = bl.runner("cublas", *owned, m, n, k, "kn", stream=h)
            t = time_interleaved({"gemm": run}, h, flush, reps=MIN_REPS, warmup=3, wall_check=False)["gemm"].median_us
        except CudaError:
            raise
        except ShimError as e:
            out["peak_error"] = str(e)
            return out
    finally:
        for array in owned:
            array.buffer.free()
    out["peak_tflops"] = 2.0 * m * n * k / (t * 1e6)
    out["peak_source"] = f"measured: cublasGemmEx {m}x{n}x{k}, {events.describe()}"
    return out


def _fill_random(buffer, seed: int, chunk: int = 2**20) -> None:
    """Random normal fp16 all over a buffer: one uploaded chunk, doubled by device copies
    (real values draw real power; zeros would not)."""
    import numpy as np

    from . import runtime

    rng = np.random.default_rng(seed)
    first = min(chunk, buffer.nbytes) // 2
    buffer.upload(rng.standard_normal(first, dtype=np.float32).astype(np.float16))
    done = 2 * first
    kind = runtime.cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice
    while done < buffer.nbytes:
        size = min(done, buffer.nbytes - done)
        runtime.call("cudaMemcpy", buffer.ptr + done, buffer.ptr, size, kind)
        done += size
