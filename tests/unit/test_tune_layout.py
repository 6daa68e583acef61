"""A tune measures one B layout: its proposals, history, starting bests and budget are
that layout's, so kn and nk tunes of one shape share a database without mixing."""

from __future__ import annotations

from l2gen.db import KernelDB
from l2gen.ir import BLayout
from l2gen.problem import Measurement, Shape
from l2gen.search.base import Proposal
from l2gen.search.loop import tune
from l2gen.search.policies import EmbeddedPolicy, RandomPolicy
from l2gen.search.simulate import SimulatedEvaluator
from l2gen.space import random_program
from l2gen.targets import GPUS

H200 = GPUS["h200"]
SHAPE = Shape(16, 6144, 4096)


def _layouts(db) -> list[str]:
    return [m.program.b_layout.value for m in db.history(H200, SHAPE)]


class KnOnly:
    """A policy that knows nothing of layouts: it proposes kn programs whatever the run."""

    name = "kn-only"

    def __init__(self):
        import random

        self.rng = random.Random(0)

    def propose(self, shape, history, n):
        return [Proposal(random_program(self.rng, H200, b_layout=BLayout.KN)) for _ in range(n)]

    def update(self, shape, results):
        pass


def test_an_nk_tune_measures_nk_programs_even_from_a_policy_that_proposes_kn(tmp_path):
    with KernelDB(tmp_path / "k.db") as db:
        summary = tune([SHAPE], KnOnly(), SimulatedEvaluator(H200), db, budget=5, batch=5, gpu=H200, progress=None, b_layout="nk")
        assert _layouts(db) == ["nk"] * 5
    assert summary.results[SHAPE].measured == 5


def test_kn_and_nk_tunes_of_one_shape_each_get_their_budget_and_their_own_history(tmp_path):
    with KernelDB(tmp_path / "k.db") as db:
        tune([SHAPE], RandomPolicy(H200, seed=1), SimulatedEvaluator(H200), db, budget=4, batch=4, gpu=H200, progress=None)
        assert _layouts(db) == ["kn"] * 4
        summary = tune([SHAPE], RandomPolicy(H200, seed=2, b_layout=BLayout.NK), SimulatedEvaluator(H200), db, budget=4, batch=4,
                       gpu=H200, progress=None, b_layout=BLayout.NK)
        assert summary.results[SHAPE].resumed == 0  # the kn rows are not this tune's history
        assert sorted(_layouts(db)) == ["kn"] * 4 + ["nk"] * 4
        again = tune([SHAPE], RandomPolicy(H200, seed=3, b_layout=BLayout.NK), SimulatedEvaluator(H200), db, budget=4, batch=4,
                     gpu=H200, progress=None, b_layout=BLayout.NK)
        assert again.results[SHAPE].resumed == 4 and len(_layouts(db)) == 8  # resumed, nothing more to measure


def test_an_nk_tune_starts_the_embedded_policy_from_nk_bests_only(tmp_path):
    other = Shape(32, 6144, 4096)
    with KernelDB(tmp_path / "k.db") as db:
        tune([other], RandomPolicy(H200, seed=1), SimulatedEvaluator(H200), db, budget=3, batch=3, gpu=H200, progress=None)
        policy = EmbeddedPolicy(H200, seed=0, b_layout=BLayout.NK)
        tune([SHAPE], policy, SimulatedEvaluator(H200), db, budget=3, batch=3, gpu=H200, progress=None, b_layout="nk")
        assert str(other) not in policy.elite  # only kn programs were measured there
        assert set(_layouts(db)) == {"nk"}


def test_a_shapes_budget_per_layout_in_the_database(tmp_path):
    import random

    rng = random.Random(0)
    with KernelDB(tmp_path / "k.db") as db:
        for layout in (BLayout.KN, BLayout.KN, BLayout.NK):
            program = random_program(rng, H200, b_layout=layout)
            assert db.add_new(Measurement(SHAPE, program, "ok", time_us=10.0, baseline_us=9.0), H200, "t", {}, budget=2,
                              per_layout=True) is not None
        kn = random_program(rng, H200, b_layout=BLayout.KN)
        assert db.add_new(Measurement(SHAPE, kn, "ok", time_us=10.0, baseline_us=9.0), H200, "t", {}, budget=2, per_layout=True) is None
        assert db.add_new(Measurement(SHAPE, kn, "ok", time_us=10.0, baseline_us=9.0), H200, "t", {}, budget=4) is not None
