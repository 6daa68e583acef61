"""Helpers of the GPU tests of split-K kernels (l2gen's sm90a kernel, the sm80 family): a zeroed
workspace grown on demand and checked for being left zeroed, a program verified under knob
settings on shapes through one such workspace, operands for many calls on one workspace, the
nodes one captured call makes in a CUDA graph, and the template macros the tests of l2gen's
kernel build with (``L2GEN_TEST_DEFINES``)."""

from __future__ import annotations

import os

import numpy as np


def defines_from_env() -> tuple[str, ...]:
    """The nvcc flags of ``L2GEN_TEST_DEFINES="MACRO=V ..."`` (A=1+B=1 defines both): the
    template macros l2gen's own programs are built with in the GPU tests, to check a build
    kept to compare, or one before it becomes the default."""
    from l2gen.lower import define_flags

    return tuple(f for spec in os.environ.get("L2GEN_TEST_DEFINES", "").split() for f in define_flags(spec))


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


def ldb_of(b_layout: str, n: int, k: int) -> int:
    return n if b_layout == "kn" else k


def verify_program(name, program, lib, knob_settings, shapes, stream, device, skip=None) -> list[str]:
    """Verify ``lib`` (built from ``program``) under every knob setting on every shape, its
    launches sharing one workspace, which must be left zeroed; the failures, as lines.
    ``skip(knobs, k)``: a setting the entry refuses by contract on that K (tested apart)."""
    from l2gen.runtime import LaunchError
    from l2gen.verify import verify

    layout = program.b_layout.value
    failures = []
    ws = Workspace()
    for knobs in knob_settings:
        for m, n, k in shapes:
            if skip is not None and skip(knobs, k):
                continue
            buf, nbytes = ws.get(lib, m, n, k, knobs)

            def kernel(a, b, c, m=m, n=n, k=k, knobs=knobs, buf=buf, nbytes=nbytes):
                lib.launch(a, b, c, m, n, k, k, ldb_of(layout, n, k), n, knobs, buf, nbytes, stream)

            try:
                r = verify(kernel, m, n, k, b_layout=layout, seeds=2, device=device)
            except LaunchError as e:
                failures.append(f"{name} {knobs} {m}x{n}x{k}: {e}")
                continue
            if not r.ok:
                failures.append(f"{name} {knobs} {m}x{n}x{k}: {r.error}")
    if not ws.is_zero():
        failures.append(f"{name}: the workspace was left dirty")
    return failures


def kn_problems(device, shapes) -> dict:
    """Each shape's device operands (B stored K x N), output and fp64 reference."""
    from l2gen.verify import make_inputs, reference

    data = {}
    for m, n, k in shapes:
        a_host, b_host, _ = make_inputs(m, n, k, 1, "kn")
        a, b, c = device.alloc((m, k)), device.alloc((k, n)), device.alloc((m, n))
        device.write(a, a_host)
        device.write(b, b_host)
        data[(m, n, k)] = (a, b, c, reference(a_host, b_host, "kn"))
    return data


def call_relerr(lib, device, problem, shape, knobs, workspace, stream) -> float:
    """One call of ``lib`` on a :func:`kn_problems` problem, its output poisoned first and
    read back after: its relative error against the reference."""
    from l2gen.verify import relerr

    a, b, c, ref = problem
    m, n, k = shape
    device.poison(c)
    nbytes = lib.workspace_size(m, n, k, knobs)
    lib.launch(a, b, c, m, n, k, k, n, n, knobs, workspace.buffer if nbytes else None, nbytes, stream)
    stream.synchronize()
    return relerr(device.read(c), ref)


def graph_node_kinds(lib, b_layout: str, knobs, m: int = 64, n: int = 1024, k: int = 4096) -> list:
    """The kinds of the nodes that one call of ``lib`` makes when captured into a CUDA graph
    (a first call, outside the capture, does any one-time set-up)."""
    from cuda.bindings import runtime as cudart

    from l2gen.runtime import DeviceBuffer, Stream, call

    ldb = ldb_of(b_layout, n, k)
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
