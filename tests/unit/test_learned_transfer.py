"""bench/learned_transfer.py: on the shapes the serving files do not hold, every ranking it
reports is a Spearman correlation over those shapes, and a learned model fit on the serving
rows plus the other shapes' rows ranks a shape's programs as measured at least as well as
one fit on the serving rows alone."""

from __future__ import annotations

import re

from tests.unit.bench_scripts import RESULTS, load


def test_learned_transfer_reports_each_ranking_over_the_unheld_shapes(capsys):
    serving = [str(RESULTS / "2026-12-04-h200-ksplit-run1-fe6b98d.json")]
    others = [str(RESULTS / "2026-12-04-h200-m256-screen-6d27045.json")]
    assert load("learned_transfer").main(serving, others) == 0
    out = capsys.readouterr().out
    assert out.startswith("8 shapes of the other files that the serving files do not hold")
    medians = dict(re.findall(r"^  (\S.*?)\s+median Spearman ([+-]\d\.\d\d)", out, flags=re.M))
    assert set(medians) == {"analytic", "serving", "serving, layout", "every other", "every other, layout"}
    assert all(-1.0 <= float(v) <= 1.0 for v in medians.values())
    assert float(medians["every other"]) >= float(medians["serving"])
