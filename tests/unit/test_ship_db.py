"""The shipped kernel databases are what their listed sources make (bench/shipped_sources.json):
rebuilt from the committed bench results, each serves the same programs at the same speedups."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _ship_db():
    spec = importlib.util.spec_from_file_location("ship_db", ROOT / "bench" / "ship_db.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("gpu", ["h200", "h100"])
def test_a_shipped_database_is_rebuilt_from_its_sources(gpu, tmp_path):
    ship = _ship_db()
    rebuilt = tmp_path / f"kernels_{gpu}.db"
    assert ship.build(gpu, rebuilt) > 100
    shipped = ship.served(gpu, ROOT / "l2gen" / "data" / f"kernels_{gpu}.db")
    again = ship.served(gpu, rebuilt)
    assert [(r[0], r[1], r[2], r[5]) for r in again] == [(r[0], r[1], r[2], r[5]) for r in shipped]
    assert [r[3] for r in again] == pytest.approx([r[3] for r in shipped])
    assert any(r[5] for r in shipped)


def test_an_unknown_gpu_names_the_ones_listed():
    with pytest.raises(SystemExit, match="no shipped database for 'a100'.*h200"):
        _ship_db().sources("a100")
