"""Progress and tables: plain lines off a terminal (what logs keep and scripts grep), bars
and rich tables on one, and a failure that shows in both."""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
from rich.console import Console

from l2gen import console as con
from l2gen.cli import build_parser, main
from l2gen.compare import compare_results
from l2gen.report import format_table, table_blocks
from l2gen.search.loop import tune
from l2gen.search.policies import RandomPolicy
from l2gen.search.simulate import SimulatedEvaluator
from l2gen.targets import GPUS

H200 = GPUS["h200"]


def _terminal(width: int = 120) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=True, width=width, color_system="truecolor"), out


@dataclass
class _Result:  # what build_many hands its progress callback
    name: str
    ok: bool = True
    cached: bool = False
    seconds: float = 1.0

    @property
    def source(self):
        return SimpleNamespace(program=SimpleNamespace(name=self.name))


def test_off_a_terminal_each_build_is_one_parseable_line():
    lines = []
    with con.Reporter(lines.append) as report:
        bar = report.bar("building", 2)
        progress = con.build_progress(bar, lambda d, t, r: con.build_line(r, d, t))
        progress(1, 2, _Result("a"))
        progress(2, 2, _Result("b", ok=False))
        bar.done("a summary that only a live bar shows")
    assert lines == ["[build] 1/2 a: ok (1 s)", "[build] 2/2 b: FAILED (1 s)"]
    assert bar.failed == 1


def test_the_reporter_picked_for_a_pipe_prints_lines(monkeypatch):
    monkeypatch.setattr("sys.stderr", io.StringIO())
    assert type(con.reporter()) is con.Reporter
    assert not con.is_terminal(io.StringIO())


def test_a_forced_terminal_draws_a_bar_and_marks_a_failure():
    console, out = _terminal()
    with con.RichReporter(console) as report:
        assert report.live
        bar = report.bar("building", 3)
        progress = con.build_progress(bar, lambda d, t, r: con.build_line(r, d, t))
        progress(1, 3, _Result("fast"))
        progress(2, 3, _Result("broken", ok=False))
        progress(3, 3, _Result("slow"))
        bar.done("built 2 of 3, 1 FAILED", ok=False)
    text = out.getvalue()
    assert "[build] 2/3 broken: FAILED" in text  # a failure is printed above the bar
    assert "[build] 1/3 fast" not in text  # what the bar stands for is not repeated
    assert "built 2 of 3, 1 FAILED" in text


def test_an_error_leaves_the_bar_on_screen_marked():
    console, out = _terminal()
    with pytest.raises(RuntimeError):
        with con.RichReporter(console) as report:
            bar = report.bar("measuring", 4)
            bar.advance(note="64x64x64")
            raise RuntimeError("the worker died")
    text = out.getvalue()
    assert "measuring" in text and "1/4" in text and "failed: RuntimeError" in text


def test_tune_draws_a_bar_per_shape_with_its_best_so_far(tmp_path):
    from l2gen.db import KernelDB

    console, out = _terminal(160)
    shapes = ["64x4096x4096", "256x256x256"]
    with KernelDB(tmp_path / "k.db") as db, con.RichReporter(console) as report:
        summary = tune(shapes, RandomPolicy(H200, seed=0), SimulatedEvaluator(H200), db, budget=6, batch=3, gpu=H200,
                       progress=report, parallel=2)
    text = out.getvalue()
    for shape in shapes:
        best = summary.results[next(s for s in summary.results if str(s) == shape)].best_speedup
        assert f"{shape:>18}    6/6  best {best:.3f}x" in text  # each shape's last word replaces its bar
    assert "[tune] 2 shape(s)" in text


def test_tune_lines_off_a_terminal_are_unchanged(tmp_path):
    from l2gen.db import KernelDB

    lines = []
    with KernelDB(tmp_path / "k.db") as db:
        tune(["64x4096x4096"], RandomPolicy(H200, seed=0), SimulatedEvaluator(H200), db, budget=4, batch=2, gpu=H200,
             progress=lines.append)
    batches = [line for line in lines if "/4  best" in line]
    assert len(batches) == 2 and batches[-1].startswith("[tune]       64x4096x4096    4/4  best ")


def _bench_results() -> dict:
    base = {"torch_matmul_us": 10.0, "cublas_us": 9.0}
    row = {"m": 64, "n": 64, "k": 64, "program": "p", "status": "ok", "l2gen_us": 9.5, "tflops": 1.0,
           "floor_pct": 50.0, "baselines": base, "speedup_vs_best": 0.95, "relerr": 1e-4, "error": None}
    shape = {"m": 64, "n": 64, "k": 64, "baselines": base, "cublas_best_us": 9.0, "best_program": "p",
             "speedup_vs_best": 0.95, "l2gen_us": 9.5}
    return {"mode": "events", "l2": "clean", "rows": [row], "shapes": [shape], "floors": None}


def test_tables_are_plain_off_a_terminal_and_rich_on_one():
    results = _bench_results()
    piped = io.StringIO()
    con.show(table_blocks(results), piped)
    assert piped.getvalue() == format_table(results) + "\n"
    console, out = _terminal()
    con.show(table_blocks(results), console=console)
    text = out.getvalue()
    assert "\x1b[" in text and "64x64x64" in text and "0.95" in text and "timed in" in text
    assert "-----" not in text  # rich's rules, not the plain table's dashes


def test_compare_table_is_plain_off_a_terminal_and_rich_on_one():
    first, second = _bench_results(), _bench_results()
    second["rows"][0]["speedup_vs_best"] = 0.5
    comparison = compare_results(first, second, names=("a.json", "b.json"))
    piped = io.StringIO()
    con.show(comparison.blocks(), piped)
    assert piped.getvalue() == comparison.table() + "\n"
    assert "-47.4%  <--" in comparison.table()
    console, out = _terminal()
    con.show(comparison.blocks(), console=console)
    assert "-47.4%" in out.getvalue() and "(a.json -> b.json)" in out.getvalue()


def test_help_lists_every_command_with_a_line(capsys):
    parser = build_parser()
    commands = next(a for a in parser._subparsers._group_actions if a.dest == "command")
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    helps = {c.dest: c.help for c in commands._choices_actions}
    assert set(helps) == set(commands.choices)
    for name, line in helps.items():
        assert line and name in text, name
        assert " ".join(line.split()[:3]) in " ".join(text.split()), name


def test_every_command_has_its_own_help(capsys):
    parser = build_parser()
    commands = next(a for a in parser._subparsers._group_actions if a.dest == "command")
    for name, action in zip(commands.choices, commands._choices_actions):
        assert main([name, "--help"]) == 0
        assert " ".join(action.help.split()) in " ".join(capsys.readouterr().out.split()), name


def test_a_failed_build_on_a_terminal_shows_in_the_bar_and_in_the_text(tmp_path, monkeypatch, capsys, failing_nvcc):
    path = tmp_path / "k.l2"
    path.write_text("kernel k {\n  arch sm80\n  tile 64 x 64 x 32\n}\n")
    console, out = _terminal()
    monkeypatch.setattr(con, "reporter", lambda: con.RichReporter(console))
    assert main(["build", str(path)]) == 1
    drawn = out.getvalue()
    assert re.search(r"\[1/1\] \S+: FAILED", drawn) and "built 0 of 1, 1 FAILED" in drawn
    err = capsys.readouterr().err
    assert "build failed" in err and "something is wrong" in err and "Traceback" not in err
