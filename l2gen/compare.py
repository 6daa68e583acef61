"""Does a measurement reproduce? Speedups of one bench run against another, or against a
kernel database's records.

What l2gen claims is a *ratio*: a program's time against cuBLAS-best measured in the same
run. Absolute times drift with clocks from run to run; a ratio that moves more than the
tolerance between two independent runs is noise, not a result. This module pairs up the
ratios of two sources and says which moved:

- two ``l2gen bench`` results files: every (shape, program) row that passed in both, and
  every shape's best (the fastest program that passed, whichever it was); for two runs of
  the baselines alone, each baseline's ratio to cuBLAS-best (what they have to compare);
- a kernel database and a bench results file: each shape's recorded best speedup against
  the bench row of the same program on the same shape (``l2gen bench --db`` makes those).

Only ratios timed under one protocol (:mod:`l2gen.protocol`) compare: two results files of
different protocols are refused (:class:`~l2gen.protocol.ProtocolMismatch`), and a
database's records are read under the results file's L2 protocol.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .baselines import cublas_best
from .console import Columns, plain
from .protocol import Protocol, require_comparable
from .problem import Shape, program_key

DEFAULT_TOLERANCE = 0.03


@dataclass(frozen=True)
class Pair:
    """One ratio in both sources. ``first``/``second`` are speedups over cuBLAS-best
    (None where that source has no passing measurement)."""

    shape: Shape
    what: str  # a program name, or "best" for the shape's best
    first: float | None
    second: float | None

    @property
    def change(self) -> float | None:
        """second / first - 1, or None if either side is missing."""
        if not self.first or not self.second:
            return None
        return self.second / self.first - 1.0

    def within(self, tolerance: float) -> bool:
        change = self.change
        return change is not None and abs(change) <= tolerance


@dataclass
class Comparison:
    first: str
    second: str
    tolerance: float
    pairs: list[Pair] = field(default_factory=list)

    def misses(self) -> list[Pair]:
        return [p for p in self.pairs if not p.within(self.tolerance)]

    @property
    def ok(self) -> bool:
        return bool(self.pairs) and not self.misses()

    def summary(self) -> dict:
        """Counts for each kind of pair: {kind: {"pairs", "within", "max_change"}}."""
        out = {}
        for kind in ("program", "best", "sustained", "baseline"):
            pairs = [p for p in self.pairs if _kind(p) == kind]
            changes = [abs(p.change) for p in pairs if p.change is not None]
            out[kind] = {
                "pairs": len(pairs),
                "within": sum(p.within(self.tolerance) for p in pairs),
                "missing": sum(p.change is None for p in pairs),
                "max_change": max(changes) if changes else None,
            }
        return out

    def table(self, *, all_rows: bool = False) -> str:
        """The pairs that moved more than the tolerance (every pair with ``all_rows``),
        then one summary line per kind."""
        return plain(self.blocks(all_rows=all_rows))

    def blocks(self, *, all_rows: bool = False) -> list:
        """:meth:`table`'s table and lines, as :func:`l2gen.console.show` prints them."""
        shown = self.pairs if all_rows else self.misses()
        lines: list = []
        if shown:
            text = [f"{'shape':>20}  {'program':<32} {'first':>7} {'second':>7} {'change':>8}"]
            rows = []
            for p in shown:
                first = f"{p.first:.3f}" if p.first else "-"
                second = f"{p.second:.3f}" if p.second else "-"
                change = f"{100 * p.change:+.1f}%" if p.change is not None else "missing"
                flag = "" if p.within(self.tolerance) else "  <--"
                text.append(f"{str(p.shape):>20}  {p.what:<32} {first:>7} {second:>7} {change:>8}{flag}")
                rows.append([str(p.shape), p.what, first, second, change, flag.strip()])
            lines.append(Columns(["shape", "program", "first", "second", "change", ""], rows, frozenset({1, 5}),
                                 plain="\n".join(text)))
            lines.append("")
        for kind, s in self.summary().items():
            if not s["pairs"]:
                continue
            worst = f", largest change {100 * s['max_change']:.1f}%" if s["max_change"] is not None else ""
            missing = f", {s['missing']} missing on one side" if s["missing"] else ""
            label = {"best": "per-shape best speedups", "program": "program x shape speedups",
                     "sustained": "program x shape speedups back to back (sustained blocks)",
                     "baseline": "baseline x shape ratios to cuBLAS-best"}[kind]
            lines.append(f"{s['within']} of {s['pairs']} {label} within {100 * self.tolerance:.0f}%{worst}{missing}")
        lines.append(f"({self.first} -> {self.second})")
        return lines


BASELINE_PREFIX = "baseline:"  # a Pair's ``what`` for a baseline's ratio to cuBLAS-best
SUSTAINED_SUFFIX = " (b2b)"  # a Pair's ``what`` for a program's speedup in sustained blocks


def _kind(pair: Pair) -> str:
    if pair.what == "best":
        return "best"
    if pair.what.endswith(SUSTAINED_SUFFIX):
        return "sustained"
    return "baseline" if pair.what.startswith(BASELINE_PREFIX) else "program"


def sustained_speedup(row: dict) -> float | None:
    """A bench row's speedup over cuBLAS-best back to back, in sustained blocks (``bench
    --sustained``): the fastest baseline's time per call there over the program's; None
    for a row without them."""
    own = row.get("sustained_us")
    best = cublas_best(row.get("baseline_sustained_us") or {})
    if not isinstance(own, (int, float)) or own <= 0 or not best:
        return None
    return best / own


def _shape(row: dict) -> Shape:
    return Shape(int(row["m"]), int(row["n"]), int(row["k"]))


def compare_results(first: dict, second: dict, *, tolerance: float = DEFAULT_TOLERANCE, names: tuple[str, str] = ("first", "second")) -> Comparison:
    """Pair the speedups of two bench results (see :mod:`l2gen.bench` for the format):
    every (shape, program) row present in either, then every shape's best; with no
    program rows in either (the baselines alone), each baseline's ratio to cuBLAS-best.
    Raises :class:`~l2gen.protocol.ProtocolMismatch` if the two were timed differently."""
    require_comparable(Protocol.of(first), Protocol.of(second), names)
    out = Comparison(*names, tolerance)
    rows_a = {(_shape(r), r["program"]): r.get("speedup_vs_best") for r in first.get("rows", [])}
    rows_b = {(_shape(r), r["program"]): r.get("speedup_vs_best") for r in second.get("rows", [])}
    for key in sorted(rows_a.keys() | rows_b.keys()):
        out.pairs.append(Pair(key[0], key[1], rows_a.get(key), rows_b.get(key)))
    # Back to back, where both runs timed sustained blocks.
    loop_a = {(_shape(r), r["program"]): sustained_speedup(r) for r in first.get("rows", []) if "sustained_us" in r}
    loop_b = {(_shape(r), r["program"]): sustained_speedup(r) for r in second.get("rows", []) if "sustained_us" in r}
    if loop_a and loop_b:
        for key in sorted(loop_a.keys() | loop_b.keys()):
            out.pairs.append(Pair(key[0], key[1] + SUSTAINED_SUFFIX, loop_a.get(key), loop_b.get(key)))
    best_a = {_shape(s): s.get("speedup_vs_best") for s in first.get("shapes", [])}
    best_b = {_shape(s): s.get("speedup_vs_best") for s in second.get("shapes", [])}
    for shape in sorted(best_a.keys() | best_b.keys()):
        out.pairs.append(Pair(shape, "best", best_a.get(shape), best_b.get(shape)))
    if not rows_a and not rows_b:
        out.pairs = [p for p in out.pairs if p.first or p.second]  # no program: no best speedup to pair
        ratios_a, ratios_b = _baseline_ratios(first), _baseline_ratios(second)
        for key in sorted(ratios_a.keys() | ratios_b.keys()):
            out.pairs.append(Pair(key[0], BASELINE_PREFIX + key[1], ratios_a.get(key), ratios_b.get(key)))
    return out


def _baseline_ratios(results: dict) -> dict[tuple[Shape, str], float | None]:
    """(shape, baseline) -> cuBLAS-best / that baseline's time, per shape summary."""
    out = {}
    for s in results.get("shapes", []):
        best = s.get("cublas_best_us")
        for key, t in (s.get("baselines") or {}).items():
            name = key[:-3] if key.endswith("_us") else key
            out[(_shape(s), name)] = best / t if best and t else None
    return out


def compare_db(recorded: dict, results: dict, *, tolerance: float = DEFAULT_TOLERANCE, names: tuple[str, str] = ("database", "bench")) -> Comparison:
    """Pair each shape's recorded best (``KernelDB.best_all``: shape -> (program, speedup,
    time_us)) with the bench row of the same program (by text, names aside) on that shape."""
    from .diagnostics import DiagnosticError
    from .parse import parse

    out = Comparison(*names, tolerance)
    measured: dict[tuple[Shape, str], float | None] = {}
    for row in results.get("rows", []):
        try:
            key = program_key(parse(row["program_text"]))
        except (DiagnosticError, KeyError, TypeError):
            continue
        measured[(_shape(row), key)] = row.get("speedup_vs_best")
    for shape, (program, speedup, _time_us) in sorted(recorded.items()):
        out.pairs.append(Pair(shape, program.name, speedup, measured.get((shape, program_key(program)))))
    return out
