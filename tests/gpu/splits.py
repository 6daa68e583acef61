"""Helpers of the GPU tests of split-K kernels (l2gen's sm90a kernel, the sm80 family): a zeroed
workspace grown on demand and checked for being left zeroed, and the nodes one captured call
makes in a CUDA graph."""

from __future__ import annotations

import numpy as np


class Workspace:
    """A zeroed workspace for a library's launches, grown (and zeroed) on demand."""

    def __init__(self):
        self.buffer = None

    def get(self, lib, m, n, k, knobs):
        from l2gen.runtime import DeviceBuffer

        need = lib.workspace_size(m, n, k, knobs)
        if need and (self.buffer is None or self.buffer.nbytes < need):
            if self.buffer is not None:
                self.buffer.free()
            self.buffer = DeviceBuffer(need)
            self.buffer.fill_bytes(0)
        return (self.buffer, need) if need else (None, 0)

    def is_zero(self) -> bool:
        return self.buffer is None or not np.any(self.buffer.download((self.buffer.nbytes,), np.uint8))


def graph_node_kinds(lib, b_layout: str, knobs, m: int = 64, n: int = 1024, k: int = 4096) -> list:
    """The kinds of the nodes that one call of ``lib`` makes when captured into a CUDA graph
    (a first call, outside the capture, does any one-time set-up)."""
    from cuda.bindings import runtime as cudart

    from l2gen.runtime import DeviceBuffer, Stream, call

    ldb = n if b_layout == "kn" else k
    buffers = [DeviceBuffer(2 * x) for x in (m * k, n * k, m * n)]
    ws = Workspace()
    buf, nbytes = ws.get(lib, m, n, k, knobs)
    try:
        with Stream() as stream:
            lib.launch(*buffers, m, n, k, k, ldb, n, knobs, buf, nbytes, stream)
            stream.synchronize()
            call("cudaStreamBeginCapture", stream.handle, cudart.cudaStreamCaptureMode.cudaStreamCaptureModeGlobal)
            lib.launch(*buffers, m, n, k, k, ldb, n, knobs, buf, nbytes, stream)
            graph = call("cudaStreamEndCapture", stream.handle)
            try:
                err, _, count = cudart.cudaGraphGetNodes(graph, 0)
                assert int(err) == 0
                err, nodes, count = cudart.cudaGraphGetNodes(graph, count)
                assert int(err) == 0
                return [cudart.cudaGraphNodeGetType(node)[1] for node in nodes]
            finally:
                call("cudaGraphDestroy", graph)
    finally:
        for b in buffers:
            b.free()
        if ws.buffer is not None:
            ws.buffer.free()
