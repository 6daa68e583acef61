"""Properties of the front end: round trips, and no crash on any input."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from l2gen.check import check
from l2gen.diagnostics import DiagnosticError
from l2gen.parse import parse
from l2gen.printer import format_program
from l2gen.targets import GPUS

from .strategies import any_program, valid_program

H200 = GPUS["h200"]


@given(any_program())
def test_print_parse_round_trip(program):
    text = format_program(program)
    assert parse(text) == program
    assert format_program(parse(text)) == text


@given(valid_program())
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_valid_programs_check_clean(program):
    assert check(program, H200) == []


def _mutate(text: str, data) -> str:
    """Insert, delete or replace a few characters or tokens of a program's text."""
    words = ["kernel", "arch", "sm80", "sm90a", "tile", "x", "{", "}", "#", "\n", "0", "999",
             "-1", "warps", "cluster", "auto", "splits", "b", "nk", "stages", "\x00", "é"]
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(text)))
        op = data.draw(st.sampled_from(["insert", "delete", "replace"]))
        piece = data.draw(st.one_of(st.sampled_from(words), st.text(max_size=3)))
        if op == "insert":
            text = text[:i] + piece + text[i:]
        elif op == "delete":
            text = text[:i] + text[i + data.draw(st.integers(1, 8)):]
        else:
            text = text[:i] + piece + text[i + len(piece):]
    return text


@given(any_program(), st.data())
def test_checker_never_raises_on_mutated_text(program, data):
    text = _mutate(format_program(program), data)
    try:
        parsed = parse(text, "fuzz.l2")
    except DiagnosticError as exc:
        assert exc.diagnostics and all(d.span.file == "fuzz.l2" for d in exc.diagnostics)
        return
    for gpu in GPUS.values():
        for d in check(parsed, gpu):
            assert d.code.startswith("E-") and d.span.line >= 1


@given(st.text(max_size=200))
def test_parser_never_raises_on_random_text(text):
    try:
        parse(text)
    except DiagnosticError as exc:
        assert exc.diagnostics


@given(valid_program())
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_pdl_is_a_launch_knob_of_l2gen_kernels_only(program):
    """``pdl on`` round-trips, keeps an l2gen program valid and its library the same (a
    launch choice, not a build one), and is refused for every other family: by the parser
    in text, by the checker in a program built otherwise."""
    import pytest

    from l2gen.ir import Family
    from l2gen.lower import build_program

    on = program.with_knobs(pdl=True)
    problems = check(on, H200)
    if program.family is Family.SM90_L2GEN:
        assert parse(format_program(on)) == on
        assert problems == [] and build_program(on) == build_program(program)
    else:
        assert [d.code for d in problems] == ["E-KNOB"]
        with pytest.raises(DiagnosticError, match="E-FAMILY"):
            parse(format_program(on))
