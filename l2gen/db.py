"""The kernel database: every measured candidate, and the best program per (GPU, shape).

One SQLite file per target GPU and timing protocol. Table ``measurements`` holds one row
per measured candidate (failures too: they are what keeps a resumed search from
re-measuring them), each with the L2 protocol it was timed under (``l2``, see
:mod:`l2gen.protocol`); view ``best`` has the fastest verified program per (gpu, arch, m,
n, k, l2), ranked by speedup over cuBLAS-best measured in the same run; table ``meta``
records the schema version, the GPU and the L2 protocol the database belongs to. A
database recorded on one GPU refuses measurements or lookups for another
(:meth:`KernelDB.check_gpu`): timings do not transfer between devices. Likewise a
database of one L2 protocol refuses measurements of another (:meth:`KernelDB.check_l2`):
a speedup timed after a written flush is not evidence about a clean-cold L2. And a
database holds measured rows or simulated ones (``meta`` 'evidence',
:meth:`KernelDB.check_evidence`), never both.

``meta`` 'format' = ``l2gen-kernel-db`` marks a file as ours: an existing file is looked
at read-only first, and one without the marker (or the schema of an l2gen from before
it) is refused before anything, its journal mode included, is written to it.

Schema 1 (before the protocol was recorded) had no ``l2``: every such row was timed after
the written flush, so opening one for writing adds the column with ``dirty`` and claims
the database for ``dirty``; read-only, its rows read as ``dirty`` (the shipped database).

WAL journal, a 30 s busy timeout, one connection per thread, a commit per measurement,
so a tuning run that is killed loses at most the candidate in flight; a tune's rows go in
through :meth:`KernelDB.add_new`, which checks and inserts in one write transaction, so
two processes tuning one database store each candidate once and no shape past its budget.
"""

from __future__ import annotations

import datetime as _dt
import functools
import importlib.metadata
import json
import re
import shutil
import sqlite3
import subprocess
import threading
import time
import warnings
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from .ir import BLayout, Program
from .parse import parse
from .printer import format_program
from .protocol import LEGACY_L2, ProtocolMismatch, check_l2
from .problem import Measurement, Shape, Status, program_key
from .targets import Gpu, is_card
from .toolchain import found_nvcc_version
from .validate import write_atomic

SCHEMA_VERSION = 3  # 2: measurements.l2, meta 'l2'; 3: measurements.fallback_us
# Kernels at least this long are judged back to back too (import_bench), by the less
# favourable of that and one call at a time: past a millisecond a loop of them holds the GPU
# at its power cap, where one call at a time does not (16384^3 on the H200: 1.11x
# torch.matmul one call at a time, 0.93x back to back). Not shorter ones: a bench row's
# back-to-back figure is one ~20 ms batch on one set of buffers, whose clock depends on what
# ran before it and whose operands may sit in the L2 from the call before. At 2048x3584x3584
# on an H100 such batches put l2gen's winner at 0.88x torch.matmul, rotated 160 ms blocks
# on one set of buffers (bench/probe.py --sustained) at 1.05x, and bench --sustained's
# blocks over operand copies that exceed the L2 at 0.96x (one run, three blocks:
# bench/results/2026-12-06-h100-sustained-rot-1e173cc.json).
SUSTAINED_MIN_US = 1000.0
# A row timed in rotated blocks (l2gen bench --sustained) is judged back to back from this
# long: below it a block of calls is bound by the host's launch rate, not the kernel.
SUSTAINED_BLOCK_MIN_US = 20.0
LOOP_POLICY = "bench-loop"  # a row's back-to-back times, beside its one-call row (bench or tune)
FORMAT = "l2gen-kernel-db"  # also meta 'format': what marks an SQLite file as ours
DEFAULT_DB = "l2gen-kernels.db"  # tune's and db's default
SIMULATED_DB = "l2gen-kernels-simulated.db"  # tune --simulate's default: never beside measured rows

# The best program of each (GPU, arch, shape). A program measured more than once on a shape
# is judged by its least favourable verified measurement (a lucky run does not make it the
# best), and one that ever computed a wrong result there is never the best.
# Speedups are judged within one L2 protocol (a program's runs under another do not count
# for or against it); a wrong result under any protocol disqualifies it. ``{rows}`` is the
# table, or for a schema-1 file opened read-only the table with its implied ``l2``.
_JUDGED = """
WITH ok AS (
    SELECT * FROM {rows} WHERE status = 'ok' AND time_us > 0 AND baseline_us > 0
), judged AS (
    SELECT x.gpu, x.arch, x.m, x.n, x.k, x.l2, x.program_text, x.program_key, x.time_us,
           x.baseline_us, x.baseline_us / x.time_us AS speedup, x.relerr, x.policy,
           x.created_at, x.id
    FROM ok AS x
    WHERE x.id = (
        SELECT y.id FROM ok AS y
        WHERE y.gpu = x.gpu AND y.l2 = x.l2 AND y.m = x.m AND y.n = x.n AND y.k = x.k AND y.program_key = x.program_key
        ORDER BY y.baseline_us / y.time_us ASC, y.id ASC
        LIMIT 1
    )
    AND NOT EXISTS (
        SELECT 1 FROM {rows} AS w
        WHERE w.gpu = x.gpu AND w.m = x.m AND w.n = x.n AND w.k = x.k AND w.program_key = x.program_key
          AND w.status = 'wrong'
    )
)
"""
_BEST = _JUDGED + """
SELECT * FROM judged AS j
WHERE j.id = (
    SELECT z.id FROM judged AS z
    WHERE z.gpu = j.gpu AND z.l2 = j.l2 AND z.arch = j.arch AND z.m = j.m AND z.n = j.n AND z.k = j.k
    ORDER BY z.speedup DESC, z.id ASC
    LIMIT 1
)
"""
_ROWS = "measurements"
_ROWS_V1 = f"(SELECT *, '{LEGACY_L2}' AS l2, NULL AS fallback_us FROM measurements)"
_ROWS_V2 = "(SELECT *, NULL AS fallback_us FROM measurements)"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS measurements (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    gpu          TEXT    NOT NULL,
    arch         TEXT    NOT NULL,   -- the program's family: sm80 or sm90a
    m            INTEGER NOT NULL,
    n            INTEGER NOT NULL,
    k            INTEGER NOT NULL,
    program_text TEXT    NOT NULL,   -- canonical DSL text, knobs as measured
    program_key  TEXT    NOT NULL,   -- sha256 of the canonical text, name normalized
    status       TEXT    NOT NULL,   -- ok, rejected, build_error, run_error, wrong, timeout
    time_us      REAL,
    baseline_us  REAL,               -- cuBLAS-best, same run
    relerr       REAL,
    error        TEXT,
    policy       TEXT,
    created_at   TEXT    NOT NULL,   -- UTC, ISO 8601
    env          TEXT    NOT NULL DEFAULT '{}',  -- JSON: nvcc, cutlass, driver, torch, ...
    l2           TEXT    NOT NULL DEFAULT 'dirty',  -- L2 protocol: clean, dirty, warm (l2gen.protocol)
    fallback_us  REAL                -- torch.matmul (the dispatcher's fallback), same run; NULL: not timed
);
CREATE INDEX IF NOT EXISTS measurements_shape ON measurements (gpu, m, n, k);
DROP VIEW IF EXISTS best;
CREATE VIEW best AS
{best}
"""

_SCHEMA = _SCHEMA.replace("{best}", _BEST.strip().replace("{rows}", _ROWS) + ";")
_BEST_VIEW = "CREATE VIEW best AS\n" + _BEST.strip().replace("{rows}", _ROWS)  # as sqlite_master keeps it

_B_LINE = re.compile(r"^\s*b\s+(kn|nk)\s*$", re.MULTILINE)


def _layout_of(program_text: str) -> str:
    """The B layout a stored program's canonical text names (kn where it names none)."""
    match = _B_LINE.search(program_text)
    return match.group(1) if match else "kn"


_COLUMNS = ("gpu", "arch", "m", "n", "k", "program_text", "program_key", "status", "time_us", "baseline_us", "relerr", "error", "policy", "created_at", "env", "l2", "fallback_us")


def _uri(path: Path, query: str) -> str:
    """A ``file:`` URI for ``path`` (``?``, ``#`` and ``%`` in the name quoted)."""
    return f"{path.absolute().as_uri()}?{query}"


def _connect_ro(path: Path) -> sqlite3.Connection:
    """A read-only connection that creates nothing, not even a missing file."""
    try:
        conn = sqlite3.connect(_uri(path, "mode=ro"), uri=True, check_same_thread=False)
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.OperationalError:  # a WAL file in a read-only place (an installed wheel)
        conn = sqlite3.connect(_uri(path, "immutable=1"), uri=True, check_same_thread=False)
    conn.execute("PRAGMA busy_timeout=30000")
    return conn


def _set_wal(conn: sqlite3.Connection, wait: float = 30.0) -> None:
    """Put the database in WAL mode. Switching needs the file to itself and SQLite answers
    "locked" at once, not after its busy timeout, while another process opens or creates
    it: retry until ``wait`` seconds have passed."""
    deadline = time.monotonic() + wait
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if ("locked" not in str(exc) and "busy" not in str(exc)) or time.monotonic() > deadline:
                raise
            time.sleep(0.005)


def _check_ours(path: Path) -> dict | None:
    """Raise :class:`DatabaseError` unless ``path`` is an l2gen kernel database, looked at
    read-only: its ``meta`` table says ``format`` l2gen-kernel-db, or (written before the
    marker) it has l2gen's ``meta`` keys and a ``measurements`` table with l2gen's columns.
    Any other SQLite file (one with a ``meta`` table of its own too) is left untouched.
    Returns its ``meta`` (format, schema_version, gpu) and the SQL of its ``best`` view;
    None for an SQLite file with no schema at all (one another process has just created
    and not yet given its tables: there is nothing in it to keep)."""
    try:
        conn = _connect_ro(path)
    except sqlite3.DatabaseError as exc:
        raise DatabaseError(f"{path}: not a readable l2gen kernel database ({exc}); move it aside or use another database file") from None
    try:
        if conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0:
            return None
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        view = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'view' AND name = 'best'").fetchone()
        meta = {}
        if "meta" in tables:
            try:
                meta = dict(conn.execute("SELECT key, value FROM meta WHERE key IN ('format', 'schema_version', 'gpu')").fetchall())
            except sqlite3.DatabaseError:
                meta = {}
        columns = {r[1] for r in conn.execute("PRAGMA table_info(measurements)")} if "measurements" in tables else set()
    except sqlite3.DatabaseError as exc:
        raise DatabaseError(f"{path}: not a readable l2gen kernel database ({exc}); move it aside or use another database file") from None
    finally:
        conn.close()
    meta["best_view"] = view[0] if view else None
    if meta.get("format") == FORMAT:
        return meta
    legacy = "format" not in meta and "schema_version" in meta and set(_COLUMNS) - {"l2", "fallback_us"} <= columns
    if not legacy:
        raise DatabaseError(f"{path}: an SQLite file, but not an l2gen kernel database (no l2gen schema marker); "
                            "it was left as it was: name another file")
    return meta


class DatabaseError(Exception):
    """The file is not a usable l2gen kernel database (the message names the file)."""


class GpuMismatchError(DatabaseError):
    """The database was recorded on another GPU."""


class ProtocolMismatchError(DatabaseError, ProtocolMismatch):
    """The database holds measurements timed under another L2 protocol."""


class EvidenceMismatchError(DatabaseError):
    """The database holds simulated rows and measured ones were to be added, or the reverse."""


def _env_rows(rows: str, env: dict, card: str | None = None) -> str:
    """``rows`` restricted to measured (not simulated) rows whose env has ``env``'s values
    and, given ``card`` (a target's name, e.g. "h200"), whose recorded device is that card
    where they record one: a tune asked for an H200 but run on a lent H100 files its rows
    under h200, and they say which card timed them (rows from before devices were
    recorded count)."""
    def literal(value) -> str:
        return "'" + str(value).replace("'", "''") + "'"

    where = ["json_extract(env, '$.simulated') IS NULL"]
    for key, value in sorted(env.items()):
        if not str(key).isidentifier():
            raise ValueError(f"not an environment key: {key!r}")
        where.append(f"json_extract(env, '$.{key}') = {literal(value)}")
    if card is not None:
        where.append(f"(json_extract(env, '$.device') IS NULL OR "
                     f"instr(lower(json_extract(env, '$.device')), {literal(card.lower())}) > 0)")
    return f"(SELECT * FROM {rows} AS e WHERE {' AND '.join(where)})"


def _gpu_name(gpu: Gpu | str) -> str:
    return gpu.name if isinstance(gpu, Gpu) else str(gpu).lower()


@functools.lru_cache(maxsize=8192)
def _parse_cached(text: str) -> Program:
    return parse(text, file="<kernel db>")


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")


class KernelDB:
    """An SQLite kernel database at ``path`` (created if missing unless ``readonly``)."""

    def __init__(self, path: str | Path, *, readonly: bool = False):
        self.path = Path(path)
        self.readonly = readonly
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._checked: set[str] = set()
        self._rows = _ROWS
        try:
            if self.path.exists() and not self.path.is_file():
                raise DatabaseError(f"{self.path}: not a file (a kernel database is one SQLite file)")
            if readonly and not self.path.is_file():
                raise DatabaseError(f"{self.path}: no such kernel database")
            existed = self.path.is_file() and self.path.stat().st_size > 0
        except OSError as exc:  # a name too long, a folder that cannot be searched
            raise DatabaseError(f"{str(self.path)[:200]}: cannot use this path: {exc.strerror or exc}") from None
        current = False
        meta = _check_ours(self.path) if existed else None  # before anything writes to it: is it ours?
        existed = meta is not None
        if existed:
            version = meta.get("schema_version")
            if version is None or not version.isdigit() or int(version) > SCHEMA_VERSION:
                raise DatabaseError(f"{self.path}: kernel database schema version {version} is not supported (this l2gen reads "
                                    f"version {SCHEMA_VERSION}); upgrade l2gen")
            current = int(version) == SCHEMA_VERSION and meta.get("format") == FORMAT and meta.get("best_view") == _BEST_VIEW
        try:
            conn = self._conn()
            if not readonly and not current:  # a new file, a migration, or a view to refresh
                if existed and self._meta("schema_version") == "1":
                    self._migrate_v1(conn)
                if existed and self._meta("schema_version") == "2":
                    self._migrate_v2(conn)
                # One transaction: another process opening the file meanwhile sees no schema
                # (a new file, which it may create too) or all of it with its marker, never
                # tables without the marker (which would read as a foreign database).
                conn.executescript(
                    "BEGIN IMMEDIATE;\n" + _SCHEMA
                    + f"INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', '{SCHEMA_VERSION}');\n"
                    + f"INSERT OR IGNORE INTO meta (key, value) VALUES ('format', '{FORMAT}');\nCOMMIT;\n")
            version = self._meta("schema_version")
            if version == "1":  # read-only: its rows were all timed after the written flush
                self._rows = _ROWS_V1
            elif version == "2":  # read-only: no fallback timed
                self._rows = _ROWS_V2
        except sqlite3.DatabaseError as exc:
            self.close()
            raise DatabaseError(f"{self.path}: not a readable l2gen kernel database ({exc}); move it aside or use another database file") from None
        except DatabaseError:
            self.close()
            raise
        if version is None or int(version) > SCHEMA_VERSION:
            self.close()
            raise DatabaseError(f"{self.path}: kernel database schema version {version} is not supported (this l2gen reads version {SCHEMA_VERSION}); upgrade l2gen")

    # -- connections ---------------------------------------------------------------------

    @staticmethod
    def _migrate_v1(conn: sqlite3.Connection) -> None:
        """Schema 1 to 2: every row so far was timed after the written flush ('dirty')."""
        with conn:
            conn.execute("DROP VIEW IF EXISTS best")
            conn.execute(f"ALTER TABLE measurements ADD COLUMN l2 TEXT NOT NULL DEFAULT '{LEGACY_L2}'")
            if conn.execute("SELECT 1 FROM measurements LIMIT 1").fetchone():
                conn.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('l2', ?)", (LEGACY_L2,))
            conn.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")

    @staticmethod
    def _migrate_v2(conn: sqlite3.Connection) -> None:
        """Schema 2 to 3: no row so far recorded the fallback's time (NULL)."""
        with conn:
            conn.execute("DROP VIEW IF EXISTS best")
            conn.execute("ALTER TABLE measurements ADD COLUMN fallback_us REAL")
            conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            return conn
        if self.readonly:
            conn = _connect_ro(self.path)
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(str(self.path), timeout=30, check_same_thread=False)
            _set_wal(conn)
            conn.execute("PRAGMA busy_timeout=30000")
            conn.execute("PRAGMA synchronous=NORMAL")  # WAL: a commit survives a crash of the process
        self._local.conn = conn
        with self._lock:
            self._all.append(conn)
        return conn

    def close(self) -> None:
        """Close every connection this object opened (on any thread)."""
        with self._lock:
            conns, self._all = self._all, []
        for conn in conns:
            try:
                conn.close()
            except sqlite3.Error:
                pass
        self._local = threading.local()

    def __enter__(self) -> "KernelDB":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _meta(self, key: str) -> str | None:
        row = self._conn().execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def _claim(self, key: str, value: str) -> None:
        """Record what an unclaimed database now holds (its GPU, protocol, evidence);
        a read-only database is left as it is."""
        if not self.readonly:
            with self._conn() as conn:
                conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    def _query(self, sql: str, args: tuple = ()) -> list[tuple]:
        try:
            return self._conn().execute(sql, args).fetchall()
        except sqlite3.DatabaseError as exc:
            raise DatabaseError(f"{self.path}: {exc}") from None

    # -- the GPU this database belongs to ------------------------------------------------

    @property
    def gpu(self) -> str | None:
        """The GPU the database was recorded on (None while it is empty and unclaimed)."""
        return self._meta("gpu")

    def check_gpu(self, gpu: Gpu | str, *, strict: bool = True) -> bool:
        """Claim an empty database for ``gpu``, or make sure it was recorded on it.

        A mismatch raises :class:`GpuMismatchError` (or, with ``strict=False``, warns and
        returns False): kernels tuned on one GPU are not evidence about another.
        """
        name = _gpu_name(gpu)
        if name in self._checked:
            return True
        recorded = self.gpu
        if recorded is None:
            others = [r[0] for r in self._query("SELECT DISTINCT gpu FROM measurements WHERE gpu != ?", (name,))]
            recorded = others[0] if others else None
        if recorded is not None and recorded != name:
            message = f"{self.path} holds kernels measured on {recorded}, not {name}; timings do not transfer between GPUs: use another database file for {name}"
            if strict:
                raise GpuMismatchError(message)
            warnings.warn(message, stacklevel=2)
            return False
        if recorded is None:
            self._claim("gpu", name)
        self._checked.add(name)
        return True

    # -- the L2 protocol this database belongs to ---------------------------------------

    @property
    def l2(self) -> str | None:
        """The L2 protocol the database's measurements were timed under (None while it is
        empty and unclaimed); a schema-1 file's rows are ``dirty``."""
        recorded = self._meta("l2")
        if recorded is None:
            rows = self._query(f"SELECT DISTINCT l2 FROM {self._rows} AS r ORDER BY l2")
            recorded = rows[0][0] if rows else None
        return recorded

    def check_l2(self, l2: str, *, strict: bool = True) -> bool:
        """Claim an empty database for L2 protocol ``l2``, or make sure it belongs to it.

        A mismatch raises :class:`ProtocolMismatchError` (``strict=False``: returns False):
        speedups timed under one protocol do not rank against another's."""
        check_l2(l2)
        recorded = self.l2
        if recorded is not None and recorded != l2:
            if not strict:
                return False
            raise ProtocolMismatchError(
                f"{self.path} holds measurements timed with l2={recorded}, not l2={l2}; speedups measured under "
                f"different L2 protocols do not rank against each other: use another database file for l2={l2}")
        if recorded is None:
            self._claim("l2", l2)
        return True

    def _l2(self, l2: str | None) -> str:
        """The protocol a lookup reads: the one asked for, else the database's own."""
        return l2 or self.l2 or LEGACY_L2

    def _best_sql(self, env: dict | None = None, card: str | None = None) -> str:
        return _BEST.replace("{rows}", self._rows if env is None else _env_rows(self._rows, env, card))

    def _judged_sql(self, env: dict | None = None, card: str | None = None) -> str:
        return _JUDGED.replace("{rows}", self._rows if env is None else _env_rows(self._rows, env, card))

    # -- writing -------------------------------------------------------------------------

    def add(self, measurement: Measurement, gpu: Gpu | str, policy: str = "", env: dict | None = None) -> int:
        """Persist one measurement (committed before returning); returns its row id."""
        row_id = self._insert(measurement, gpu, policy, env, budget=None)
        assert row_id is not None
        return row_id

    def add_new(self, measurement: Measurement, gpu: Gpu | str, policy: str, env: dict | None, *, budget: int,
                per_layout: bool = False) -> int | None:
        """Persist one tuning measurement unless it would be a duplicate: the shape (under
        its protocol; ``per_layout``: among the programs of the measurement's B layout)
        already has ``budget`` rows, or this program was already measured there by a run
        of an evaluator of the same kind (another tune on this database, say). Check and
        insert are one write transaction, so two processes tuning one database at once
        store each candidate once and no shape past its budget. Returns the row id, or
        None if nothing was stored."""
        return self._insert(measurement, gpu, policy, env, budget=budget, per_layout=per_layout)

    def _insert(self, measurement: Measurement, gpu: Gpu | str, policy: str, env: dict | None, *, budget: int | None,
                per_layout: bool = False) -> int | None:
        if self.readonly:
            raise DatabaseError(f"{self.path}: opened read-only")
        self.check_gpu(gpu)
        self.check_l2(measurement.l2)
        m, p = measurement, measurement.program
        name = _gpu_name(gpu)
        key = program_key(p)
        row = (
            name, p.family.value, m.shape.m, m.shape.n, m.shape.k, format_program(p), key, m.status,
            m.time_us, m.baseline_us, m.relerr, m.error, policy, _now(), json.dumps(env or {}, sort_keys=True), m.l2,
            m.fallback_us,
        )
        conn = self._conn()
        try:
            conn.execute("BEGIN IMMEDIATE")  # take the write lock before reading what decides the insert
            try:
                if budget is not None:  # (a program's back-to-back row is not a candidate of its own)
                    where = f"gpu = ? AND l2 = ? AND m = ? AND n = ? AND k = ? AND policy != '{LOOP_POLICY}'"
                    shape = (name, m.l2, m.shape.m, m.shape.n, m.shape.k)
                    if per_layout:  # the layout is a line of the canonical text
                        texts = conn.execute(f"SELECT program_text FROM measurements WHERE {where}", shape).fetchall()
                        count = sum(_layout_of(t) == p.b_layout.value for (t,) in texts)
                    else:
                        count = conn.execute(f"SELECT count(*) FROM measurements WHERE {where}", shape).fetchone()[0]
                    seen = m.status != "rejected" and conn.execute(
                        f"SELECT 1 FROM measurements WHERE {where} AND program_key = ? AND status != 'rejected' LIMIT 1", shape + (key,)).fetchone()
                    if count >= budget or seen:
                        conn.rollback()
                        return None
                cur = conn.execute(f"INSERT INTO measurements ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})", row)
                conn.commit()
            except BaseException:
                conn.rollback()
                raise
        except sqlite3.DatabaseError as exc:
            raise DatabaseError(f"{self.path}: {exc}") from None
        return int(cur.lastrowid)

    # -- what kind of evidence the database holds ----------------------------------------

    @property
    def evidence(self) -> str | None:
        """``measured`` (timed on a GPU), ``simulated`` (the analytic model of
        :mod:`l2gen.search.simulate`), or None while the database is unclaimed."""
        recorded = self._meta("evidence")
        if recorded is None:
            rows = self._query(f"SELECT count(*) FROM {self._rows} AS r WHERE json_extract(env, '$.simulated') IS NOT NULL")
            if rows and rows[0][0]:
                return "simulated"
        return recorded

    def check_evidence(self, evidence: str) -> None:
        """Claim an unclaimed database for ``measured`` or ``simulated`` rows, or make sure
        it holds that kind: a simulated speedup must never rank beside (or be served as) a
        measured one. A mismatch raises :class:`EvidenceMismatchError`."""
        recorded = self.evidence
        if recorded is None and evidence == "simulated" and self._query("SELECT count(*) FROM measurements")[0][0]:
            recorded = "measured"  # rows from before the marker that are not simulated
        if recorded is not None and recorded != evidence:
            raise EvidenceMismatchError(
                f"{self.path} holds {recorded} rows, not {evidence} ones; simulated and measured speedups are kept in "
                f"separate databases (tune --simulate writes {SIMULATED_DB} by default): use another database file")
        if recorded is None:
            self._claim("evidence", evidence)

    # -- reading -------------------------------------------------------------------------

    def _measurement(self, shape: Shape, text: str, status: str, time_us, baseline_us, relerr, error, l2: str = LEGACY_L2) -> Measurement | None:
        try:
            program = _parse_cached(text)
        except Exception as exc:  # written by an l2gen whose grammar has changed since
            warnings.warn(f"{self.path}: skipping a stored program that no longer parses: {exc}")
            return None
        return Measurement(shape, program, status, time_us, baseline_us, relerr, error, l2)

    def history(self, gpu: Gpu | str, shape: Shape, *, l2: str | None = None, loops: bool = True) -> list[Measurement]:
        """Every measurement of a shape on a GPU under an L2 protocol (None: the
        database's own), oldest first; without the back-to-back judgements of bench rows
        (policy :data:`LOOP_POLICY`) if ``loops`` is False."""
        rows = self._query(
            f"SELECT program_text, status, time_us, baseline_us, relerr, error, l2 FROM {self._rows} AS r "
            "WHERE gpu = ? AND l2 = ? AND m = ? AND n = ? AND k = ? AND (? OR COALESCE(policy, '') != ?) ORDER BY id",
            (_gpu_name(gpu), self._l2(l2), shape.m, shape.n, shape.k, int(loops), LOOP_POLICY),
        )
        out = [self._measurement(shape, *row) for row in rows]
        return [m for m in out if m is not None]

    def shapes(self, gpu: Gpu | str) -> list[Shape]:
        """Every shape with a measurement on a GPU, in (M, N, K) order."""
        rows = self._query("SELECT DISTINCT m, n, k FROM measurements WHERE gpu = ? ORDER BY m, n, k", (_gpu_name(gpu),))
        return [Shape(*row) for row in rows]

    def policies(self) -> list[str]:
        """The names of the policies whose measurements the database holds."""
        return [r[0] for r in self._query("SELECT DISTINCT policy FROM measurements ORDER BY policy")]

    def best(self, gpu: Gpu | str, shape: Shape, *, b_layout: BLayout | None = None, l2: str | None = None) -> tuple[Program, float, float] | None:
        """(program, speedup, time_us) of the fastest verified program for a shape, or
        None. ``b_layout`` restricts it to programs for that operand layout; ``l2`` names
        the L2 protocol whose measurements count (None: the database's own)."""
        return self._bests(gpu, b_layout, l2, None, shape).get(shape)

    def best_all(self, gpu: Gpu | str, *, b_layout: BLayout | None = None, l2: str | None = None, env: dict | None = None) -> dict[Shape, tuple[Program, float, float]]:
        """The best (program, speedup, time_us) of every shape measured on a GPU under an
        L2 protocol (None: the database's own). ``b_layout`` restricts each shape's best to
        programs for that operand layout. ``env`` (what a dispatcher serves): only rows that
        were measured, not simulated, on the GPU's own card where they name the card they
        ran on (env ``device``), and whose recorded environment has each of ``env``'s key:
        value pairs (e.g. ``{"nvcc": "13.0.88"}``) count."""
        return self._bests(gpu, b_layout, l2, env, None)

    def _bests(self, gpu: Gpu | str, b_layout: BLayout | None, l2: str | None, env: dict | None, shape: Shape | None) -> dict:
        # The best view keeps one program per (shape, arch) whatever its B layout, so a
        # layout's best can hide behind another layout's; a lookup for one layout ranks
        # the judged programs of that layout instead (the same judgement, the same order).
        name = _gpu_name(gpu)
        rows = self._best_sql(env, name) if b_layout is None else self._judged_sql(env, name) + " SELECT * FROM judged"
        where, args = "gpu = ? AND l2 = ?", (name, self._l2(l2))
        if shape is not None:
            where, args = where + " AND m = ? AND n = ? AND k = ?", args + (shape.m, shape.n, shape.k)
        found = self._query(f"WITH best AS ({rows}) SELECT m, n, k, program_text, speedup, time_us FROM best WHERE {where} "
                            "ORDER BY m, n, k, speedup DESC, id ASC", args)
        out: dict[Shape, tuple[Program, float, float]] = {}
        for m, n, k, text, speedup, time_us in found:
            shape = Shape(m, n, k)
            if shape in out:
                continue
            meas = self._measurement(shape, text, "ok", time_us, None, None, None)
            if meas is not None and (b_layout is None or meas.program.b_layout is b_layout):
                out[shape] = (meas.program, float(speedup), float(time_us))
        return out

    def ranked(self, gpu: Gpu | str, per_shape: int, *, b_layout: BLayout | None = None, l2: str | None = None) -> dict[Shape, list[tuple[Program, float, float]]]:
        """Up to ``per_shape`` programs of every shape, best first, each judged as
        :meth:`best` judges them: (program, speedup, time_us) of its least favourable run."""
        out: dict[Shape, list[tuple[Program, float, float]]] = {}
        rows = self._query(f"{self._judged_sql()} SELECT m, n, k, program_text, speedup, time_us FROM judged WHERE gpu = ? AND l2 = ? "
                           "ORDER BY m, n, k, speedup DESC, id ASC", (_gpu_name(gpu), self._l2(l2)))
        for m, n, k, text, speedup, time_us in rows:
            shape = Shape(m, n, k)
            here = out.setdefault(shape, [])
            if len(here) >= per_shape:
                continue
            meas = self._measurement(shape, text, "ok", time_us, None, None, None)
            if meas is not None and (b_layout is None or meas.program.b_layout is b_layout):
                here.append((meas.program, float(speedup), float(time_us)))
        return out

    def fallback_speedups(self, gpu: Gpu | str, *, l2: str | None = None, env: dict | None = None) -> dict[tuple[Shape, str], float]:
        """For every (shape, program key) measured ok on a GPU under an L2 protocol: its
        speedup over the dispatcher's fallback (torch.matmul timed in the same run), judged
        by its least favourable run, and only where every one of its runs timed the
        fallback. ``env`` as for :meth:`best_all`. A program that ever computed a wrong
        result there has none."""
        rows = self._rows if env is None else _env_rows(self._rows, env, _gpu_name(gpu))
        found = self._query(
            f"SELECT m, n, k, program_key, MIN(fallback_us / time_us), COUNT(fallback_us), COUNT(*) FROM {rows} AS r "
            "WHERE gpu = ? AND l2 = ? AND status = 'ok' AND time_us > 0 AND NOT EXISTS ("
            f"SELECT 1 FROM {rows} AS w WHERE w.gpu = r.gpu AND w.m = r.m AND w.n = r.n AND w.k = r.k "
            "AND w.program_key = r.program_key AND w.status = 'wrong') "
            "GROUP BY m, n, k, program_key", (_gpu_name(gpu), self._l2(l2)))
        return {(Shape(m, n, k), key): float(sp) for m, n, k, key, sp, timed, runs in found if sp is not None and timed == runs}

    def count(self, gpu: Gpu | str | None = None) -> int:
        if gpu is None:
            return self._query("SELECT count(*) FROM measurements")[0][0]
        return self._query("SELECT count(*) FROM measurements WHERE gpu = ?", (_gpu_name(gpu),))[0][0]

    # -- exchange ------------------------------------------------------------------------

    def export_json(self, path: str | Path) -> int:
        """Write every measurement to a JSON file (atomically); returns the row count."""
        path = Path(path)
        cols = ("id",) + _COLUMNS
        rows = self._query(f"SELECT {', '.join(cols)} FROM {self._rows} AS r ORDER BY id")
        records = []
        for row in rows:
            record = dict(zip(cols, row))
            record["env"] = json.loads(record["env"] or "{}")
            records.append(record)
        doc = {"format": FORMAT, "schema_version": SCHEMA_VERSION, "gpu": self.gpu, "l2": self.l2, "measurements": records}
        try:
            write_atomic(path, json.dumps(doc, indent=1))
        except OSError as exc:
            raise DatabaseError(f"{path}: cannot write the export: {exc.strerror or exc}") from None
        return len(records)

    def import_json(self, path: str | Path) -> int:
        """Add the measurements of an exported file; rows already present are skipped.
        Returns how many were added. A file from another GPU raises GpuMismatchError; one
        timed under another L2 protocol (a record without ``l2`` was timed ``dirty``)
        raises ProtocolMismatchError."""
        from .diagnostics import DiagnosticError
        from .schema import check_export, read_json

        path = Path(path)
        try:
            doc = read_json(path, "E-EXPORT", "a kernel database export")
            if isinstance(doc, dict) and isinstance(doc.get("schema_version"), int) and doc["schema_version"] > SCHEMA_VERSION:
                raise DatabaseError(f"{path}: export schema version {doc.get('schema_version')} is newer than this l2gen reads ({SCHEMA_VERSION})")
            records = check_export(doc, path, FORMAT)
        except DiagnosticError as exc:  # the schema's message, with the field it names
            raise DatabaseError("; ".join(str(d) for d in exc.diagnostics)) from None
        gpus = {r["gpu"] for r in records} | ({doc["gpu"].lower()} if doc.get("gpu") else set())
        if len(gpus) > 1:
            raise GpuMismatchError(f"{path}: measurements from several GPUs ({', '.join(sorted(gpus))}) in one export")
        for gpu in gpus:
            self.check_gpu(gpu)
        protocols = {r["l2"] or LEGACY_L2 for r in records} | ({doc["l2"]} if doc.get("l2") else set())
        if len(protocols) > 1:
            raise ProtocolMismatchError(f"{path}: measurements timed under several L2 protocols ({', '.join(sorted(protocols))}) in one export")
        for l2 in protocols:
            self.check_l2(l2)
        kinds = {"simulated" if r["env"].get("simulated") is not None else "measured" for r in records}
        if len(kinds) > 1:
            raise EvidenceMismatchError(f"{path}: simulated and measured rows in one export")
        for kind in kinds:
            self.check_evidence(kind)
        added = 0
        conn = self._conn()
        key_cols = ("gpu", "m", "n", "k", "program_key", "status", "created_at", "time_us")
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                for r in records:
                    r = dict(r, l2=r["l2"] or LEGACY_L2, env=json.dumps(r["env"], sort_keys=True), fallback_us=r.get("fallback_us"))
                    exists = conn.execute(f"SELECT 1 FROM measurements WHERE {' AND '.join(f'{c} IS ?' for c in key_cols)}",
                                          tuple(r[c] for c in key_cols)).fetchone()
                    if exists:
                        continue
                    conn.execute(f"INSERT INTO measurements ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})",
                                 tuple(r[c] for c in _COLUMNS))
                    added += 1
                conn.commit()
            except BaseException:
                conn.rollback()
                raise
        except (sqlite3.DatabaseError, TypeError) as exc:
            raise DatabaseError(f"{path}: bad measurement record: {exc!r}") from None
        return added

    def import_bench(self, path: str | Path, *, skip: Iterable[Shape] = ()) -> int:
        """Add the rows of an ``l2gen bench`` results file as measurements (policy "bench"):
        each program x shape with its verified time against the same run's cuBLAS-best,
        under the file's L2 protocol (``dirty`` for a file without one). Returns how many
        rows were added.

        A row whose file timed rotated back-to-back blocks (``sustained_us``, ``l2gen bench
        --sustained``) and whose program takes at least :data:`SUSTAINED_BLOCK_MIN_US`, or
        one with only the escape check's batches (``batch_us``) whose program takes at least
        :data:`SUSTAINED_MIN_US`, is judged back to back too: where either of its
        speedups (over cuBLAS-best, over torch.matmul) is lower there, the back-to-back
        times are added as a second measurement (policy :data:`LOOP_POLICY`), and a
        program's least favourable measurement is what ranks and serves it. A model runs its
        GEMMs back to back, at a lower clock for a kernel that spends more energy per FLOP
        (16384^3 on the H200: l2gen's 1.11x torch.matmul one call at a time, 0.93x back to
        back). Models of kernel time learn from the one-call rows only (``history(...,
        loops=False)``). The rows of the shapes in ``skip`` are left out (a
        shape whose measured winner is known to lose where it would be served, in a file
        that timed no batches). Rows from another GPU, or a file timed on another card than
        the GPU it names (an H200 bench run on a lent H100), raise GpuMismatchError; a file timed
        under another L2 protocol than the database's, or in graph or server mode (the
        database ranks events-mode speedups), raises ProtocolMismatchError."""
        from .diagnostics import DiagnosticError
        from .protocol import Protocol, ProtocolError
        from .schema import read_results

        path = Path(path)
        try:
            doc = read_results(path)
        except DiagnosticError as exc:
            raise DatabaseError("not an l2gen bench results file: " + "; ".join(str(d) for d in exc.diagnostics)) from None
        rows, gpu = doc.get("rows", []), doc.get("gpu")
        if not isinstance(gpu, str) or not gpu:
            raise DatabaseError(f"{path}: not an l2gen bench results file: it names no 'gpu'")
        try:
            protocol = Protocol.of(doc)
        except ProtocolError as exc:
            raise DatabaseError(f"{path}: {exc}") from None
        if protocol.mode != "events":
            raise ProtocolMismatchError(f"{path} was timed in {protocol.describe()}; a kernel database ranks speedups "
                                        "timed in events mode: bench without --mode to make rows it can take")
        self.check_gpu(gpu)
        device = doc.get("device")
        if isinstance(device, str) and device and not is_card(gpu, device):
            raise GpuMismatchError(f"{path} was timed on {device}, not on the {gpu} it was benched for: its rows are "
                                   f"not evidence about the {gpu} and would never be served; bench with the --gpu of "
                                   "that card, into a database of its own")
        self.check_l2(protocol.l2)
        self.check_evidence("measured")
        env = {k: doc.get(k) for k in ("device", "commit", "nvcc", "date") if isinstance(doc.get(k), str)}
        programs = []
        for i, row in enumerate(rows):  # every row read back before the first is stored
            if not isinstance(row.get("program_text"), str):
                raise DatabaseError(f"{path}: rows[{i}] has no program_text")
            try:
                programs.append((parse(row["program_text"], f"{path}:rows[{i}].program_text"), Shape(row["m"], row["n"], row["k"])))
            except DiagnosticError as exc:  # a row this l2gen cannot read back: say which
                raise DatabaseError(f"{path}: rows[{i}] ({row.get('program')!r}) is not an l2gen program: {exc}") from None
        added = 0
        skip = set(skip)
        for row, (program, shape) in zip(rows, programs):
            if shape in skip:
                continue
            status = Status.of(row["status"]).value
            fallback = (row.get("baselines") or {}).get("torch_matmul_us")
            time_us, baseline_us = row.get("l2gen_us"), row.get("cublas_best_us")
            m = Measurement(shape, program, status, time_us=time_us, baseline_us=baseline_us,
                            relerr=row.get("relerr"), error=row.get("error"), l2=protocol.l2,
                            fallback_us=_positive(fallback))
            self.add(m, gpu, "bench", env)
            self._judge_back_to_back(m, _sustained(row), gpu, env)
            added += 1
        return added

    def add_back_to_back(self, measurement: Measurement, gpu: Gpu | str, env: dict | None) -> bool:
        """Judge a stored measurement timed back to back in rotated blocks too
        (``measurement.sustained``, ``l2gen tune --sustained``) as :meth:`import_bench` judges
        a bench row of such a run: from :data:`SUSTAINED_BLOCK_MIN_US` on, where either of its
        speedups is lower back to back, those times are added (policy :data:`LOOP_POLICY`) and
        rank and serve the program. Returns whether a row was added."""
        loop = measurement.sustained
        if loop is None or not measurement.time_us or measurement.time_us < SUSTAINED_BLOCK_MIN_US:
            return False
        return self._judge_back_to_back(measurement, loop, gpu, env)

    def _judge_back_to_back(self, m: Measurement, loop: tuple | None, gpu: Gpu | str, env: dict | None) -> bool:
        if loop is None or m.status != "ok" or not m.time_us or not m.baseline_us:
            return False
        own, best, torch_us = loop
        if not (_positive(own) and _positive(best)) or not _less_favourable(loop, (m.time_us, m.baseline_us, m.fallback_us)):
            return False
        self.add(replace(m, time_us=float(own), baseline_us=float(best), fallback_us=_positive(torch_us), sustained=None),
                 gpu, LOOP_POLICY, env)
        return True


def _positive(us) -> float | None:
    return float(us) if isinstance(us, (int, float)) and us > 0 else None


def _less_favourable(loop: tuple, one: tuple) -> bool:
    """Whether back to back (``loop``: program, cuBLAS-best, torch.matmul µs) a program's
    speedup over cuBLAS-best or over torch.matmul is lower than one call at a time (``one``)."""
    (t2, b2, f2), (t1, b1, f1) = loop, one
    if b2 / t2 < b1 / t1:
        return True
    return _positive(f2) is not None and _positive(f1) is not None and f2 / t2 < f1 / t1


def _sustained(row: dict) -> tuple[float, float, float | None] | None:
    """(program, cuBLAS-best, torch.matmul) µs per call back to back, for a bench row of a
    kernel long enough to be judged under sustained load that timed them; else None. The
    rotated blocks of ``l2gen bench --sustained`` judge every kernel from
    :data:`SUSTAINED_BLOCK_MIN_US`; without them, the escape check's one batch per runner
    judges kernels from :data:`SUSTAINED_MIN_US` only (its fixed order and ~20 ms length
    leave a shorter kernel's time to the clock the runner before it left)."""
    one = row.get("l2gen_us")
    if not isinstance(one, (int, float)):
        return None
    own, base = row.get("sustained_us"), row.get("baseline_sustained_us")
    if isinstance(own, (int, float)) and own > 0 and isinstance(base, dict):
        if one < SUSTAINED_BLOCK_MIN_US:
            return None
    else:
        own, base = row.get("batch_us"), row.get("baseline_batch_us")
        if not isinstance(own, (int, float)) or not isinstance(base, dict) or own <= 0 or one < SUSTAINED_MIN_US:
            return None
    times = [t for t in base.values() if isinstance(t, (int, float)) and t > 0]
    if not times:
        return None
    return float(own), float(min(times)), base.get("torch_matmul_us")


# ---------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def collect_env() -> dict:
    """Versions of the toolchain that produced a measurement, where they can be found:
    nvcc, the CUTLASS wheel, the NVIDIA driver, torch. Missing tools are left out."""
    env: dict = {}
    for dist, key in (("nvidia-cutlass", "cutlass"), ("torch", "torch"), ("cuda-python", "cuda_python")):
        try:
            env[key] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    env["nvcc"] = found_nvcc_version()
    env["driver"] = _tool_output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], lambda out: out.strip().splitlines()[0])
    return {k: v for k, v in env.items() if v}


def _tool_output(cmd: list[str], pick) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=True).stdout
        return pick(out)
    except (OSError, subprocess.SubprocessError, IndexError):
        return None
