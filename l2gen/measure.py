"""The worker's default executor: verify, then time interleaved, on the GPU.

Runs inside the isolated worker process (:mod:`l2gen.worker`), one task at a time (the task
and result formats are in :mod:`l2gen.tasks`):

- "measure": every candidate and baseline is verified first (:mod:`l2gen.verify`), then all
  that passed are timed together under the task's protocol (:mod:`l2gen.protocol`): in
  events mode round-robin with the L2 flushed before each run (:mod:`l2gen.timing`), in
  graph or server mode as :mod:`l2gen.modes` does; then, in every mode, the escape check.
- "probe": what bounds a GEMM in this run (:mod:`l2gen.floors`).
"""

from __future__ import annotations

import functools
import os

from .timing import ESCAPE_RATIO, MIN_REPS, SUSTAINED_COPIES, median, time_sustained
from .session import device_record, session, time_mode
from .tasks import MeasureTask, failed
from .worker import Note

AUTOTUNED = "cublaslt_autotuned"
RANK = "#"  # "baseline/cublaslt_autotuned#2": the auto-tune's second fastest algorithm

def execute(task: dict, note: Note) -> dict:
    """The worker's default executor: "measure" (see the module docstring) and "ping"."""
    kind = task.get("kind", "measure")
    if kind == "ping":
        return {"status": "ok", "pid": os.getpid()}
    if kind == "measure":
        return _measure(MeasureTask.from_wire(task), note)
    if kind == "probe":
        from .floors import probe

        return probe(task, note)
    raise ValueError(f"unknown task kind {kind!r}")


def _measure(task: MeasureTask, note: Note) -> dict:
    """Verify every runner (baselines, then candidates), then time the verified ones
    interleaved. A CudaError propagates: the context may be broken, the worker must go.

    With ``"rounds": R`` > 1 the timing is repeated R times, each round on freshly
    allocated inputs (new random data, new addresses) and output; a runner's median is over
    the pooled runs of all rounds, and each round's own median is reported as
    ``round_us``. A kernel of a few µs can run a few percent faster or slower depending on
    where its buffers landed; pooling rounds averages that out. Rounds are an events-mode
    matter: graph mode rotates input copies instead, and server mode runs one schedule.

    A runner that graph mode cannot capture gets status "capture_error"."""
    from .runtime import CudaError, DeviceBuffer, Library
    from .verify import DEFAULT_SEEDS, b_shape, make_inputs, verify

    note({"phase": "setup"})
    protocol = task.protocol
    s = session(task.probes)
    flush = s.flush(protocol.l2)
    m, n, k = task.shape.m, task.shape.n, task.shape.k
    layout = task.b_layout
    seeds = DEFAULT_SEEDS if task.seeds is None else task.seeds
    reps, warmup = task.reps, task.warmup
    rounds = task.rounds if protocol.mode == "events" else 1
    if reps < MIN_REPS:
        raise ValueError(f"reps={reps}: the median needs at least {MIN_REPS} runs")
    h, dev = s.stream.handle, s.device
    owned: list = []

    def buffers():
        a, b, c = dev.alloc((m, k)), dev.alloc(b_shape(n, k, layout)), dev.alloc((m, n))
        owned.extend((a.buffer, b.buffer, c.buffer))
        return a, b, c

    a, b, c = buffers()
    results: dict[str, dict] = {}  # "baseline/<name>" or "candidate/<name>" -> result
    binders: dict = {}  # key -> (a, b, c) -> runner on those buffers, for verified runners
    relerrs: dict[str, float] = {}

    def check(key: str, name: str, kernel, c_view, transposed: bool) -> None:
        try:
            vr = verify(kernel, m, n, k, b_layout=layout, seeds=seeds, device=dev,
                        reference=s.reference, buffers=(a, b, c_view), c_transposed=transposed)
        except CudaError:
            raise
        except Exception as e:  # LaunchError, ShimError, a torch error: this runner only
            results[key] = failed(name, "run_error", f"{type(e).__name__}: {e}")
            return
        if not vr.ok:
            results[key] = dict(failed(name, "wrong", vr.error), relerr=vr.relerr)
        else:
            relerrs[key] = vr.relerr

    try:
        inputs = make_inputs(m, n, k, 0, layout)  # real data before anything runs (autotune)
        dev.write(a, inputs[0])
        dev.write(b, inputs[1])
        if task.baselines:
            bl = s.baselines(task.shim)
            for name in task.baselines:
                key = f"baseline/{name}"
                if name in bl.unavailable:
                    results[key] = failed(name, "unavailable", bl.unavailable[name])
                    continue
                note({"phase": "verify", "baseline": name})
                transposed = bl.c_transposed(name)

                def bind(a, b, c, name=name, transposed=transposed, rank=1):
                    c_view = c.buffer.array((n, m)) if transposed else c
                    return bl.runner(name, a, b, c_view, m, n, k, layout, stream=h, flush=flush, rank=rank)

                try:
                    run = bind(a, b, c)
                except CudaError:
                    raise
                except Exception as e:
                    results[key] = failed(name, "run_error", f"{type(e).__name__}: {e}")
                    continue
                c_view = c.buffer.array((n, m)) if transposed else c
                check(key, name, lambda *_, run=run: run(h), c_view, transposed)
                if key in relerrs:
                    binders[key] = bind
                if name == AUTOTUNED:  # the tuner's runners-up are timed too (see _finalists)
                    for rank in range(2, bl.finalists(m, n, k, layout) + 1):
                        rkey, bind_rank = f"{key}{RANK}{rank}", functools.partial(bind, rank=rank)
                        check(rkey, name, lambda *_, run=bind_rank(a, b, c): run(h), c, False)
                        if rkey in relerrs:
                            binders[rkey] = bind_rank

        ldb = n if layout == "kn" else k
        for cand in task.candidates:
            name, key = cand.name, f"candidate/{cand.name}"
            note({"phase": "verify", "candidate": name})
            try:
                lib = Library.load(cand.library, cand.entry)
                text = cand.program_text
                if text is not None and lib.program_text().strip() != text.strip():
                    raise ValueError(f"{cand.library} was built from another program")
                knobs = cand.knobs
                ws_bytes = lib.workspace_size(m, n, k, knobs)
            except (OSError, AttributeError, ValueError) as e:
                results[key] = failed(name, "run_error", f"cannot use the library: {e}")
                continue
            ws = DeviceBuffer(ws_bytes) if ws_bytes else None
            if ws is not None:
                owned.append(ws)
                ws.fill_bytes(0)  # once, as the ABI asks (templates/common.cuh.j2)

            def bind(a, b, c, lib=lib, knobs=knobs, ws=ws, ws_bytes=ws_bytes):
                def run(stream):
                    lib.launch(a, b, c, m, n, k, k, ldb, n, knobs, ws, ws_bytes, stream)
                return run

            run = bind(a, b, c)
            check(key, name, lambda *_, run=run: run(h), c, False)
            if key in relerrs:
                binders[key] = bind

        def rotation(a, b, c, most: int) -> list:
            """``(a, b, c)`` and copies of its inputs at other addresses, as many as
            :func:`l2gen.modes.rotation_copies` says keep each call's operands out of the
            L2 from one use to the next, at most ``most``."""
            from .modes import rotation_copies

            out = [(a, b, c)]
            want = rotation_copies(2 * (m * k + k * n + m * n), s.info.l2_bytes, most)
            while len(out) < want:
                ca, cb, cc = buffers()
                ca.buffer.copy_from(a.buffer)
                cb.buffer.copy_from(b.buffer)
                out.append((ca, cb, cc))
            return out

        note({"phase": "time", "runners": list(binders), "rounds": rounds, "mode": protocol.mode})
        per_round: list[dict] = []
        blocks: dict[str, list[float]] = {}
        extras: dict[str, dict] = {}
        copies = rotation(a, b, c, protocol.graph_calls) if protocol.mode == "graph" and binders else [(a, b, c)]
        for r in range(rounds):
            if r:  # fresh buffers; the earlier ones stay allocated, so these land elsewhere
                a, b, c = buffers()
                ra, rb, _ = make_inputs(m, n, k, r, layout)
                dev.write(a, ra)
                dev.write(b, rb)
                copies = [(a, b, c)]
            sets = {key: [bind(*copy) for copy in copies] for key, bind in binders.items()}
            if sets:
                timed, extras, uncaptured = time_mode(protocol, sets, h, flush, reps=reps, warmup=warmup,
                                                      wall_check=r == rounds - 1)
                per_round.append(timed)
                for key, why in uncaptured.items():
                    results[key] = dict(failed(key.split("/", 1)[1], "capture_error", why), relerr=relerrs[key])
        samples = _pool(per_round)
        round_us = {key: [rs[key].median_us for rs in per_round] for key in samples}
        looped = [key for key in binders if key in samples]
        if task.sustained_us > 0 and protocol.mode == "events" and looped:
            # Back to back over copies of the last round's inputs, so no call finds its
            # operands in the L2 from the call before.
            turns = rotation(a, b, c, SUSTAINED_COPIES)
            note({"phase": "sustained", "runners": looped, "block_us": task.sustained_us, "copies": len(turns)})
            blocks = time_sustained({key: [binders[key](*copy) for copy in turns] for key in looped}, h,
                                    {key: samples[key].median_us for key in looped}, block_us=task.sustained_us)
    finally:
        for buf in owned:
            try:
                buf.free()
            except Exception:
                pass

    for key, sample in samples.items():
        name = key.split("/", 1)[1]
        ev = {"event_us": sample.median_us, "wall_us": sample.wall_us, "host_us": sample.host_us,
              "batch": sample.batch, "batch_event_us": sample.batch_event_us, "escaped": sample.escaped}
        if sample.escaped:
            results[key] = dict(failed(name, "escaped", (
                f"event time per call of a back-to-back batch, {sample.judged_us:.2f} us, is under "
                f"{ESCAPE_RATIO:g} x its synchronized wall time per call, {sample.wall_us:.2f} us (host enqueue "
                f"{sample.host_us:.2f} us): the work escaped the timed stream")),
                relerr=relerrs[key], escaped=True, event_vs_wall=ev)
        else:
            results[key] = {"name": name, "status": "ok", "time_us": sample.median_us,
                            "relerr": relerrs[key], "error": None, "escaped": False,
                            "event_vs_wall": ev, "spread": sample.spread,
                            "reps": len(sample.event_us), **extras.get(key, {})}
            if rounds > 1:
                results[key]["round_us"] = round_us[key]
            if key in blocks:
                results[key]["sustained_us"] = median(blocks[key])
                results[key]["sustained_blocks_us"] = blocks[key]
    _finalists(results, f"baseline/{AUTOTUNED}")
    return {
        "status": "ok",
        "error": None,
        "device": device_record(s),
        "protocol": protocol.to_dict(),
        "candidates": [results[f"candidate/{cand.name}"] for cand in task.candidates],
        "baselines": {name: results[f"baseline/{name}"] for name in task.baselines},
    }


def _pool(per_round: list) -> dict:
    """One TimingSample per runner: the event times of every round, and the escape-check
    batch of the last round (the only one that ran it)."""
    from dataclasses import replace

    if not per_round:
        return {}
    last = per_round[-1]
    return {key: replace(last[key], event_us=tuple(t for rs in per_round for t in rs[key].event_us))
            for key in last}


def _finalists(results: dict, key: str) -> None:
    """Fold the auto-tune's runners-up (``key#2``, ``key#3``, ...) into ``key``: the
    baseline's result is the fastest of them in this measurement's pooled timing, with
    every finalist's time under ``finalists_us`` (rank -> µs) and the rank that won."""
    ranked = {1: results[key]} if key in results else {}
    for k in [k for k in results if k.startswith(key + RANK)]:
        ranked[int(k[len(key) + len(RANK):])] = results.pop(k)
    timed = {r: res for r, res in ranked.items() if res.get("status") == "ok" and res.get("time_us")}
    if len(ranked) < 2 or not timed:
        return
    rank = min(timed, key=lambda r: (timed[r]["time_us"], r))
    results[key] = dict(timed[rank], name=AUTOTUNED, rank=rank,
                        finalists_us={str(r): res.get("time_us") for r, res in sorted(ranked.items())})
