"""The measuring commands of the CLI (bench, tune, db), kept apart from the compiler's."""

from __future__ import annotations


def add_commands(sub) -> None:
    """Register bench, tune and db; each imports its stage only when it runs."""
