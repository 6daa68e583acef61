"""bench/train_policy.py: training from measured rows moves the policy toward the programs
that measured faster, and a results file holding a held-out shape is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.bench_scripts import RESULTS as RESULTS_DIR, load

RESULTS = RESULTS_DIR / "2026-12-04-h200-ksplit-run1-349ad1a.json"


def _one_shape(tmp_path, shape=(64, 1024, 16384), as_shape=None) -> Path:
    doc = json.loads(RESULTS.read_text())
    rows = [r for r in doc["rows"] if (r["m"], r["n"], r["k"]) == shape and r["status"] == "ok"]
    if as_shape is not None:
        for r in rows:
            r["m"], r["n"], r["k"] = as_shape
    doc["rows"] = rows
    path = tmp_path / "results.json"
    path.write_text(json.dumps(doc))
    return path


def test_training_raises_the_fastest_programs_probability_over_the_slowest(tmp_path):
    from l2gen.search.policies import EmbeddedPolicy
    from l2gen.targets import GPUS

    tp = load("train_policy")
    data = tp.load_rows([str(_one_shape(tmp_path))])
    (shape, rows), = data.items()
    fast = max(rows, key=lambda m: m.speedup)
    slow = min(rows, key=lambda m: m.speedup)
    assert fast.speedup > 1.5 * slow.speedup  # the file holds a real spread

    def margin(policy):
        return policy.log_probability(fast.program, shape) - policy.log_probability(slow.program, shape)

    untrained = EmbeddedPolicy(GPUS["h200"], cost_model=False)
    trained = tp.train(EmbeddedPolicy(GPUS["h200"], cost_model=False), data, epochs=3, seed=0)
    assert margin(trained) > margin(untrained) + 0.1


def test_a_held_out_shape_is_refused(tmp_path):
    tp = load("train_policy")
    held = sorted(tp.heldout_shapes())[0]
    with pytest.raises(SystemExit, match="held-out"):
        tp.load_rows([str(_one_shape(tmp_path, as_shape=held))])
