"""The dispatcher from 4 threads on 4 CUDA streams at once, over split-K winners (l2gen's
atomic split-K, whose workspace each call must find zeroed and leave zeroed; CUTLASS's
split-K stream-K; the sm80 parallel split-K): every output is checked against an fp32
reference, and each stream got a workspace of its own. Needs nvcc, CUTLASS headers, torch
and a CUDA GPU; skips cleanly without them.

Run on a GPU machine: ``python -m pytest tests/gpu/test_dispatch_streams.py -m gpu -v``.
"""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")

from l2gen.check import is_valid  # noqa: E402
from l2gen.db import KernelDB  # noqa: E402
from l2gen.dispatch import Dispatcher, TorchLauncher, own_toolchain  # noqa: E402
from l2gen.ir import Family, SplitK  # noqa: E402
from l2gen.parse import parse  # noqa: E402
from l2gen.problem import Measurement, Shape  # noqa: E402
from l2gen.space import assemble  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="torch has no CUDA device"),
]

MAX_RELERR = 1e-3
THREADS = 4
CALLS = 12  # per thread and shape, enqueued back to back before the thread synchronizes

L2GEN_ATOMIC = """
kernel l2gen_atomic_{name} {{
    arch    sm90a
    impl    l2gen
    b       kn
    tile    {tile}
    swap_ab {swap}
    stages  4
    split_k atomic
    hints   none
    raster  heuristic
    swizzle 0
    splits  {splits}
}}
"""


def split_k_winners(gpu) -> list[tuple[Shape, object]]:
    """(shape, program) pairs: split-K programs, each a pretend winner on its own shape."""
    out = [(Shape(96, 1024, 4096), assemble(Family.SM80, dict(bm=64, bn=64, bk=64, warps=(2, 2), stages=4, split_k=SplitK.PARALLEL, splits=4)))]
    if gpu.sm >= 90:
        out += [
            (Shape(64, 2048, 8192), parse(L2GEN_ATOMIC.format(name="swap", tile="64 x 128 x 128", swap="on", splits=4))),
            (Shape(200, 1024, 6144), parse(L2GEN_ATOMIC.format(name="noswap", tile="128 x 128 x 64", swap="off", splits=3))),
            (Shape(128, 2048, 4096), assemble(Family.SM90, dict(bm=128, bn=256, bk=64, mainloop="cooperative", scheduler="stream_k",
                                                                 splits=4, decomposition="split_k"))),
        ]
    return [(s, p) for s, p in out if is_valid(p, gpu)]


def relerr(c, ref):
    return float((c.float() - ref).norm() / ref.norm().clamp_min(1e-30))


def test_four_threads_on_four_streams_over_split_k_winners(gpu, tmp_path):
    winners = split_k_winners(gpu)
    assert winners, "no split-K program is valid on this GPU"
    with KernelDB(tmp_path / "k.db") as db:
        for shape, program in winners:
            db.add(Measurement(shape, program, "ok", time_us=1.0, baseline_us=2.0, relerr=0.0), gpu, "test", own_toolchain())
        d = Dispatcher(db, gpu, launcher=TorchLauncher(), verify=False)  # no safety net: every output is checked here
        for shape, _ in winners:  # build and load on the main thread: the test is about the calls
            a = torch.randn((shape.m, shape.k), device="cuda", dtype=torch.float16)
            b = torch.randn((shape.k, shape.n), device="cuda", dtype=torch.float16)
            d(a, b)
            torch.cuda.synchronize()
            assert d.served_by(shape.m, shape.n, shape.k) not in ("fallback", "unprepared"), f"{shape} not served"

        streams = [torch.cuda.Stream() for _ in range(THREADS)]
        failures: list[str] = []
        start = threading.Barrier(THREADS)

        def work(t: int) -> None:
            try:
                g = torch.Generator(device="cuda").manual_seed(1000 + t)
                with torch.cuda.stream(streams[t]):
                    inputs, outputs = [], []
                    for shape, _ in winners:
                        for _ in range(CALLS):
                            a = torch.randn((shape.m, shape.k), device="cuda", dtype=torch.float16, generator=g)
                            b = torch.randn((shape.k, shape.n), device="cuda", dtype=torch.float16, generator=g)
                            inputs.append((shape, a, b))
                            outputs.append(torch.full((shape.m, shape.n), float("nan"), device="cuda", dtype=torch.float16))
                    streams[t].synchronize()
                    start.wait(timeout=300)  # every thread enqueues its calls at the same time
                    for (shape, a, b), out in zip(inputs, outputs):
                        d(a, b, out)
                    streams[t].synchronize()
                    for i, ((shape, a, b), out) in enumerate(zip(inputs, outputs)):
                        err = relerr(out, a.float() @ b.float())
                        if not err < MAX_RELERR:  # NaN fails too
                            failures.append(f"thread {t}, call {i}, {shape}: relative error {err:.2e}")
            except Exception as exc:  # reported below, with the thread
                failures.append(f"thread {t}: {exc!r}")

        threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not failures, "\n".join(failures[:20])
        for shape, program in winners:
            state = d._shapes[(shape.m, shape.n, shape.k)]
            # the main thread's stream, and one for each worker thread's
            assert len(state.workspaces) == THREADS + 1, f"{program.name}: {len(state.workspaces)} workspaces"
            assert d.served_by(shape.m, shape.n, shape.k) == program.name
