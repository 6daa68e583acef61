"""Curves rebuilt from tuning databases match what the tuning loop saw, and two runs are
compared at the same number of candidates per shape."""

from __future__ import annotations

import json

import pytest

from l2gen.cli import main
from l2gen.curves import compare_runs, curves_from_db, geomean_curve
from l2gen.db import KernelDB
from l2gen.problem import Shape
from l2gen.search.loop import tune
from l2gen.search.policies import EmbeddedPolicy, RandomPolicy
from l2gen.search.simulate import SimulatedEvaluator
from l2gen.targets import GPUS

H200 = GPUS["h200"]
SHAPES = [Shape(64, 4096, 4096), Shape(1024, 1024, 1024), Shape(4096, 4096, 4096)]


def run(path, policy):
    with KernelDB(path) as db:
        return tune(SHAPES, policy, SimulatedEvaluator(H200), db, budget=12, batch=4, gpu=H200, progress=False)


def test_curves_from_the_database_are_the_loops_curves(tmp_path):
    summary = run(tmp_path / "e.db", EmbeddedPolicy(H200, seed=0))
    with KernelDB(tmp_path / "e.db", readonly=True) as db:
        curves = curves_from_db(db, H200)
        assert set(curves) == set(SHAPES)
        for shape in SHAPES:
            assert curves[shape] == pytest.approx(summary.results[shape].curve)
        assert all(len(c) == 5 for c in curves_from_db(db, H200, budget=5).values())


def test_geomean_curve_waits_for_every_shape():
    curves = {Shape(1, 8, 8): [0.0, 2.0], Shape(2, 8, 8): [0.5, 0.5]}
    assert geomean_curve(curves, 2) == [None, pytest.approx(1.0)]


def test_compare_runs_counts_wins_and_ties():
    a = {Shape(1, 8, 8): [1.0, 1.2], Shape(2, 8, 8): [0.9, 0.9], Shape(3, 8, 8): [1.0, 1.0]}
    b = {Shape(1, 8, 8): [0.5, 1.0], Shape(2, 8, 8): [0.9, 1.1], Shape(3, 8, 8): [1.0, 1.001]}
    result = compare_runs({"a": a, "b": b}, 2)
    assert result["wins"] == {"a": 1, "b": 1} and result["ties"] == 1
    assert result["geomean_shapes"] == 3


def test_cli_curves(tmp_path, capsys):
    run(tmp_path / "e.db", EmbeddedPolicy(H200, seed=0))
    run(tmp_path / "r.db", RandomPolicy(H200, seed=0))
    out = tmp_path / "c.json"
    assert main(["curves", str(tmp_path / "e.db"), str(tmp_path / "r.db"), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "embedded" in text and "random" in text and "after 12 candidates per shape" in text
    data = json.loads(out.read_text())
    assert set(data["curves"]) == {"embedded", "random"} and data["budget"] == 12
    assert main(["curves", str(tmp_path / "missing.db")]) == 1
