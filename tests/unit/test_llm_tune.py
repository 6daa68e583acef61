"""End to end: ``tune`` driving the LLM policy against the loopback server, measured by the
simulated evaluator and persisted in a kernel database."""

from __future__ import annotations

import pytest

from l2gen.db import KernelDB
from l2gen.problem import Shape
from l2gen.search.simulate import SimulatedEvaluator
from l2gen.search.llm import LLMError
from l2gen.search.loop import tune

from .test_llm import H200, PARSE_BAD, VALID_SM90, _no_proxy, answer, distinct, error, fenced, make, server  # noqa: F401

SHAPES = [Shape(128, 4096, 4096), Shape(4096, 4096, 4096)]


def run(policy, db, shapes=SHAPES, budget=6, batch=3):
    return tune(shapes, policy, SimulatedEvaluator(H200), db, budget=budget, batch=batch, gpu=H200, progress=False)


def test_tune_with_the_llm_policy(server, tmp_path):
    server.add(answer(fenced(PARSE_BAD)), answer(fenced(VALID_SM90)))  # a repair, then distinct programs
    server.default = distinct(fenced)
    policy = make(server)
    with KernelDB(tmp_path / "k.db") as db:
        summary = run(policy, db)
        for shape in SHAPES:
            result = summary.results[shape]
            assert result.measured == 6 and result.best_speedup > 0
            assert len(db.history(H200, shape)) == 6
    assert policy.stats.total.repaired == 1
    # the second shape's prompts show what the first one measured
    assert "Best on similar shapes:\n128x4096x4096:" in policy.prompts[-1]


def test_a_broken_answer_is_recorded_as_rejected(server, tmp_path):
    server.add(answer(""), answer(""))  # empty, and empty again after the repair round
    server.default = distinct()
    policy = make(server)
    with KernelDB(tmp_path / "k.db") as db:
        summary = run(policy, db, shapes=SHAPES[:1], budget=4, batch=2)
        result = summary.results[SHAPES[0]]
        assert result.measured == 4 and result.counts["rejected"] == 1 and result.counts["ok"] >= 2


def test_spent_llm_budget_ends_each_shape(server, tmp_path):
    server.default = distinct()
    policy = make(server, max_requests_per_shape=4)
    with KernelDB(tmp_path / "k.db") as db:
        summary = run(policy, db, budget=10)
        for shape in SHAPES:
            assert summary.results[shape].measured == 4
            assert "proposed nothing new" in summary.results[shape].note
    assert policy.stats.total.requests == 8


def test_refused_key_mid_run_keeps_the_measurements(server, tmp_path):
    texts = distinct()
    server.add(*(texts("", {}) for _ in range(3)), error(401, "key revoked"))
    policy = make(server)
    with KernelDB(tmp_path / "k.db") as db:
        with pytest.raises(LLMError, match="key revoked"):
            run(policy, db)
        assert len(db.history(H200, SHAPES[0])) == 3


def test_every_unparsable_answer_is_recorded_with_its_diagnostics(server, tmp_path):
    server.add(answer(""), answer(""), answer("no kernel here"), answer("still none"))
    server.default = distinct()
    policy = make(server)
    with KernelDB(tmp_path / "k.db") as db:
        summary = run(policy, db, shapes=SHAPES[:1], budget=4, batch=2)
        assert summary.results[SHAPES[0]].counts["rejected"] == 2
        errors = [m.error for m in db.history(H200, SHAPES[0]) if m.status == "rejected"]
        assert len(errors) == 2 and all(e and "E-" in e for e in errors)


def test_the_prompt_shows_the_ranking_it_is_given_and_goes_on_without_a_broken_one(server, tmp_path):
    from l2gen.search.library import load, predictions
    from l2gen.search.llm_prompt import one_line

    server.default = distinct(fenced)
    programs = load(H200)
    for broken in (False, True):
        policy = make(server)
        if broken:
            policy.ranking = lambda shape: 1 / 0
        else:
            policy.ranking = lambda shape: predictions(programs, shape, H200, 3)
        with KernelDB(tmp_path / f"k{broken}.db") as db:
            assert run(policy, db, shapes=SHAPES[:1], budget=2, batch=1).results[SHAPES[0]].measured == 2
        first = predictions(programs, SHAPES[0], H200, 3)
        shown = ["cost model's first choices" in p and one_line(first[0][0]) in p for p in policy.prompts]
        assert shown and all(s is not broken for s in shown)
