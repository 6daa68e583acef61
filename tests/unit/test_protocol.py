"""Protocols and floors: what a results file records, the legacy rule, and refusals."""

from __future__ import annotations

import pytest

from l2gen.protocol import (
    DEFAULT_L2,
    LEGACY_L2,
    Floors,
    Protocol,
    ProtocolError,
    ProtocolMismatch,
    check_l2,
    l2_of,
    require_comparable,
)
from l2gen.targets import GPUS

H200 = GPUS["h200"]


def test_the_default_is_events_mode_under_a_clean_l2():
    p = Protocol()
    assert (p.mode, p.l2) == ("events", "clean") == ("events", DEFAULT_L2)
    assert p.to_dict() == {"mode": "events", "l2": "clean"}


def test_a_record_without_the_field_was_measured_with_the_written_flush():
    assert LEGACY_L2 == "dirty"
    assert l2_of({}) == "dirty" and l2_of({"l2": None}) == "dirty"
    assert l2_of({"l2": "clean"}) == "clean"
    old = Protocol.of({"rows": []})
    assert (old.mode, old.l2) == ("events", "dirty")
    assert Protocol.of({}, missing_l2=DEFAULT_L2).l2 == "clean"  # a task made now


def test_server_and_graph_fields():
    s = Protocol("server", qps=50)
    assert s.to_dict() == {"mode": "server", "l2": "clean", "qps": 50.0, "seed": 0}
    assert Protocol("server").qps == 100.0
    g = Protocol("graph", "warm")
    assert g.to_dict() == {"mode": "graph", "l2": "warm", "graph_calls": 100}
    assert Protocol.of(s.to_dict()) == s and Protocol.of(g.to_dict()) == g
    assert "100 calls/s" in Protocol("server").describe()


@pytest.mark.parametrize("kw, words", [
    (dict(mode="batch"), "unknown timing mode 'batch'"),
    (dict(l2="flushed"), "unknown L2 protocol 'flushed'"),
    (dict(mode="server", qps=0), "--qps must be a positive"),
    (dict(mode="server", qps=-3), "--qps must be a positive"),
    (dict(mode="server", qps=float("nan")), "--qps must be a positive"),
    (dict(mode="events", qps=10), "--qps sets the arrival rate of server mode"),
    (dict(mode="graph", graph_calls=0), "--graph-calls must be a positive"),
    (dict(mode="server", graph_calls=8), "--graph-calls sets the calls per graph"),
])
def test_bad_protocols_are_refused_with_a_message(kw, words):
    with pytest.raises(ProtocolError, match=words):
        Protocol(**kw)
    with pytest.raises(ProtocolError):
        check_l2("cold")


def test_mixing_protocols_is_refused():
    require_comparable(Protocol(), Protocol(), ("a.json", "b.json"))
    require_comparable(Protocol("server", seed=1), Protocol("server", seed=2))  # the seed aside
    with pytest.raises(ProtocolMismatch, match=r"a\.json was timed in events mode, l2 clean, b\.json in events mode, l2 dirty"):
        require_comparable(Protocol(), Protocol(l2="dirty"), ("a.json", "b.json"))
    with pytest.raises(ProtocolMismatch):
        require_comparable(Protocol("server", qps=100), Protocol("server", qps=10))
    with pytest.raises(ProtocolMismatch):
        require_comparable(Protocol("graph"), Protocol())


def test_the_floor_is_the_largest_of_launch_stream_and_peak():
    f = Floors(3.0, 4.0, 700.0, "l", "s", "p")
    assert f.floor_us(64, 64, 64) == 3.0  # tiny: the launch floor
    memory = 2 * (64 * 4096 + 4096 * 4096 + 64 * 4096) / 4.0e6
    assert f.floor_us(64, 4096, 4096) == pytest.approx(memory)  # bytes / stream rate
    assert f.floor_us(8192, 8192, 8192) == pytest.approx(2 * 8192**3 / 700e6)  # FLOPs / peak
    assert set(f.to_dict()) == {"launch_floor_us", "stream_tbs", "peak_tflops", "launch_source", "stream_source", "peak_source"}
    assert Floors.from_dict(f.to_dict()) == f  # what a results file's "floors" reads back as


def test_floors_from_a_probe_fill_what_it_could_not_measure_from_the_target():
    probe = {"launch_floor_us": 2.9, "launch_source": "measured: empty", "stream_tbs": 4.2,
             "stream_source": "measured: read", "peak_tflops": None, "peak_error": "no cuBLAS: missing"}
    f = Floors.from_probe(probe, H200)
    assert (f.launch_us, f.stream_tbs, f.peak_tflops) == (2.9, 4.2, H200.peak_tflops_fp16)
    assert f.peak_source == "h200 constant in targets.py (no cuBLAS: missing)"
    none = Floors.from_probe({"status": "run_error", "error": "worker died"}, H200)
    assert none.launch_us is None and none.stream_tbs == H200.bandwidth_tbs
    assert "worker died" in none.stream_source
    assert Floors.from_gpu(H200).floor_us(64, 64, 64) == pytest.approx(H200.floor_us(64, 64, 64))
