"""bench/replay_ranking.py on two committed benchmark files: one line per shape and a
summary, every count a real position among the shape's programs, and the learned model's
order reaching a program within 2% of the best in fewer picks on average than a random
order's expectation."""

from __future__ import annotations

import re

from tests.unit.bench_scripts import RESULTS, load


def test_the_replay_counts_picks_for_each_ranking(capsys):
    script = load("replay_ranking")
    assert script.random_expectation(10, 1) == 5.5 and script.random_expectation(4, 4) == 1.0
    files = [str(RESULTS / f"2026-12-04-h200-{name}-run1-fe6b98d.json") for name in ("decode", "ksplit")]
    assert script.main(files) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    per_shape = [re.search(r"n=\s*(\d+) within\s+(\d+)\s+learned\s+(\d+)\s+analytic\s+(\d+)\s+random\s+(\S+)", line) for line in lines[:-1]]
    assert per_shape and all(per_shape)
    for found in per_shape:
        n, good, learned, analytic = (int(found[i]) for i in range(1, 5))
        assert 1 <= good <= n and 1 <= learned <= n - good + 1 and 1 <= analytic <= n - good + 1
    means = dict(re.findall(r"(learned|analytic|random) (\d+\.\d+) /", lines[-1]))
    assert float(means["learned"]) < float(means["random"])
