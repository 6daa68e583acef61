"""The kernel library: the shipped configurations, their knob settings, the model's order,
building it, and tuning that starts from it."""

from __future__ import annotations

import math

import pytest

from l2gen.search import library
from l2gen.check import check
from l2gen.cli import main
from l2gen.diagnostics import DiagnosticError
from l2gen.ir import BLayout, Family, Knobs
from l2gen.lower import build_program
from l2gen.printer import format_program
from l2gen.problem import Measurement, Shape, program_key
from l2gen.runtime import device_count
from l2gen.search.base import Proposal
from l2gen.search.library_first import LIBRARY_KIND, LibraryFirst
from l2gen.search.simulate import model_us
from l2gen.targets import GPUS

H200 = GPUS["h200"]


@pytest.fixture(scope="module")
def shipped():
    return library.load(H200)


def test_the_shipped_library_is_a_few_dozen_distinct_checked_configurations(shipped):
    assert 12 <= len(shipped) <= 64
    builds = {format_program(build_program(p)) for p in shipped}
    assert len(builds) == len(shipped)  # no two build the same library
    assert all(p.knobs == Knobs() for p in shipped)
    assert all(not [d for d in check(p, H200) if d.is_error] for p in shipped)
    # every family, and both B layouts of l2gen's own kernel
    assert {p.family for p in shipped} == set(Family)
    assert {p.b_layout for p in shipped if p.family is Family.SM90_L2GEN} == set(BLayout)


def test_knob_settings_keep_the_build_and_fit_the_shape(shipped):
    shape = Shape(64, 1024, 1024)
    for program in shipped:
        settings = library.knob_settings(program, shape, H200)
        assert settings, program.name
        assert len({format_program(s) for s in settings}) == len(settings)
        k_tiles = -(-shape.k // program.config.tile.k)
        for s in settings:
            assert format_program(build_program(s)) == format_program(build_program(program))
            assert 1 <= s.knobs.splits <= k_tiles
            assert not [d for d in check(s, H200) if d.is_error]
    # a splitting configuration offers several split counts, a non-splitting one only 1
    splitting = next(p for p in shipped if p.name == "nk_16x64x128_swap_s8_atomic")
    assert {s.knobs.splits for s in library.knob_settings(splitting, shape, H200)} >= {1, 2, 4, 8}
    plain = next(p for p in shipped if p.name == "tiny_sm80")
    assert {s.knobs.splits for s in library.knob_settings(plain, shape, H200)} == {1}


def test_ranked_takes_each_configurations_best_first_by_the_model(shipped):
    shape = Shape(1, 4096, 4096)
    top = library.ranked(shipped, shape, H200, 12, b_layout=BLayout.NK)
    assert len(top) == 12
    assert all(p.b_layout is BLayout.NK for p in top)
    configs = [format_program(build_program(p)) for p in top]
    distinct = len(set(configs))
    assert configs[:distinct] == list(dict.fromkeys(configs))  # one setting per configuration, then seconds
    firsts = [model_us(p, shape, H200) for p in top[:distinct]]
    assert firsts == sorted(firsts)
    for p in top[:distinct]:  # each is its configuration's best setting
        best = min(model_us(s, shape, H200) for s in library.knob_settings(p, shape, H200))
        assert model_us(p, shape, H200) == pytest.approx(best)
    skip = {program_key(top[0])}
    assert program_key(library.ranked(shipped, shape, H200, 1, b_layout=BLayout.NK, exclude=skip)[0]) not in skip


def test_a_bad_library_names_its_file(tmp_path):
    with pytest.raises(DiagnosticError, match="no kernel library"):
        library.load(H200, tmp_path)
    (tmp_path / "a.l2").write_text("kernel a {\n arch sm80\n tile 64 x 64 x 32\n}\n")
    (tmp_path / "b.l2").write_text("kernel b {\n arch sm80\n tile 100 x 64 x 32\n}\n")
    (tmp_path / "c.l2").write_text("kernel c {\n arch sm80\n tile 64 x\n}\n")
    with pytest.raises(DiagnosticError) as exc:
        library.load(H200, tmp_path)
    text = str(exc.value)
    assert "b.l2:3" in text and "tile BM 100" in text and "c.l2" in text
    (tmp_path / "b.l2").unlink()
    (tmp_path / "c.l2").unlink()
    (tmp_path / "d.l2").write_text("kernel d {\n arch sm80\n tile 64 x 64 x 32\n raster along_m\n}\n")
    assert len(library.load(H200, tmp_path)) == 1  # d only differs from a in a knob


class _Inner:
    name = "inner"

    def __init__(self):
        self.updates = []
        self.asked = []
        self.primed = False

    def propose(self, shape, history, n):
        self.asked.append(n)
        return [Proposal(library.load(H200)[0], "inner") for _ in range(n)]

    def update(self, shape, results):
        self.updates.append(results)

    def prime(self, db):
        self.primed = True


def test_library_first_spends_its_share_then_hands_over(shipped):
    inner = _Inner()
    policy = LibraryFirst(inner, shipped, H200, budget=16, share=0.5, b_layout=BLayout.NK)
    shape = Shape(16, 4096, 4096)
    first = policy.propose(shape, [], 6)
    assert len(first) == 6 and all(p.meta["kind"] == LIBRARY_KIND for p in first)
    assert inner.asked == []
    measured = [Measurement(shape, p.program, "ok", time_us=10.0, baseline_us=11.0) for p in first]
    second = policy.propose(shape, measured, 6)  # 2 left of the share of 8, then the inner policy's
    assert [p.meta.get("kind") for p in second[:2]] == [LIBRARY_KIND] * 2 and inner.asked == [4]
    assert {program_key(p.program) for p in second[:2]}.isdisjoint(program_key(p.program) for p in first)
    assert policy.propose(shape, measured, 3) and inner.asked == [4, 3]
    other = policy.propose(Shape(1, 4096, 4096), [], 2)  # every shape has its own share
    assert all(p.meta["kind"] == LIBRARY_KIND for p in other)
    policy.update(shape, list(zip(first, measured)))
    assert inner.updates and inner.updates[0][0][0] is first[0]
    policy.prime(None)  # what the tuning loop asks of the policy reaches the wrapped one
    assert inner.primed and policy.name == "inner"
    with pytest.raises(ValueError):
        LibraryFirst(inner, shipped, H200, budget=8, share=1.5)


def test_library_first_does_not_repeat_what_is_measured(shipped):
    shape = Shape(64, 1024, 16384)
    policy = LibraryFirst(_Inner(), shipped, H200, budget=8, share=1.0, b_layout=BLayout.NK)
    done = library.ranked(shipped, shape, H200, 3, b_layout=BLayout.NK)
    history = [Measurement(shape, p, "ok", time_us=10.0, baseline_us=11.0) for p in done]
    fresh = policy.propose(shape, history, 4)
    assert {program_key(p.program) for p in fresh}.isdisjoint(program_key(p) for p in done)


def test_build_library_builds_every_configuration_once(tmp_path, monkeypatch, capsys):
    import l2gen.build
    from l2gen.build import BuildResult

    built = []

    def fake_build_many(sources, **kw):
        built.extend(sources)
        return [BuildResult(s, tmp_path / f"{s.entry}.so") for s in sources]

    monkeypatch.setattr(l2gen.build, "build_many", fake_build_many)
    assert main(["build", "--library"]) == 0
    assert len(built) == len(library.load(H200))
    assert len({s.entry for s in built}) == len(built)
    assert all(s.program.knobs == Knobs() for s in built)
    assert str(library.library_dir(H200)) in capsys.readouterr().out
    assert main(["build", "--library", str(tmp_path)]) == 1  # no *.l2 there
    assert "no kernel library" in capsys.readouterr().err


def test_tune_library_measures_library_settings_first(tmp_path, capsys):
    from l2gen.db import KernelDB

    db = tmp_path / "sim.db"
    shape = "64x1024x16384"
    assert main(["tune", "--simulate", "--library", "--library-share", "0.5", "--shape", shape, "--b", "nk",
                 "--budget", "8", "--batch", "4", "--db", str(db), "--fresh-policy", "--model-gate", "off"]) == 0
    assert "kernel library: " in capsys.readouterr().err
    shipped = library.load(H200)
    expected = {program_key(p) for p in library.ranked(shipped, Shape(64, 1024, 16384), H200, 4, b_layout=BLayout.NK)}
    with KernelDB(db) as kdb:
        rows = kdb.history(H200, Shape(64, 1024, 16384))
    assert len(rows) == 8
    assert {program_key(m.program) for m in rows[:4]} == expected
    assert main(["tune", "--simulate", "--library-share", "2", "--shape", shape]) == 2


# ---- the learned ranking -------------------------------------------------------------


def _biased_rows(shipped, shapes):
    """Rows whose 'measured' time is the analytic model's, made 3x slower for every split
    (a systematic error the analytic model does not know)."""
    rows = []
    for shape in shapes:
        for program in shipped:
            if program.b_layout is not BLayout.NK:
                continue
            for s in library.knob_settings(program, shape, H200)[::7]:
                rows.append((s, shape, model_us(s, shape, H200) * (3.0 if s.knobs.splits > 1 else 1.0)))
    return rows


def test_a_learned_model_ranks_a_new_shape_by_what_was_measured_on_others(shipped):
    from l2gen.search.learned import LearnedModel, spearman
    train = _biased_rows(shipped, [Shape(1, 4096, 4096), Shape(16, 8192, 2048), Shape(64, 2048, 8192), Shape(32, 6144, 4096)])
    model = LearnedModel(H200).fit(train)
    assert len(model) == len(train)
    new = Shape(16, 4096, 14336)
    test = _biased_rows(shipped, [new])
    programs, truth = [p for p, _, _ in test], [t for _, _, t in test]
    learned = spearman(model.predict_us(programs, new), truth)
    analytic = spearman([model_us(p, new, H200) for p in programs], truth)
    assert learned > analytic + 0.1 and learned > 0.8
    # the library's order follows the model given to it
    top = library.ranked(shipped, new, H200, 5, b_layout=BLayout.NK, score=model.predict_us)
    assert all(p.knobs.splits == 1 for p in top)
    assert LearnedModel(H200).predict_us(programs[:2], new) == [model_us(p, new, H200) for p in programs[:2]]
    assert spearman([1, 2, 3, 3], [10, 20, 30, 30]) == pytest.approx(1.0)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0) and spearman([1, 1, 1], [1, 2, 3]) == 0.0


def test_a_program_that_measured_apart_on_nearby_shapes_is_ranked_so_on_a_new_one(shipped):
    """What the regression's features learn only in part, the program's own record on nearby
    shapes adds: of two programs measured at half and twice the time the rest of their rows
    say, on the training shapes, the first is predicted faster and the second slower on a
    shape between those than by the regression alone, their ratio moved by more than half
    the 4x skew's square root. A far-away record moves a prediction far less; a program
    never measured gets no correction."""
    from l2gen.search.learned import LearnedModel

    rows = _biased_rows(shipped, [Shape(16, 4096, 4096), Shape(16, 8192, 4096), Shape(32, 4096, 8192)])
    a, b = rows[0][0], rows[1][0]
    new, far = Shape(16, 6144, 4096), Shape(4096, 64, 64)
    skewed = [(p, s, t * (0.5 if p == a else 2.0 if p == b else 1.0)) for p, s, t in rows]
    model = LearnedModel(H200).fit(skewed)
    plain = dict(zip("ab", model.predict_us([a, b], new)))
    model.neighbours = False
    ridge = dict(zip("ab", model.predict_us([a, b], new)))
    model.neighbours = True
    assert plain["a"] < ridge["a"] and plain["b"] > ridge["b"]
    assert plain["a"] / plain["b"] < 0.7 * ridge["a"] / ridge["b"]
    near_shift = abs(math.log(plain["a"] / ridge["a"]))
    far_plain, = model.predict_us([a], far)
    model.neighbours = False
    far_ridge, = model.predict_us([a], far)
    model.neighbours = True
    assert abs(math.log(far_plain / far_ridge)) < 0.1 * near_shift
    unseen = next(s for s in library.knob_settings(shipped[-1], new, H200) if program_key(s) not in {program_key(p) for p, _, _ in rows})
    model.neighbours = False
    alone, = model.predict_us([unseen], new)
    model.neighbours = True
    assert model.predict_us([unseen], new) == [alone]


def test_a_learned_model_needs_enough_measurements(tmp_path, shipped):
    from l2gen.db import KernelDB
    from l2gen.search.learned import MIN_ROWS, LearnedModel

    with KernelDB(tmp_path / "k.db") as db:
        rows = _biased_rows(shipped, [Shape(16, 4096, 4096)])[: MIN_ROWS - 1]
        for p, s, t in rows:
            db.add(Measurement(s, p, "ok", time_us=t, baseline_us=t), H200)
        assert LearnedModel.from_dbs([db], H200) is None
        p, s, t = _biased_rows(shipped, [Shape(16, 2048, 4096)])[0]
        db.add(Measurement(s, p, "ok", time_us=t, baseline_us=t), H200)
        db.add(Measurement(s, p, "wrong", time_us=t, baseline_us=t), H200)  # never learned from
        model = LearnedModel.from_dbs([db], H200)
        assert model is not None and len(model) == MIN_ROWS
        assert LearnedModel.from_dbs([db], H200, b_layout=BLayout.KN) is None


@pytest.mark.skipif(device_count() > 0, reason="on a GPU the tune would run")
def test_tune_library_learns_its_ranking_from_the_shipped_measurements(tmp_path, capsys, monkeypatch):
    """Without a GPU the tune stops at the evaluator, after the library's ranking is fit on
    the shipped measurements: the serving database's rows and the measured rows of every
    committed benchmark (l2gen/data/measured_h200.db), both B layouts; one-call times only
    (not the back-to-back judgements beside them)."""
    import re
    import sqlite3

    from l2gen.search.learned import measured_db_path

    monkeypatch.delenv("L2GEN_DB", raising=False)
    assert main(["tune", "--library", "--shape", "64x4096x4096", "--b", "nk", "--db", str(tmp_path / "k.db")]) == 1
    err = capsys.readouterr().err
    assert "E-GPU" in err
    learned = int(re.search(r"ranked by a model learned from (\d+) measurements", err).group(1))
    measured = measured_db_path(H200)
    assert measured is not None
    with sqlite3.connect(f"file:{measured}?mode=ro", uri=True) as con:
        rows = con.execute("SELECT count(*) FROM (SELECT DISTINCT program_key, m, n, k, time_us, baseline_us "
                           "FROM measurements WHERE status = 'ok' AND l2 = 'clean' AND policy != 'bench-loop')").fetchone()[0]
    assert rows > 1000
    assert learned == rows  # the serving database's rows are among them, each counted once
