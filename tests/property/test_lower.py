"""Properties of lowering: every valid program renders, deterministically, to a translation
unit with the documented ABI, which the build can bundle."""

from hypothesis import HealthCheck, given, settings

from l2gen.build import split_includes
from l2gen.ir import Family
from l2gen.lower import EXTENDED_MMA_SHAPES_FLAG, STANDARD_WGMMA_N, lower
from l2gen.printer import format_program
from l2gen.targets import GPUS

from .strategies import valid_program

H200 = GPUS["h200"]
SLOW = settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow], deadline=None)


@SLOW
@given(valid_program())
def test_lowering_is_deterministic(program):
    a, b = lower(program, H200), lower(program, H200)
    assert a.code == b.code and a.entry == b.entry and a.key == b.key


@SLOW
@given(valid_program())
def test_lowered_source_has_the_abi(program):
    source = lower(program, H200)
    entries = source.host_code or source.code  # the host code holds them, when there is some
    for symbol in (source.entry, f"{source.entry}_workspace", f"{source.entry}_program"):
        assert f"{symbol}(" in entries
    assert entries.count('extern "C"') >= 3
    assert format_program(program).splitlines()[0] in source.code  # the program, as a comment
    assert "-DNDEBUG" in source.flags
    assert ("sm_90a" in source.gencode) == (program.family.arch == "sm90a")
    includes, _body = split_includes(source.code)  # bundleable: every include comes first
    assert any("cute" in line or "cutlass" in line for line in includes)
    if source.host_code:  # the host code is plain C++: no CuTe for the host compiler
        host_includes, _ = split_includes(source.host_code)
        assert not any("cute" in line or "cutlass" in line for line in host_includes)


@SLOW
@given(valid_program())
def test_code_generation_settings_are_flags(program):
    source = lower(program, H200)
    n = program.config.tile.n if program.family is Family.SM90 else None
    if program.family is Family.SM90_L2GEN:
        n = program.config.kernel_tile[1]
    wide = n is not None and n not in STANDARD_WGMMA_N
    assert (EXTENDED_MMA_SHAPES_FLAG in source.flags) == wide
    assert "#define CUTE_" not in source.code + source.host_code


@SLOW
@given(valid_program(), valid_program())
def test_different_programs_get_different_entries(p, q):
    if format_program(p) != format_program(q):
        assert lower(p, H200).entry != lower(q, H200).entry
