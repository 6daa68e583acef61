"""The held-out shapes (suites/heldout-*.json) are what bench/heldout.py draws from its
documented seed, and nothing that trains or ships has seen them: no other suite, no
sweep's shape list, no row of the shipped database, no shape of the shipped policy
state."""

from __future__ import annotations

import importlib.util
import json
import sqlite3
from pathlib import Path

import pytest

from l2gen.cli.run import load_suite, suite_layout

ROOT = Path(__file__).resolve().parents[2]
FILES = {layout: ROOT / "suites" / f"heldout-{layout}.json" for layout in ("nk", "kn")}


def _generator():
    spec = importlib.util.spec_from_file_location("heldout", ROOT / "bench" / "heldout.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _heldout() -> set[tuple[int, int, int]]:
    return {(s.m, s.n, s.k) for path in FILES.values() for s in load_suite(str(path))}


def test_the_files_are_the_documented_draw():
    expected = _generator().documents()
    for layout, path in FILES.items():
        assert json.loads(path.read_text()) == expected[path.name], f"{path.name}: rerun bench/heldout.py"
        assert suite_layout(str(path)) == layout


def test_at_least_24_shapes_in_both_layouts_with_no_repeats():
    per_file = [load_suite(str(path)) for path in FILES.values()]
    assert all(len(shapes) >= 12 for shapes in per_file)
    assert len(_heldout()) == sum(len(shapes) for shapes in per_file) >= 24


def test_no_other_suite_or_sweep_names_a_heldout_shape():
    others = [p for p in (ROOT / "suites").glob("*.json") if not p.name.startswith("heldout")]
    others += list((ROOT / "bench" / "sweeps").glob("*-shapes.json"))
    assert others
    for path in others:
        shared = _heldout() & {(s.m, s.n, s.k) for s in load_suite(str(path))}
        assert not shared, f"{path.relative_to(ROOT)} names held-out shapes {sorted(shared)}"


@pytest.mark.parametrize("name", ["kernels_h200.db", "measured_h200.db"])
def test_the_shipped_databases_have_no_heldout_row(name):
    """Neither the serving database nor the measured rows the learned model starts from."""
    db = ROOT / "l2gen" / "data" / name
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        rows = set(con.execute("SELECT m, n, k FROM measurements"))
        journal = con.execute("PRAGMA journal_mode").fetchone()[0]
    assert rows, f"{name} has no rows"
    assert not (_heldout() & rows)
    assert journal == "delete", f"{name} is in {journal} mode: reading it would write files beside it"


@pytest.mark.parametrize("section", ["baselines", "elite"])
def test_the_shipped_policy_never_trained_on_a_heldout_shape(section):
    state = json.loads((ROOT / "l2gen" / "data" / "policy_h200.json").read_text())
    trained = {tuple(int(v) for v in key.split("x")) for key in state[section]}
    assert trained, f"the policy state's {section} name no shapes"
    assert not (_heldout() & trained)
