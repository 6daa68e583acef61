"""Planted faults: tiny hand-written libraries with the l2gen ABI (tests/gpu/faults/*.cu),
compiled with nvcc here, each caught by the stage meant to catch it:

(a) skips part of K             -> verification: "wrong"
(b) works on a stream of its own -> the event-vs-wall check: "escaped" (verification passes)
(c) illegal address             -> "run_error", and the next task runs in a fresh worker
(d) infinite loop               -> "timeout", and the next task runs in a fresh worker

Run on a GPU machine: ``python -m pytest tests/gpu -m gpu -v``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from l2gen.runtime import device_count

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(device_count() == 0, reason="no CUDA device"),
]

FAULTS = Path(__file__).resolve().parent / "faults"
NAMES = ("good", "skip_k", "side_stream", "illegal_address", "hang")


def measure(worker, task: dict, timeout=None) -> dict:
    """The runner's measure of a task given in its wire form; the result in wire form too."""
    from l2gen.runner import measure as run_task
    from l2gen.tasks import MeasureTask

    return run_task(worker, MeasureTask.from_wire(task), timeout).to_wire()


@pytest.fixture(scope="module")
def libs(tmp_path_factory) -> dict[str, Path]:
    from l2gen.runtime import device_info
    from l2gen.toolchain import ToolchainError, find_nvcc

    try:
        nvcc = str(find_nvcc())
    except ToolchainError as e:
        pytest.skip(f"no nvcc: {e}")
    sm = device_info(0).sm
    out = tmp_path_factory.mktemp("faults")
    built = {}
    for name in NAMES:
        lib = out / f"{name}.so"
        cmd = [nvcc, "-std=c++17", "-O2", "-shared", "-Xcompiler=-fPIC", f"-arch=sm_{sm}",
               str(FAULTS / f"{name}.cu"), "-o", str(lib)]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, f"{' '.join(cmd)}\n{run.stdout}{run.stderr}"
        built[name] = lib
    return built


@pytest.fixture
def worker():
    from l2gen.worker import Worker

    w = Worker(timeout=120, first_task_grace=120)
    yield w
    w.close()


def cand(libs, name):
    return {"name": name, "library": str(libs[name]), "entry": f"l2gen_fault_{name}",
            "program_text": f"kernel {name} {{}}\n"}


def task(libs, *names, m=256, n=256, k=256, reps=30, **extra):
    return {"kind": "measure", "m": m, "n": n, "k": k, "b_layout": "kn",
            "candidates": [cand(libs, x) for x in names], "baselines": [], "seeds": 3,
            "reps": reps, **extra}


# ---- in process: the runtime's own helpers --------------------------------------------


def test_device_buffers_round_trip_and_errors():
    import numpy as np

    from l2gen.runtime import CudaError, DeviceBuffer, Event, Stream, call, synchronize

    x = np.arange(1000, dtype=np.float16)
    with DeviceBuffer(x.nbytes) as buf, Stream() as s:
        buf.upload(x)
        assert np.array_equal(buf.download(x.shape), x)
        buf.fill_bytes(0x7E, stream=s)
        s.synchronize()
        assert np.isnan(buf.download(x.shape)).all()
        start, end = Event(), Event()
        start.record(s)
        buf.fill_bytes(0, stream=s)
        end.record(s)
        end.synchronize()
        assert start.elapsed_ms(end) >= 0
        start.destroy()
        end.destroy()
    synchronize()
    with pytest.raises(CudaError) as info:
        call("cudaSetDevice", 9999)  # no such device (and not a sticky error)
    assert info.value.call == "cudaSetDevice" and info.value.name == "cudaErrorInvalidDevice"
    assert "cudaSetDevice failed" in str(info.value)
    call("cudaSetDevice", 0)


def test_library_binding_and_verify_in_process(libs):
    from l2gen.ir import Knobs
    from l2gen.runtime import LaunchError, Library, Stream
    from l2gen.verify import CudaDevice, verify

    lib = Library.load(libs["good"], "l2gen_fault_good")
    assert Library.load(libs["good"], "l2gen_fault_good") is lib
    assert lib.program_text() == "kernel good {}\n"
    assert lib.workspace_size(64, 64, 64, Knobs()) == 0
    with Stream() as s:
        def kernel(a, b, c, m=100, n=72, k=64):
            lib.launch(a, b, c, m, n, k, k, n, n, Knobs(), None, 0, s)

        r = verify(kernel, 100, 72, 64, device=CudaDevice())
        assert r.ok, r.error
        with pytest.raises(LaunchError) as info:
            lib.launch(0, 0, 0, 8, 8, 12, 12, 8, 8, Knobs(), None, 0, s)  # K % 8 != 0
        assert info.value.status_name == "L2GEN_ERR_PROBLEM"


# ---- in the worker: each fault caught where it should be ------------------------------


def test_good_kernel_is_ok_and_timed(libs, worker):
    r = measure(worker, task(libs, "good", m=200, n=136, k=64))
    assert r["status"] == "ok", r["error"]
    assert 0 < r["relerr"] < 1e-3
    assert r["time_us"] > 0 and r["escaped"] is False
    assert r["event_vs_wall"]["batch"] >= 10


def test_rounds_time_on_fresh_buffers_and_pool(libs, worker):
    """Three rounds: each round's median is reported, the pooled median lies among them,
    and a side-stream kernel is still caught (the escape check runs in the last round)."""
    r = measure(worker, task(libs, "good", "side_stream", m=1024, n=1024, k=1024, rounds=3))
    good, side = r["candidates"]
    assert good["status"] == "ok" and good["reps"] == 3 * 30
    assert len(good["round_us"]) == 3
    assert min(good["round_us"]) <= good["time_us"] <= max(good["round_us"])
    assert side["status"] == "escaped"


def test_a_skipping_k_is_wrong(libs, worker):
    r = measure(worker, task(libs, "skip_k", "good"))
    skip, good = r["candidates"]
    assert skip["status"] == "wrong" and skip["relerr"] > 1e-3 and skip["time_us"] is None
    assert good["status"] == "ok"


def test_b_side_stream_is_flagged_by_event_vs_wall(libs, worker):
    r = measure(worker, task(libs, "side_stream", "good", m=1024, n=1024, k=1024))
    side, good = r["candidates"]
    assert side["relerr"] is not None and side["relerr"] < 1e-3  # verification passed
    assert side["status"] == "escaped", side
    assert side["time_us"] is None and side["escaped"] is True
    ev = side["event_vs_wall"]
    assert ev["event_us"] < 0.5 * ev["wall_us"]
    assert good["status"] == "ok" and good["escaped"] is False  # the control, same run
    assert ev["event_us"] < 0.2 * good["time_us"]


def test_c_illegal_address_is_run_error_and_the_worker_survives(libs, worker):
    before = measure(worker, task(libs, "good"))
    assert before["status"] == "ok"
    r = measure(worker, task(libs, "illegal_address", "good"))
    bad, good = r["candidates"]
    assert bad["status"] == "run_error"
    assert "cudaErrorIllegalAddress" in bad["error"] or "illegal" in bad["error"].lower()
    assert good["status"] == "ok"  # measured again, in a fresh worker
    assert worker.restarts >= 1
    after = measure(worker, task(libs, "good"))
    assert after["status"] == "ok"


def test_d_hang_is_a_timeout_and_the_worker_survives(libs, worker):
    assert measure(worker, task(libs, "good"))["status"] == "ok"  # warm: no first-task grace
    r = measure(worker, task(libs, "hang", "good"), timeout=30)
    hang, good = r["candidates"]
    assert hang["status"] == "timeout" and hang["time_us"] is None
    assert good["status"] == "ok"
    assert worker.restarts >= 1
