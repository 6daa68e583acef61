"""A property over the CLI's argument parser: whatever the command line, ``l2gen``
answers with an exit code (0, 1 or 2) and a message, never a traceback. Arguments are
drawn from the CLI's own commands and options, values from the kinds that broke it
(huge, negative, zero, non-finite, empty, paths that are directories or unwritable),
so most draws reach the commands' own checks, not only argparse's. No nvcc, no GPU:
every command that would need them is refused before it starts, or ends on a clean
'no GPU' error."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from l2gen.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ["check", "fmt", "compile", "build", "sample", "bench", "compare", "bench-dispatch", "tune", "curves", "db"]
DB_ACTIONS = ["show", "export", "import", "import-bench"]


def _options(command: str) -> list[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sorted({s for a in sub.choices[command]._actions for s in a.option_strings if s not in ("-h", "--help")})


OPTIONS = {c: _options(c) for c in COMMANDS}
VALUES = st.one_of(
    st.sampled_from(["0", "-1", "1", "2", "30", "nan", "inf", "-inf", "1e309", "9" * 5000, "", " ", "x", "64x64x64",
                     "99999999999999999999999x4096x4096", "0x0x0", "64x4096x4096", "/tmp", "/proc/l2gen.json", "/dev/null",
                     "{tmp}", "{tmp}/out.json", "{tmp}/k.db", "{tmp}/a?b#c%d.db", "examples/tiny_sm80.l2", "suites/smoke.json",
                     "clean", "dirty", "warm", "events", "graph", "server", "random", "embedded", "llm", "h200", "a100", "kn", "nk"]),
    st.text(max_size=12),
    st.integers(-(10**30), 10**30).map(str),
)


@st.composite
def command_lines(draw) -> list[str]:
    command = draw(st.sampled_from(COMMANDS))
    argv = [command]
    if command == "db":
        argv.append(draw(st.sampled_from(DB_ACTIONS)))
    for _ in range(draw(st.integers(0, 6))):
        if draw(st.booleans()) and OPTIONS[command]:
            argv.append(draw(st.sampled_from(OPTIONS[command])))
        argv.append(draw(VALUES))
    if command in ("tune",) and draw(st.booleans()):
        argv.append("--simulate")
    return argv


@settings(max_examples=300, deadline=None, derandomize=True,  # the same draws in every CI run
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(argv=command_lines())
def test_no_command_line_ends_in_a_traceback(argv, tmp_path_factory, monkeypatch, capsys):
    tmp = tmp_path_factory.mktemp("cli")
    monkeypatch.chdir(tmp)
    monkeypatch.setenv("L2GEN_CACHE_DIR", str(tmp / "cache"))
    monkeypatch.setenv("L2GEN_NVCC", str(tmp / "no-nvcc"))  # nothing compiles: a build ends on a clean error
    for var in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "L2GEN_LLM_MODEL"):
        monkeypatch.delenv(var, raising=False)
    argv = [a.replace("{tmp}", str(tmp)) for a in argv]
    for rel in ("examples/tiny_sm80.l2", "suites/smoke.json"):  # copies: a draw may name one as an output
        (tmp / rel).parent.mkdir(exist_ok=True)
        shutil.copyfile(ROOT / rel, tmp / rel)
    if argv[0] == "tune":
        argv += ["--budget", "2", "--batch", "2"]  # the last one counts: a valid tune stays short
    rc = main(argv)  # an exception escaping main is a traceback: the property fails with it
    err = capsys.readouterr().err
    assert rc in (0, 1, 2, 130), rc
    assert "Traceback" not in err
    if rc not in (0, 130):
        assert err.strip()
