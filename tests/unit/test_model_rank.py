"""bench/model_rank.py --learned on two committed benchmark files: the learned model ranks
each shape's measured programs, that shape left out of its fit, at a median Spearman of at
least 0.8 (the search issue's bar), and its per-program neighbour correction ranks them no
worse than the regression alone (0.896 and 0.877 when this test was written)."""

from __future__ import annotations

import re

from tests.unit.bench_scripts import RESULTS, load


def test_the_learned_model_ranks_left_out_shapes_as_measured(capsys):
    files = [str(RESULTS / f"2026-12-04-h200-{name}-run1-fe6b98d.json") for name in ("decode", "ksplit")]
    assert load("model_rank").main(files, learned=True) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    found = re.fullmatch(r"median over (\d+) shapes: (\S+)  learned \(leave-one-shape-out\): (\S+) \(ridge alone (\S+)\)", last)
    assert found, last
    shapes, analytic, learned, ridge = int(found[1]), *(float(found[i]) for i in (2, 3, 4))
    assert shapes == 24
    assert learned >= 0.8 and learned >= ridge and learned >= analytic
