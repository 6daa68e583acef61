"""The model gate: after the kernel library, a configuration is compiled only where the cost
model predicts it within a slack of the shape's best measured program (prediction against
prediction); library settings and diagnosed proposals pass; nothing is gated before a
verified measurement; a shape with nothing left to gain stops, and says so."""

from __future__ import annotations

import pytest

from l2gen.cli import main
from l2gen.ir import Family
from l2gen.problem import Measurement, Shape, Status, program_key
from l2gen.search.base import Proposal
from l2gen.search.library_first import LIBRARY_KIND
from l2gen.search.model_gate import ModelGated
from l2gen.space import assemble
from l2gen.targets import GPUS

H200 = GPUS["h200"]
SHAPE = Shape(256, 4096, 4096)


def l2(bn: int, stages: int = 4):
    return assemble(Family.SM90_L2GEN, dict(bm=128, bn=bn, bk=64, stages=stages))


class Scripted:
    """Proposes from a script, a batch per call; records its updates."""

    name = "scripted"

    def __init__(self, batches):
        self.batches = list(batches)
        self.updates = []

    def propose(self, shape, history, n):
        return list(self.batches.pop(0) if self.batches else [])[:n]

    def update(self, shape, results):
        self.updates.append(results)


# predicted µs by tile width: the gate compares predictions with predictions
PREDICTED = {64: 10.0, 96: 10.4, 128: 12.0, 160: 9.0, 192: 20.0}


def score(programs, shape):
    return [PREDICTED[p.config.tile.n] for p in programs]


def measured(program, us: float | None, status: str = Status.OK) -> Measurement:
    return Measurement(SHAPE, program, status, us, 20.0 if us else None)


def test_nothing_is_gated_before_a_verified_measurement():
    batch = [Proposal(l2(192)), Proposal(l2(128))]
    gate = ModelGated(Scripted([batch]), H200, score=score)
    failed = [measured(l2(64), None, Status.BUILD_ERROR)]
    assert gate.bar_us(SHAPE, failed) is None
    assert gate.propose(SHAPE, failed, 4) == batch
    assert not gate.gated


def test_compiled_proposals_pass_only_within_the_slack_of_the_best():
    library = Proposal(l2(192, stages=3), meta={"kind": LIBRARY_KIND})  # predicted slow, but built already
    diagnosed = Proposal(l2(192, stages=5), meta={"rejected": True})
    inner = Scripted([[Proposal(l2(192)), Proposal(l2(96)), library, diagnosed], [Proposal(l2(128)), Proposal(l2(160))]])
    gate = ModelGated(inner, H200, slack=0.05, score=score)
    # the best measured is the 64-wide tile (predicted 10.0): the bar is 10.5
    history = [measured(l2(64), 15.0), measured(l2(128), 18.0)]
    assert gate.bar_us(SHAPE, history) == pytest.approx(10.5)
    out = gate.propose(SHAPE, history, 5)  # asked for 5: 3 kept of the first 4, then 1 of 2, then nothing left
    assert [p.program.config.tile.n for p in out] == [96, 192, 192, 160]
    assert out[1] is library and out[2] is diagnosed
    assert gate.gated == {SHAPE: 2}  # the 192 and the 128, uncompiled
    assert "cost model" in gate.stop_note(SHAPE) and "2 proposals" in gate.stop_note(SHAPE)
    assert gate.stop_note(Shape(1, 2, 3)) is None
    assert gate.name == "scripted" and gate.batches == []  # the wrapped policy's attributes
    gate.update(SHAPE, [])
    assert inner.updates == [[]]
    with pytest.raises(ValueError):
        ModelGated(inner, H200, slack=-0.1)


def test_a_short_batch_after_the_asks_run_out():
    inner = Scripted([[Proposal(l2(192))]] * 6)
    gate = ModelGated(inner, H200, score=score)
    assert gate.propose(SHAPE, [measured(l2(64), 15.0)], 2) == []
    assert len(inner.batches) == 2  # asked four times, then gave up


def test_tune_with_the_library_stops_a_shape_the_model_expects_no_gain_on(tmp_path, capsys):
    from l2gen.db import KernelDB

    shape = "1024x1024x1024"
    gated, free = tmp_path / "gated.db", tmp_path / "free.db"
    common = ["tune", "--simulate", "--library", "--library-share", "0.25", "--shape", shape, "--budget", "24",
              "--batch", "4", "--fresh-policy", "--seed", "3"]
    assert main([*common, "--db", str(gated), "--model-gate", "0"]) == 0
    err = capsys.readouterr().err
    assert "--model-gate" in err
    assert main([*common, "--db", str(free), "--model-gate", "off"]) == 0
    with KernelDB(gated) as g, KernelDB(free) as f:
        kept, full = g.history(H200, Shape(1024, 1024, 1024)), f.history(H200, Shape(1024, 1024, 1024))
    assert len(full) == 24
    assert 6 <= len(kept) < 24  # the library's six, then only what the model expects to gain
    # in simulation the model is the measurement: nothing it left out would have won
    best = min(m.time_us for m in full if m.time_us)
    assert min(m.time_us for m in kept if m.time_us) <= best * 1.05
    assert len({program_key(m.program) for m in kept}) == len(kept)


def test_a_bad_gate_is_a_usage_error(capsys):
    assert main(["tune", "--simulate", "--library", "--model-gate", "1.5", "--shape", "64x64x64"]) == 2
    assert "--model-gate" in capsys.readouterr().err
