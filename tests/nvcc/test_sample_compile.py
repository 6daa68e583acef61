"""The checker's promise, held to nvcc: random *valid* programs compile.

CI compiles a bounded sample each run (one program per kernel family, a fresh seed each run, so
over many runs the sample covers the space); ``l2gen sample --count 200`` does the full
run on a many-core machine (bench/results/2026-12-02-h200-sample200.json).
"""

from __future__ import annotations

import os
import random

import pytest

from l2gen.ir import Family
from l2gen.sample import compile_sample
from l2gen.targets import GPUS

pytestmark = pytest.mark.nvcc


def test_random_valid_programs_compile(tmp_path, monkeypatch):
    monkeypatch.setenv("L2GEN_CACHE_DIR", str(tmp_path / "cache"))
    seed = int(os.environ.get("L2GEN_SAMPLE_SEED", random.SystemRandom().randrange(1 << 30)))
    count = int(os.environ.get("L2GEN_SAMPLE_COUNT", "3"))
    report = compile_sample(count, seed, GPUS["h200"], jobs=2, timeout=900)
    assert report.failed == 0, (
        f"seed {seed}: {report.failed} of {count} valid programs failed to compile "
        f"(reproduce: L2GEN_SAMPLE_SEED={seed} L2GEN_SAMPLE_COUNT={count})\n"
        + "\n\n".join(f"{f['program']}\n{f['error']}\n{f['command']}" for f in report.failures)
    )
    assert report.built == count and set(report.by_family) == {f.value for f in Family}
