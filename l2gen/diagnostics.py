"""Diagnostics: what the parser and checker say about a program, with a location."""

from __future__ import annotations

from dataclasses import dataclass

from .ir import NOWHERE, Span


@dataclass(frozen=True)
class Diagnostic:
    """One finding. ``code`` is stable (tests and tools match on it); errors block lowering."""

    code: str
    message: str
    span: Span = NOWHERE
    severity: str = "error"  # "error" or "warning"

    def __str__(self) -> str:
        where = "l2gen" if self.span is NOWHERE else str(self.span)
        return f"{where}: {self.code}: {self.message}"

    @property
    def is_error(self) -> bool:
        return self.severity == "error"


class DiagnosticError(Exception):
    """Raised where a stage cannot go on; carries every diagnostic found so far."""

    def __init__(self, diagnostics: list[Diagnostic]):
        self.diagnostics = list(diagnostics)
        super().__init__("\n".join(str(d) for d in self.diagnostics))


class UsageError(DiagnosticError):
    """A request the command refuses as asked (exit 2): an option out of range, an output
    path that cannot be written, a file that is not what the command takes, a protocol that
    does not exist, two things measured under different protocols to be compared, ..."""


def errors(diagnostics: list[Diagnostic]) -> list[Diagnostic]:
    return [d for d in diagnostics if d.is_error]
