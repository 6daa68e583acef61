"""The JSON files l2gen reads back (bench results, kernel database exports), validated
against their schema before anything uses them.

A file that is not what it claims to be is refused whole (exit 1), with a diagnostic that names the
file and the field (``results.json: E-RESULTS: rows[3].m must be in 1..2147483647, got
-64``), before a row of it is stored, compared or shown. Program text in an export is
parsed here, so the database stores only programs (their canonical text, re-printed from
the parse), never the text as it came.
"""

from __future__ import annotations

import json
from pathlib import Path

from .diagnostics import Diagnostic, DiagnosticError
from .ir import Span
from .problem import STATUSES  # a database row's
from .protocol import L2_PROTOCOLS
from .validate import dimension, finite_number

MAX_TEXT = 1 << 16  # program texts and error messages longer than this are not l2gen's


def _error(code: str, path, message: str, line: int = 1, col: int = 1) -> DiagnosticError:
    return DiagnosticError([Diagnostic(code, message, Span(str(path), line, col))])


def read_json(path: str | Path, code: str, what: str):
    """The JSON document in ``path``, or a DiagnosticError (exit 1) with its location."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise _error(code, path, f"cannot read {what}: {exc.strerror if isinstance(exc, OSError) else exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise _error(code, path, f"not {what}: not JSON: {exc.msg}", exc.lineno, exc.colno) from None
    except (ValueError, RecursionError) as exc:  # an integer of too many digits, nesting too deep
        raise _error(code, path, f"not {what}: {str(exc)[:160]}") from None


class _Fields:
    """Checks one record's fields, naming them ``<where>.<field>`` in every message."""

    def __init__(self, code: str, path, record, where: str):
        self.code, self.path, self.where = code, path, where
        if not isinstance(record, dict):
            raise _error(code, path, f"{where} must be an object, got {type(record).__name__}")
        self.record = record

    def _name(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def _fail(self, message: str) -> DiagnosticError:
        return _error(self.code, self.path, message)

    def dim(self, key: str) -> int:
        if key not in self.record:
            raise self._fail(f"{self._name(key)} is missing")
        try:
            return dimension(self.record[key], self._name(key))
        except DiagnosticError as exc:
            raise self._fail(exc.diagnostics[0].message) from None

    def number(self, key: str, *, positive: bool = False):
        try:
            return finite_number(self.record.get(key), self._name(key), positive=positive)
        except DiagnosticError as exc:
            raise self._fail(exc.diagnostics[0].message) from None

    def text(self, key: str, *, optional: bool = False, choices: tuple[str, ...] | None = None) -> str | None:
        value = self.record.get(key)
        if value is None and optional:
            return None
        if not isinstance(value, str):
            raise self._fail(f"{self._name(key)} must be a string, got {_kind(value)}")
        if len(value) > MAX_TEXT:
            raise self._fail(f"{self._name(key)} is {len(value)} characters long (at most {MAX_TEXT})")
        if choices is not None and value not in choices:
            raise self._fail(f"{self._name(key)} must be one of {', '.join(choices)}, got {value[:40]!r}")
        return value

    def times(self, key: str) -> None:
        """An optional object of name -> time (finite, positive, or null)."""
        value = self.record.get(key)
        if value is None:
            return
        if not isinstance(value, dict):
            raise self._fail(f"{self._name(key)} must be an object, got {_kind(value)}")
        inner = _Fields(self.code, self.path, value, self._name(key))
        for name in value:
            inner.number(name, positive=True)

    def listed(self, key: str) -> list:
        value = self.record.get(key, [])
        if not isinstance(value, list):
            raise self._fail(f"{self._name(key)} must be a list, got {_kind(value)}")
        return value


def _kind(value) -> str:
    return "null" if value is None else type(value).__name__


# -- bench results -------------------------------------------------------------------------


def check_results(doc, path: str | Path = "<results>") -> dict:
    """``doc`` if it is an ``l2gen bench`` results file (see :mod:`l2gen.bench`), else a
    DiagnosticError naming the first field that is wrong."""
    top = _Fields("E-RESULTS", path, doc, "")
    if "rows" not in doc:  # every bench writes it (a suite file, say, has none)
        raise _error("E-RESULTS", path, "not an l2gen bench results file: it has no 'rows'")
    top.text("gpu", optional=True)
    for i, row in enumerate(top.listed("rows")):
        r = _Fields("E-RESULTS", path, row, f"rows[{i}]")
        for key in ("m", "n", "k"):
            r.dim(key)
        r.text("program")
        r.text("program_text", optional=True)
        r.text("status", optional=True)
        r.text("error", optional=True)
        for key in ("l2gen_us", "cublas_best_us", "speedup_vs_best"):
            r.number(key, positive=True)
        r.number("relerr")
        r.times("baselines")
    for i, shape in enumerate(top.listed("shapes")):
        s = _Fields("E-RESULTS", path, shape, f"shapes[{i}]")
        for key in ("m", "n", "k"):
            s.dim(key)
        for key in ("l2gen_us", "cublas_best_us", "speedup_vs_best"):
            s.number(key, positive=True)
        s.times("baselines")
    return doc


def read_results(path: str | Path) -> dict:
    """An ``l2gen bench`` results file, validated (:func:`check_results`)."""
    return check_results(read_json(path, "E-RESULTS", "a bench results file"), path)


# -- kernel database exports ---------------------------------------------------------------


def check_export(doc, path: str | Path = "<export>", format_name: str = "l2gen-kernel-db") -> list[dict]:
    """The measurement records of an ``l2gen db export`` file, each with its program
    parsed (``record["program"]``) and its text and key re-derived from the parse; a
    DiagnosticError naming the first field that is wrong (a program that does not parse
    included) otherwise."""
    from .parse import parse
    from .printer import format_program
    from .problem import program_key

    top = _Fields("E-EXPORT", path, doc, "")
    if doc.get("format") != format_name:
        raise _error("E-EXPORT", path, f"not an l2gen kernel database export (format is not '{format_name}')")
    version = doc.get("schema_version", 0)
    if isinstance(version, bool) or not isinstance(version, int):
        raise _error("E-EXPORT", path, f"schema_version must be an integer, got {_kind(version)}")
    top.text("gpu", optional=True)
    top.text("l2", optional=True, choices=L2_PROTOCOLS)
    records = []
    for i, record in enumerate(top.listed("measurements")):
        r = _Fields("E-EXPORT", path, record, f"measurements[{i}]")
        out = {"gpu": r.text("gpu").lower(), "arch": r.text("arch")}
        for key in ("m", "n", "k"):
            out[key] = r.dim(key)
        out["status"] = r.text("status", choices=STATUSES)
        for key in ("time_us", "baseline_us"):
            out[key] = r.number(key, positive=True)
        out["relerr"] = r.number("relerr")
        for key in ("error", "policy"):
            out[key] = r.text(key, optional=True)
        out["created_at"] = r.text("created_at")
        out["l2"] = r.text("l2", optional=True, choices=L2_PROTOCOLS)
        env = record.get("env") or {}
        if not isinstance(env, dict):
            raise _error("E-EXPORT", path, f"measurements[{i}].env must be an object, got {_kind(env)}")
        out["env"] = env
        text = r.text("program_text")
        try:
            program = parse(text, file=f"{path}:measurements[{i}].program_text")
        except DiagnosticError as exc:
            raise DiagnosticError([Diagnostic("E-EXPORT", f"measurements[{i}].program_text is not an l2gen program", Span(str(path)))]
                             + exc.diagnostics) from None
        if program.family.value != out["arch"]:
            raise _error("E-EXPORT", path, f"measurements[{i}].arch is {out['arch']!r} but its program is {program.family.value}")
        out["program"] = program
        out["program_text"] = format_program(program)
        out["program_key"] = program_key(program)
        records.append(out)
    return records
