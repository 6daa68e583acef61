"""The scripts of ``bench/`` loaded as modules, for their tests: each by its file name,
with ``bench/`` on the import path (the scripts import one another, as they do when run)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
RESULTS = BENCH / "results"


def load(name: str):
    """``bench/<name>.py`` as a fresh module."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
