"""bench/gate_replay.py's replay of one shape: what the gate skips, and that a candidate
measured without a compile (a library setting) is never skipped."""

from __future__ import annotations

from tests.unit.bench_scripts import load


def test_a_candidate_predicted_slower_than_the_best_so_far_is_skipped():
    replay = load("gate_replay").replay
    # the second is predicted 20% above the first (the best so far): skipped at 5% slack,
    # though it measured fastest; the third is predicted within the slack and is kept
    best, gated, skipped, compiles = replay([10.0, 8.0, 9.0], [10.0, 12.0, 10.4], [False] * 3, 0.05)
    assert (best, gated, skipped, compiles) == (8.0, 9.0, 1, 3)
    # at 25% slack nothing is skipped
    assert replay([10.0, 8.0, 9.0], [10.0, 12.0, 10.4], [False] * 3, 0.25) == (8.0, 8.0, 0, 3)


def test_a_library_setting_is_measured_whatever_the_model_predicts():
    replay = load("gate_replay").replay
    best, gated, skipped, compiles = replay([10.0, 8.0, 9.0], [10.0, 12.0, 10.4], [False, True, False], 0.05)
    assert (best, gated, skipped, compiles) == (8.0, 8.0, 0, 2)
    # the best so far is now the library setting, and the gate compares with its prediction:
    # the third (12.5 against 12.0) is within 5% and measured, the fourth (50) is skipped
    assert replay([10.0, 8.0, 20.0, 7.0], [10.0, 12.0, 12.5, 50.0], [False, True, False, False], 0.05) == (7.0, 8.0, 1, 3)
