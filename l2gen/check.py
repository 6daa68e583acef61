"""Checking: every well-formed program that would not compile or not run gets a diagnostic.

The checker runs the table of rules in :mod:`l2gen.rules`, the contract of the templates:
a program it accepts lowers to a translation unit that nvcc compiles without a
``static_assert`` firing and that runs on the target GPU. Property tests compile random
accepted programs to hold it to that.
"""

from __future__ import annotations

from .diagnostics import Diagnostic
from .ir import Program
from .limits import *  # noqa: F401,F403  (the limits and layout arithmetic, still importable from here)
from .rules import RULES, Rule
from .targets import Gpu


def violations(program: Program, gpu: Gpu) -> list[tuple[Rule, Diagnostic]]:
    """Each diagnostic of a program with the rule that made it, in the table's order.

    A rule runs when it applies to the program's family and every rule in its ``after``
    ran and passed."""
    passed: set[str] = set()
    out: list[tuple[Rule, Diagnostic]] = []
    for rule in RULES:
        if program.family not in rule.families or not passed.issuperset(rule.after):
            continue
        found = [
            (rule, Diagnostic(rule.code, message, program.span_of(decision)))
            for decision, message in rule.test(program, gpu)
        ]
        if found:
            out += found
        else:
            passed.add(rule.name)
    return out


def check(program: Program, gpu: Gpu) -> list[Diagnostic]:
    """All diagnostics for a program on a GPU; an empty list means it lowers and runs."""
    return [d for _, d in violations(program, gpu)]


def is_valid(program: Program, gpu: Gpu) -> bool:
    return not any(d.is_error for d in check(program, gpu))
