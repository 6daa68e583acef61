"""Validate what a user hands l2gen before any work is done: numbers, shapes, output paths,
and the JSON files other commands wrote (bench results, database exports).

One helper per concern; each raises :class:`~l2gen.diagnostics.UsageError` (exit 2) with
a diagnostic that names the file, the record and the field. Nothing here writes anything
but a probe file that is removed at once (:func:`output_file`), and :func:`write_atomic`,
which replaces its target only once the whole text is on disk.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from pathlib import Path

from .diagnostics import Diagnostic, UsageError
from .ir import NOWHERE, Span
from .problem import Shape

# The kernels take M, N, K and leading dimensions as 32-bit ints.
MAX_DIM = 2**31 - 1


def usage_error(code: str, message: str, where: Span = NOWHERE) -> UsageError:
    return UsageError([Diagnostic(code, message, where)])


# -- numbers -------------------------------------------------------------------------------


def dimension(value, what: str, where: Span = NOWHERE) -> int:
    """A GEMM dimension: an integer (not a bool, not a float, not a string) in 1..MAX_DIM."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise usage_error("E-SHAPE", f"{what} must be an integer, got {_show(value)}", where)
    if not 1 <= value <= MAX_DIM:
        raise usage_error("E-SHAPE", f"{what} must be in 1..{MAX_DIM}, got {_show(value)}", where)
    return value


def finite_number(value, what: str, where: Span = NOWHERE, *, positive: bool = False, optional: bool = True):
    """A JSON number that is a real, finite time or ratio (None allowed if ``optional``)."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise usage_error("E-RESULTS", f"{what} must be a finite number, got {_show(value)}", where)
    if value < 0 or (positive and value == 0):
        raise usage_error("E-RESULTS", f"{what} must be {'positive' if positive else 'non-negative'}, got {_show(value)}", where)
    return value


def at_least(low: int, high: int | None = None):
    """An argparse ``type=`` for an integer option of at least ``low`` and, if given, at
    most ``high`` (exit 2 otherwise)."""

    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text[:40]!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"must be at most {high}, got {str(value)[:40]}")
        return value

    parse.__name__ = f"integer >= {low}" if high is None else f"integer in {low}..{high}"
    return parse


def positive_float(text: str) -> float:
    """An argparse ``type=`` for a finite positive number."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text[:40]!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite positive number, got {text[:40]}")
    return value


positive_float.__name__ = "positive number"


def gemm_shape(text: str) -> Shape:
    """An argparse ``type=`` for a GEMM shape, ``MxNxK`` (a :class:`~l2gen.problem.Shape`)."""
    try:
        return Shape.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def fraction(text: str) -> float:
    """An argparse ``type=`` for a share: a number from 0 to 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text[:40]!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a share between 0 and 1, got {text[:40]}")
    return value


fraction.__name__ = "share"


def _show(value) -> str:
    """A short rendering of a bad value (an integer of 200,000 digits is not printed)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# -- output paths --------------------------------------------------------------------------


def output_file(path: str | os.PathLike, option: str) -> Path:
    """Make sure ``path`` can be written as a file, before the work that produces it: not a
    directory, in a directory (existing, or to be made under one that exists) where a file
    can be created. Probes by creating and removing a temporary file there."""
    try:
        return _output_file(Path(path), option)
    except OSError as exc:  # a name too long, a folder that cannot be searched
        raise usage_error("E-OUTPUT", f"{option} {_short(path)}: cannot use this path: {exc.strerror or exc}") from None


def _short(path) -> str:
    text = str(path)
    return text if len(text) <= 120 else text[:117] + "..."


def _output_file(p: Path, option: str) -> Path:
    path = p
    if p.is_dir():
        raise usage_error("E-OUTPUT", f"{option} {path}: is a directory; name a file")
    if p.exists() and not os.access(p, os.W_OK):
        raise usage_error("E-OUTPUT", f"{option} {path}: the file is not writable")
    _probe(_existing_ancestor(p.parent), option, path)
    return p


def output_dir(path: str | os.PathLike, option: str) -> Path:
    """Make sure ``path`` is (or can be made) a writable directory, before any work."""
    try:
        return _output_dir(Path(path), option)
    except OSError as exc:
        raise usage_error("E-OUTPUT", f"{option} {_short(path)}: cannot use this path: {exc.strerror or exc}") from None


def _output_dir(p: Path, option: str) -> Path:
    path = p
    if p.exists() and not p.is_dir():
        raise usage_error("E-OUTPUT", f"{option} {path}: exists and is not a directory; name a directory")
    _probe(_existing_ancestor(p), option, path)
    return p


def _existing_ancestor(p: Path) -> Path:
    p = p if str(p) else Path(".")
    while not p.exists():
        if p.parent == p:
            break
        p = p.parent
    return p


def _probe(directory: Path, option: str, path) -> None:
    if not directory.is_dir():
        raise usage_error("E-OUTPUT", f"{option} {path}: {directory} is not a directory")
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".l2gen-probe-")
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        raise usage_error("E-OUTPUT", f"{option} {path}: cannot write in {directory}: {exc.strerror or exc}") from None


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory and
    ``os.replace``: a reader sees the old file or the whole new one, and a failure (a
    full disk) leaves the old file as it was and no temporary behind. Raises OSError."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
