"""Tuning and serving under a cap on a launch's CTAs (the knob grid): cap_grid lowers a
persistent program's grid to whole clusters under the cap and refuses a kernel that
launches a CTA per tile; GridCapped keeps a policy's proposals to the cap, leaves out the
rest and asks again; ``l2gen tune --grid`` measures only capped programs."""

from __future__ import annotations

import pytest

from l2gen.cli import main
from l2gen.ir import Decomposition, Family, Mainloop, SplitK
from l2gen.problem import Shape, program_key
from l2gen.search.base import Proposal
from l2gen.search.grid_cap import GridCapped
from l2gen.space import assemble, cap_grid, grid_applies, launch_ctas
from l2gen.targets import GPUS

H200 = GPUS["h200"]


def l2(**choices):
    return assemble(Family.SM90_L2GEN, dict(bm=128, bn=128, bk=64, stages=4, **choices))


def cutlass(**choices):
    return assemble(Family.SM90, dict(bm=128, bn=128, bk=64, **choices))


def test_cap_grid_lowers_to_whole_clusters_and_keeps_a_lower_cap():
    assert cap_grid(l2(), 100).knobs.grid == 100
    assert cap_grid(cutlass(cluster=(4, 1)), 102).knobs.grid == 100  # whole clusters of 4
    assert cap_grid(l2(grid=64), 100).knobs.grid == 64  # its own, lower cap stays
    assert cap_grid(l2(grid=128), 100).knobs.grid == 100
    for refused in (cutlass(mainloop=Mainloop.WS), l2(split_k=SplitK.CLUSTER),
                    assemble(Family.SM80, dict(bm=128, bn=128, bk=32))):
        assert not grid_applies(refused)
        with pytest.raises(ValueError, match="a CTA"):
            cap_grid(refused, 100)
    with pytest.raises(ValueError, match="clusters are of 8"):
        cap_grid(l2(cluster=(8, 1)), 6)


class Scripted:
    """A policy that proposes from a script, a batch per call, and records its updates."""

    name = "scripted"

    def __init__(self, batches):
        self.batches = list(batches)
        self.updates = []

    def propose(self, shape, history, n):
        return [Proposal(p, "scripted") for p in (self.batches.pop(0) if self.batches else [])][:n]

    def update(self, shape, results):
        self.updates.append(results)


def test_grid_capped_caps_leaves_out_and_asks_again():
    inner = Scripted([[l2(), cutlass(mainloop=Mainloop.WS), l2(grid=64)], [l2(split_k=SplitK.CLUSTER)], [cutlass()], [l2()]])
    policy = GridCapped(inner, 96)
    out = policy.propose(Shape(64, 4096, 4096), [], 3)
    assert [p.program.knobs.grid for p in out] == [96, 64, 96]
    assert [p.program.family for p in out] == [Family.SM90_L2GEN, Family.SM90_L2GEN, Family.SM90]
    assert policy.left_out == 2  # the CTA-per-tile kernels
    assert policy.name == "scripted" and len(policy.batches) == 1  # the wrapped policy's attributes; asked 3 times
    policy.update(Shape(64, 4096, 4096), [])
    assert inner.updates == [[]]
    with pytest.raises(ValueError):
        GridCapped(inner, 0)


def test_tune_with_a_grid_measures_only_capped_programs(tmp_path, capsys):
    from l2gen.db import KernelDB

    db = tmp_path / "sim.db"
    assert main(["tune", "--simulate", "--library", "--shape", "1024x1024x1024", "--budget", "8", "--batch", "4",
                 "--grid", "96", "--db", str(db), "--fresh-policy"]) == 0
    err = capsys.readouterr().err
    assert "at most 96 CTAs" in err and "left out" in err
    with KernelDB(db) as kdb:
        rows = kdb.history(H200, Shape(1024, 1024, 1024))
    assert len(rows) == 8
    # every launch within the cap: capped, or (a cap over its CTAs being no cap) of fewer CTAs
    assert all(grid_applies(m.program) and 0 <= m.program.knobs.grid <= 96 for m in rows)
    assert all(m.program.knobs.grid or launch_ctas(m.program, 1024, 1024, 1024) <= 96 for m in rows)
    assert len({program_key(m.program) for m in rows}) == 8


def test_the_loop_measures_a_cap_over_a_launchs_ctas_as_no_cap(tmp_path):
    """A policy's cap at or above the CTAs its launch uses is the uncapped launch: stored
    as that, and not measured twice."""
    from l2gen.db import KernelDB
    from l2gen.search.loop import tune
    from l2gen.search.simulate import SimulatedEvaluator

    shape = Shape(256, 1024, 4096)  # 16 tiles of 128 x 128
    inner = Scripted([[l2(), l2(grid=64), l2(grid=96)], [l2(grid=8)]])
    with KernelDB(tmp_path / "sim.db") as db:
        tune([shape], inner, SimulatedEvaluator(H200), db, budget=2, batch=3, gpu=H200, progress=False)
        rows = db.history(H200, shape)
    assert sorted(m.program.knobs.grid for m in rows) == [0, 8]


def test_the_library_leaves_out_caps_that_change_no_launch():
    from l2gen.search.library import knob_settings
    from l2gen.space import launch_ctas

    plain, atomic = l2(), l2(split_k=SplitK.ATOMIC)
    assert launch_ctas(plain, 256, 1024, 4096) == 2 * 8
    assert launch_ctas(atomic.with_knobs(splits=4), 256, 1024, 4096) == 2 * 8 * 4
    assert launch_ctas(atomic.with_knobs(decomposition=Decomposition.STREAM_K), 256, 1024, 4096) == 16 * 64
    assert launch_ctas(cutlass(cluster=(2, 1)), 300, 1000, 512) == 4 * 8  # 3 tiles along M: 2 clusters
    few = knob_settings(plain, Shape(256, 1024, 4096), H200)  # 16 tiles: every cap is over them
    assert few and not any(s.knobs.grid for s in few)
    many = knob_settings(plain, Shape(4096, 4096, 4096), H200)  # 1024 tiles
    assert {s.knobs.grid for s in many} == {0, 64, 96, 112, 128}
    split = knob_settings(atomic, Shape(256, 1024, 4096), H200)  # 16 tiles x up to 8 splits
    assert any(s.knobs.grid == 64 and s.knobs.splits == 8 for s in split)
    assert not any(s.knobs.grid and s.knobs.grid >= launch_ctas(s, 256, 1024, 4096) for s in split)
