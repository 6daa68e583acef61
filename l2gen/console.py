"""How long work and result tables reach the user: progress bars and rich tables on a
terminal, plain text everywhere else.

A :class:`Reporter` writes one line per event to stderr: what CI logs and pipes get, and
what scripts grep (``[build] 3/8 name: FAILED``, ``[bench] 2/24 64x4096x4096: ...``,
``[tune] ...``). :class:`RichReporter`, picked by :func:`reporter` when stderr is a
terminal, draws the same events as bars: the lines a bar stands for are not repeated,
everything else (a failure above all) is printed above the bars, and a bar that ends in
an error stays on screen marked as such.

Tables are :class:`Columns` records; :func:`show` prints them as rich tables when stdout
is a terminal and as the aligned plain text scripts parse otherwise.
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass
from typing import Callable, Collection, Sequence, TextIO

# ---- progress -------------------------------------------------------------------------


class Bar:
    """One piece of long work with a count (programs built, shapes measured, a shape's
    budget). Plain: each event's line is printed as it comes; the bar itself is not."""

    def __init__(self, reporter: "Reporter", description: str, total: int | None):
        self.reporter, self.description, self.total = reporter, description, total
        self.completed, self.failed = 0, 0

    def advance(self, line: str | None = None, *, ok: bool = True, completed: int | None = None,
                total: int | None = None, note: str | None = None) -> None:
        """One unit done (or ``completed`` in all); ``line`` says what happened, ``ok``
        False marks it as a failure."""
        self.completed = self.completed + 1 if completed is None else completed
        self.total = self.total if total is None else total
        self.failed += not ok
        self._show(line, ok, note)

    def event(self, line: str | None = None, *, ok: bool = True, note: str | None = None) -> None:
        """Something happened within the current unit (one program's result on a shape)."""
        self.failed += not ok
        self._show(line, ok, note)

    def done(self, summary: str | None = None, *, ok: bool = True) -> None:
        """The work is over. A live bar gives way to ``summary``; the lines of plain
        progress already said everything, so it adds nothing there."""

    def _show(self, line: str | None, ok: bool, note: str | None) -> None:
        if line:
            self.reporter.say(line, ok=ok)


class Reporter:
    """Progress as one line per event, to ``say`` (default: stderr, looked up at each
    line, so a redirected stderr is honoured). Use as a context manager."""

    live = False

    def __init__(self, say: Callable[[str], None] | None = None):
        self._say = say

    def say(self, line: str, *, ok: bool = True) -> None:
        if self._say is not None:
            self._say(line)
        else:
            print(line, file=sys.stderr, flush=True)

    def bar(self, description: str, total: int | None = None, *, completed: int = 0) -> Bar:
        bar = Bar(self, description, total)
        bar.completed = completed
        return bar

    def close(self, error: BaseException | None = None) -> None:
        pass

    def __enter__(self) -> "Reporter":
        return self

    def __exit__(self, kind, error, tb) -> None:
        self.close(error)


class _RichBar(Bar):
    def __init__(self, reporter: "RichReporter", description: str, total: int | None, completed: int):
        super().__init__(reporter, description, total)
        self.completed = completed
        self.task = reporter.progress.add_task(description, total=total, completed=completed, note="", state="")

    def _show(self, line: str | None, ok: bool, note: str | None) -> None:
        fields = {"note": note} if note is not None else {}
        if self.failed:
            fields["state"] = f"[red]{self.failed} failed[/red]"
        self.reporter.progress.update(self.task, completed=self.completed, total=self.total, **fields)
        if line and not ok:  # what the bar stands for is not repeated; a failure is
            self.reporter.say(line, ok=False)

    def done(self, summary: str | None = None, *, ok: bool = True) -> None:
        progress = self.reporter.progress
        if summary:
            progress.remove_task(self.task)
            self.reporter.say(summary, ok=ok)
        else:
            progress.update(self.task, completed=self.completed, total=self.total)
            progress.stop_task(self.task)
        with self.reporter._lock:
            self.reporter._bars.discard(self)

    def fail(self, why: str) -> None:
        """Left on screen, marked: the work ended in an error."""
        self.reporter.progress.update(self.task, state=f"[bold red]{why}[/bold red]")
        self.reporter.progress.stop_task(self.task)


class RichReporter(Reporter):
    """Progress bars (rich) on a terminal. Thread-safe, as rich's progress is: shapes
    tuned in parallel advance their own bars."""

    live = True

    def __init__(self, console=None):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        super().__init__()
        self.console = console or Console(stderr=True)
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(bar_width=30),
                                 MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.fields[note]}"),
                                 TextColumn("{task.fields[state]}"), console=self.console, transient=False,
                                 redirect_stdout=False)  # stdout is the results' own stream
        self._bars: set[_RichBar] = set()
        self._lock = threading.Lock()
        self.progress.start()

    def say(self, line: str, *, ok: bool = True) -> None:
        from rich.text import Text

        self.progress.refresh()  # the bars under the line as they are now, not as last drawn
        self.progress.console.print(Text(line, style=None if ok else "red"), highlight=False, soft_wrap=True)

    def bar(self, description: str, total: int | None = None, *, completed: int = 0) -> Bar:
        bar = _RichBar(self, description, total, completed)
        with self._lock:
            self._bars.add(bar)
        return bar

    def close(self, error: BaseException | None = None) -> None:
        """Stop drawing; a bar whose work did not finish stays, marked as stopped (or with
        the error that ended it)."""
        if error is None:
            why = "stopped"
        else:
            why = "interrupted" if isinstance(error, KeyboardInterrupt) else f"failed: {type(error).__name__}"
        with self._lock:
            unfinished = list(self._bars)
            self._bars.clear()
        for bar in unfinished:
            bar.fail(why)
        self.progress.stop()


def is_terminal(stream: TextIO | None) -> bool:
    """Whether ``stream`` is an interactive terminal that can draw bars (not a pipe, a
    file, a CI log or ``TERM=dumb``)."""
    try:
        return bool(stream is not None and stream.isatty()) and os.environ.get("TERM", "") != "dumb"
    except (AttributeError, ValueError):  # a closed or stand-in stream
        return False


def reporter() -> Reporter:
    """The reporter for stderr as it is: bars on a terminal, lines otherwise."""
    if is_terminal(sys.stderr):
        try:
            return RichReporter()
        except ImportError:  # rich is a dependency; a broken install still gets lines
            pass
    return Reporter()


def as_reporter(progress) -> Reporter:
    """A :class:`Reporter` from what a stage's ``progress`` argument may be: one already,
    a callable taking lines, True (stderr) or None/False (silence)."""
    if isinstance(progress, Reporter):
        return progress
    if progress is None or progress is False:
        return Reporter(lambda line: None)
    if progress is True:
        return Reporter()
    return Reporter(progress)


def build_line(result, done: int, total: int, *, prefix: str = "[build] ") -> str:
    """The line of one finished build: ``[build] 3/8 name: ok (12 s)``."""
    state = "cached" if result.cached else ("ok" if result.ok else "FAILED")
    return f"{prefix}{done}/{total} {result.source.program.name}: {state} ({result.seconds:.0f} s)"


def build_progress(bar: Bar, line: Callable[[int, int, object], str]) -> Callable[[int, int, object], None]:
    """A :func:`l2gen.build.build_many` ``progress`` callback that advances ``bar``,
    each build's line made by ``line(done, total, result)``."""

    def progress(done: int, total: int, result) -> None:
        bar.advance(line(done, total, result), ok=result.ok, completed=done, total=total,
                    note=result.source.program.name)

    return progress


# ---- tables -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Columns:
    """A table: a header, rows of cells (strings), the columns that are text (aligned
    left; the rest are numbers, aligned right). ``plain`` is its plain-text form where
    that predates this record; otherwise it is rendered by :func:`plain_columns`."""

    head: Sequence[str]
    rows: Sequence[Sequence[str]]
    left: frozenset[int] = frozenset()
    plain: str | None = None

    def text(self) -> str:
        return self.plain if self.plain is not None else plain_columns(self.head, self.rows, self.left)


def plain_columns(head: Sequence[str], rows: Sequence[Sequence[str]], left: Collection[int] = ()) -> str:
    """Aligned columns: those in ``left`` (text) to the left, numbers to the right."""
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]

    def line(cells):
        return "  ".join(str(c).ljust(w) if i in left else str(c).rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(r) for r in rows])


def plain(blocks: Sequence) -> str:
    """A report's plain text: each block on its own lines."""
    return "\n".join(b.text() if isinstance(b, Columns) else b for b in blocks)


def show(blocks: Sequence, file: TextIO | None = None, *, console=None) -> None:
    """Print a report: rich tables on a terminal (or on ``console``), else its plain text."""
    file = file or sys.stdout
    if console is None and not is_terminal(file):
        print(plain(blocks), file=file)
        return
    try:
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text
    except ImportError:
        print(plain(blocks), file=file)
        return
    console = console or Console(file=file)
    for b in blocks:
        if isinstance(b, Columns):
            table = Table(show_edge=False, header_style="bold", pad_edge=False)
            for i, name in enumerate(b.head):
                table.add_column(name, justify="left" if i in b.left else "right", no_wrap=True)
            for row in b.rows:
                table.add_row(*(Text(str(c)) for c in row))
            console.print(table)
        else:
            console.print(Text(b), highlight=False, soft_wrap=True)
