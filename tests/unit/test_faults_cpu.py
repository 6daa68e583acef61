"""Faults in the tune loop without a GPU: nvcc killed mid-build, a full disk while the
cache is written, a corrupt cache entry, a worker (evaluator) that dies mid-batch, a
corrupt database page. Each time the loop goes on or stops with a message, and nothing
measured before is lost."""

from __future__ import annotations

import errno
import json
import pathlib
import sqlite3

import pytest

from l2gen.build import build, cache_dir
from l2gen.cli import main
from l2gen.db import KernelDB
from l2gen.problem import Measurement, Shape
from l2gen.search.loop import TuneError, tune
from l2gen.search.policies import RandomPolicy
from l2gen.search.simulate import SimulatedEvaluator
from l2gen.targets import GPUS
from tests.unit.test_build import calls, env, leftovers, source  # noqa: F401  (env is a fixture)

H200 = GPUS["h200"]


def test_nvcc_killed_mid_build_is_a_failure_that_is_not_cached(env):  # noqa: F811
    first = build(source("FAKE_KILLED"))
    assert not first.ok and first.library is None
    assert "-9" in first.error or "signal" in first.error.lower() or "killed" in first.error.lower()
    assert leftovers() == []
    second = build(source("FAKE_KILLED"))  # not cached: it may not fail the next time
    assert not second.cached and calls(env) == 2


def test_a_corrupt_cache_entry_is_rebuilt_never_loaded(env):  # noqa: F811
    src = source()
    first = build(src)
    assert first.ok
    first.library.write_bytes(b"\x7fELF garbage: a disk error, a half-copied cache")
    second = build(src)
    assert second.ok and not second.cached, "a corrupt library was loaded from the cache"
    assert second.library.read_text() == src.code and calls(env) == 2
    assert build(src).cached  # and the rebuilt entry is trusted again


def test_a_cache_entry_without_its_recorded_digest_is_rebuilt(env):  # noqa: F811
    src = source()
    first = build(src)
    meta_path = first.library.parent / "build.json"
    meta = json.loads(meta_path.read_text())
    del meta["sha256"]
    meta_path.write_text(json.dumps(meta))
    assert not build(src).cached


def test_a_full_disk_while_writing_the_cache_is_a_failed_result_and_leaves_nothing(env, monkeypatch):  # noqa: F811
    real = pathlib.Path.write_text

    def full(self, *args, **kwargs):
        if self.name == "build.json":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "write_text", full)
    result = build(source())
    assert not result.ok and "No space left" in result.error
    assert leftovers() == []
    assert not any(p.name == "lib.so" for p in cache_dir().rglob("lib.so"))
    monkeypatch.setattr(pathlib.Path, "write_text", real)  # space again: it builds
    assert build(source()).ok


class DiesMidBatch(SimulatedEvaluator):
    """Lands the first result of its second batch, then dies as a killed worker would."""

    batches = 0

    def evaluate(self, shape, proposals, on_result=None):
        type(self).batches += 1
        if type(self).batches < 2:
            return super().evaluate(shape, proposals, on_result)
        first = super().evaluate(shape, proposals[:1])
        on_result(0, first[0])
        raise ConnectionResetError("the measuring worker died")


def test_a_worker_killed_mid_batch_stops_the_loop_with_a_message_and_keeps_every_result(tmp_path):
    with KernelDB(tmp_path / "k.db") as db:
        with pytest.raises(TuneError, match="measuring a batch failed .*worker died.* run the same command again"):
            tune([Shape(64, 4096, 4096)], RandomPolicy(H200, seed=0), DiesMidBatch(H200), db, budget=8, batch=4, gpu=H200,
                 progress=False)
        assert db.count() == 5  # the whole first batch and the one result that landed of the second
        # Resuming goes on from there.
        summary = tune([Shape(64, 4096, 4096)], RandomPolicy(H200, seed=1), SimulatedEvaluator(H200), db, budget=8, batch=4,
                       gpu=H200, progress=False)
        assert summary.results[Shape(64, 4096, 4096)].resumed == 5 and db.count() == 8


def _corrupt_pages(path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    page = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    data = bytearray(path.read_bytes())
    for p in range(2, len(data) // page):
        data[p * page + 100 : p * page + 400] = b"\xff" * 300
    path.write_bytes(data)


def test_a_corrupt_database_page_is_a_clear_error_not_a_traceback(tmp_path, capsys):
    db = tmp_path / "k.db"
    assert main(["tune", "--simulate", "--budget", "24", "--shape", "64x4096x4096", "--shape", "128x4096x4096", "--db", str(db)]) == 0
    _corrupt_pages(db)
    capsys.readouterr()
    assert main(["tune", "--simulate", "--budget", "30", "--shape", "64x4096x4096", "--db", str(db)]) == 1
    err = capsys.readouterr().err
    assert "E-DB" in err and "malformed" in err and "Traceback" not in err
    assert main(["db", "show", "--db", str(db)]) == 1
    assert "E-DB" in capsys.readouterr().err


def test_a_database_write_that_fails_mid_run_keeps_every_earlier_row(tmp_path):
    class FailsOnThird(KernelDB):
        writes = 0

        def add_new(self, *args, **kwargs):
            type(self).writes += 1
            if type(self).writes == 3:
                from l2gen.db import DatabaseError

                raise DatabaseError(f"{self.path}: database or disk is full")
            return super().add_new(*args, **kwargs)

    from l2gen.db import DatabaseError

    with FailsOnThird(tmp_path / "k.db") as db:
        with pytest.raises(DatabaseError, match="disk is full"):
            tune([Shape(64, 4096, 4096)], RandomPolicy(H200, seed=0), SimulatedEvaluator(H200), db, budget=8, batch=4, gpu=H200,
                 progress=False)
        assert db.count() == 2
    with KernelDB(tmp_path / "k.db") as again:
        assert len(again.history(H200, Shape(64, 4096, 4096))) == 2
