"""The worker process's GPU state and the timing both of its tasks share.

One :class:`Session` per worker process (the timed stream, the probes and their L2
flushes, the verification reference, the cuBLAS baselines), made on the first task; the
"measure" task (:mod:`l2gen.measure`) and the "probe" task (:mod:`l2gen.floors`) both time
through :func:`time_mode`.
"""

from __future__ import annotations

from .protocol import Protocol

_SESSION = None


class Session:
    """Per-process GPU state: the timed stream, the probes and the flushes, the reference,
    the baselines."""

    def __init__(self, probes: str | None):
        from . import runtime
        from .probes import Probes, build_probes
        from .verify import CudaDevice, default_reference

        runtime.call("cudaSetDevice", 0)  # the first visible device (CUDA_VISIBLE_DEVICES)
        self.info = runtime.device_info(0)
        self.stream = runtime.Stream()
        self.probes = Probes(probes or build_probes())
        self._flushes: dict = {}
        self.device = CudaDevice()
        self.reference = default_reference(self.device)
        self._baselines: dict = {}

    def flush(self, l2: str):
        """The :class:`probes.Flush` of an L2 protocol (one buffer per protocol and process)."""
        from .probes import Flush

        if l2 not in self._flushes:
            self._flushes[l2] = Flush(self.probes, l2, self.info.l2_bytes)
        return self._flushes[l2]

    def baselines(self, shim: str | None):
        from .baselines import Baselines

        if shim not in self._baselines:
            self._baselines[shim] = Baselines(shim)
        return self._baselines[shim]


def session(probes: str | None) -> Session:
    """This process's session, made on first use with the timing probes library at
    ``probes`` (None: built or found in the cache)."""
    global _SESSION
    if _SESSION is None:
        _SESSION = Session(probes)
    return _SESSION


def device_record(s: Session) -> dict:
    """The device a result was measured on, as results files record it."""
    return {"name": s.info.name, "sm": s.info.sm, "sms": s.info.sms, "l2_bytes": s.info.l2_bytes}


def time_mode(protocol: Protocol, runner_sets: dict, stream: int, flush, *, reps: int, warmup: int,
              wall_check: bool = True) -> tuple[dict, dict, dict]:
    """Time runners under a protocol's mode: ``runner_sets[key]`` is one runner per input
    copy (only graph mode uses more than the first). Returns ``(samples, extras,
    failures)``: a :class:`timing.TimingSample` per runner timed (its event times one per
    call: per run in events mode, replay / calls in graph mode, per arrival in server
    mode), the mode's own figures per runner (``{"graph": ...}`` or ``{"server": ...}``),
    and why each runner that could not be timed was not (graph capture)."""
    from .modes import arrival_schedule, time_graph, time_server
    from .timing import TimingSample, time_interleaved, with_escape_check

    first = {key: runners[0] for key, runners in runner_sets.items()}
    failures: dict[str, str] = {}
    if protocol.mode == "events":
        return time_interleaved(first, stream, flush, reps=reps, warmup=warmup, wall_check=wall_check), {}, {}
    if protocol.mode == "graph":
        graphs, failures = time_graph(runner_sets, stream, flush, calls=protocol.graph_calls)
        samples = {key: TimingSample(key, g.per_call_us) for key, g in graphs.items()}
        extras = {key: {"graph": g.to_dict()} for key, g in graphs.items()}
    else:
        schedule = arrival_schedule(list(first), reps, protocol.qps, protocol.seed)
        served = time_server(first, stream, flush, schedule, warmup=warmup)
        samples = {key: TimingSample(key, sv.event_us) for key, sv in served.items()}
        extras = {key: {"server": sv.to_dict()} for key, sv in served.items()}
    if wall_check:
        samples = {key: with_escape_check(sample, first[key], stream) for key, sample in samples.items()}
    return samples, extras, failures
