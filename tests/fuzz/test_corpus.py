"""The fuzz corpus (tests/fuzz/cases.json, inputs in tests/fuzz/corpus/, written by
make_corpus.py): every malformed or adversarial input to the CLI ends in its exit class
with a message and no traceback, writes nothing but what the command line names, and
leaves a file it was not asked to write (a foreign database included) as it was.
No nvcc, no GPU: the commands that would need them are refused before they start."""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from l2gen.cli import main

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
CASES = json.loads((HERE / "cases.json").read_text())
SIDECARS = ("-wal", "-shm", "-journal")


def test_the_corpus_is_big_enough():
    assert len(CASES) >= 200
    assert sum(c["expect"] != "ok" for c in CASES) >= 200


# -- inputs that are built, not stored (SQLite files) ---------------------------------------


def _sqlite(path: Path, *statements: str) -> None:
    conn = sqlite3.connect(path)
    for s in statements:
        conn.execute(s)
    conn.commit()
    conn.close()


def _l2gen_db(path: Path, *, simulate: bool) -> None:
    argv = ["tune", "--budget", "2", "--shape", "64x4096x4096", "--db", str(path), "--simulate"]
    if simulate:
        assert main(argv) == 0
        return
    from l2gen.db import KernelDB
    from l2gen.problem import Measurement, Shape
    from l2gen.space import assemble
    from l2gen.ir import Family

    with KernelDB(path) as db:
        program = assemble(Family.SM90, dict(bm=128, bn=128, bk=64))
        db.add(Measurement(Shape(64, 4096, 4096), program, "ok", time_us=9.0, baseline_us=10.0), "h200", "bench", {"nvcc": "13.0.88"})


def prepare(name: str, tmp: Path) -> list[Path]:
    """Build a case's prepared input(s) in ``tmp``; returns their paths."""
    x = tmp / "x.db"
    if name == "simulated_db":
        _l2gen_db(tmp / "s.db", simulate=True)
        return [tmp / "s.db"]
    if name == "measured_db":
        _l2gen_db(x, simulate=False)
    elif name == "foreign_with_meta":
        _sqlite(x, "CREATE TABLE meta (key, value)", "INSERT INTO meta VALUES ('owner', 'app')", "CREATE TABLE users (name)")
    elif name == "foreign_without_meta":
        _sqlite(x, "CREATE TABLE users (name)", "INSERT INTO users VALUES ('ada')")
    elif name == "foreign_meta_and_measurements":
        _sqlite(x, "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)", "INSERT INTO meta VALUES ('schema_version', '3')",
                "CREATE TABLE measurements (id INTEGER PRIMARY KEY, sensor TEXT, reading REAL)")
    elif name == "text_file":
        x.write_text("SQLite format 3 is what this is not\n" * 50)
    elif name == "random_bytes":
        x.write_bytes(hashlib.sha256(b"l2gen").digest() * 512)
    elif name in ("truncated_db", "corrupt_pages", "newer_schema"):
        _l2gen_db(x, simulate=True)
        conn = sqlite3.connect(x)
        if name == "newer_schema":
            conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
            conn.commit()
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("PRAGMA journal_mode=DELETE")
        conn.close()
        data = bytearray(x.read_bytes())
        if name == "truncated_db":
            data = data[:1500]
        elif name == "corrupt_pages":
            for p in range(1, len(data) // 4096):
                data[p * 4096 + 8 : p * 4096 + 600] = b"\xa5" * 592
        x.write_bytes(bytes(data))
    else:
        raise AssertionError(f"unknown prepare step {name!r}")
    return [x]


# -- the run --------------------------------------------------------------------------------


def _tree(root: Path) -> dict[str, str]:
    out = {}
    for p in root.rglob("*"):
        rel = p.relative_to(root).as_posix()
        out[rel + ("/" if p.is_dir() else "")] = "" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _allowed(rel: str, writes: list[str]) -> bool:
    base = rel
    for suffix in SIDECARS:
        if base.endswith(suffix):
            base = base[: -len(suffix)]
    return any(base == w or base.startswith(w) if w.endswith("/") else base == w for w in writes)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_case(case, tmp_path, monkeypatch, capsys):
    for var in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "L2GEN_LLM_MODEL", "L2GEN_LLM_MODE", "L2GEN_DB"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("L2GEN_CACHE_DIR", str(tmp_path / "cache"))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    prepared = prepare(case["prepare"], work) if case.get("prepare") else []
    input_path = None
    if "input" in case:
        input_path = work / case["input"]
        shutil.copyfile(HERE / "corpus" / case["input"], input_path)
    writes = [w.replace("{input}", case.get("input", "")) for w in case.get("writes", [])]
    before = _tree(work)
    argv = [a.replace("{input}", str(input_path)).replace("{tmp}", str(work)).replace("{root}", str(ROOT)) for a in case["argv"]]

    rc = main(argv)  # an exception escaping main is a traceback: the test fails with it

    err = capsys.readouterr().err
    expect = case["expect"]
    if expect == "ok":
        assert rc == 0, err[-2000:]
    elif expect == "bad":
        assert rc in (1, 2), f"exit {rc}: {err[-2000:]}"
    elif expect == "any":
        assert rc in (0, 1, 2), f"exit {rc}: {err[-2000:]}"
    else:
        assert rc == expect, f"exit {rc}, not {expect}: {err[-2000:]}"
    if rc != 0:
        assert err.strip(), "an error with no message"
    assert "Traceback" not in err
    after = _tree(work)
    changed = sorted(rel for rel in after.keys() | before.keys() if after.get(rel) != before.get(rel) and not rel.startswith("cache/"))
    unexpected = [rel for rel in changed if not _allowed(rel, writes)]
    assert not unexpected, f"wrote what the command line did not name: {unexpected}"
    if case.get("unchanged") and input_path is not None:
        assert after.get(input_path.name) == before.get(input_path.name), "the input was changed"
    for p in prepared:
        if p.name not in writes:
            assert after.get(p.name) == before.get(p.name), f"{p.name} was changed"
