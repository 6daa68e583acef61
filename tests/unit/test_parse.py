"""Parser and printer: well-formed text becomes records; bad text becomes located diagnostics."""

import pytest

from l2gen.diagnostics import DiagnosticError
from l2gen.ir import BLayout, Family, Mainloop, Scheduler, SplitK
from l2gen.parse import parse
from l2gen.printer import format_program

SM80 = """
# decode-shaped
kernel decode {
    arch sm80
    b nk
    tile 64x128x64      # compact form
    warps 2 x 2
    stages 4
    split_k parallel
    splits 4
    raster along_n
    swizzle 2
}
"""

SM90 = """kernel big {
    arch sm90a
    tile 128 x 256 x 64
    cluster 2 x 1 x 1
    mainloop cooperative
    scheduler stream_k
    splits 2
    decomposition stream_k
}"""


def test_sm80_program_fields():
    p = parse(SM80, "decode.l2")
    assert p.family is Family.SM80 and p.b_layout is BLayout.NK
    assert (p.config.tile.m, p.config.tile.n, p.config.tile.k) == (64, 128, 64)
    assert p.config.split_k is SplitK.PARALLEL and p.knobs.splits == 4
    assert p.span_of("tile").line == 6 and p.span_of("tile").file == "decode.l2"


def test_sm90_defaults_and_fields():
    p = parse(SM90)
    assert p.family is Family.SM90 and p.b_layout is BLayout.KN
    assert p.config.mainloop is Mainloop.COOPERATIVE
    assert p.config.scheduler is Scheduler.STREAM_K
    assert p.config.stages == 0  # auto


@pytest.mark.parametrize("text", [SM80, SM90])
def test_round_trip(text):
    p = parse(text)
    canonical = format_program(p)
    assert parse(canonical) == p
    assert format_program(parse(canonical)) == canonical


def test_spans_do_not_affect_equality():
    assert parse(SM80, "a.l2") == parse("\n\n" + SM80, "b.l2")


# (text, expected code, expected line, expected column, message fragment)
BAD = [
    ("", "E-PARSE", 1, 1, "expected 'kernel'"),
    ("kernel {", "E-PARSE", 1, 8, "a name"),
    ("kernel k {", "E-PARSE", 1, 11, "'}'"),
    ("kernel k { arch sm80 tile 64x64x32 ", "E-PARSE", 1, 36, "end of input"),
    ("kernel k { arch sm70 tile 64x64x32 }", "E-PARSE", 1, 17, "'sm80' | 'sm90a'"),
    ("kernel k { arch sm80 tile 64x64 }", "E-PARSE", 1, 33, "'x'"),
    ("kernel k { arch sm80 tile 64x64x32 frobnicate 3 }", "E-PARSE", 1, 36, "'warps'"),
    ("kernel k { arch sm80 tile 64x64x32 stages fast }", "E-PARSE", 1, 43, "'auto'"),
    ("kernel k { arch sm80 tile -64x64x32 }", "E-PARSE", 1, 27, ""),
    ("kernel k { arch sm80 tile 64x64x32 b tn }", "E-PARSE", 1, 38, "'kn' | 'nk'"),
    ("kernel k { arch sm80 tile 64x64x32 epilogue fancy }", "E-PARSE", 1, 45, "'direct'"),
    ("kernel k { arch sm80 tile 64x64x32 } kernel j { }", "E-PARSE", 1, 38, "one kernel"),
    ("kernel 9k { arch sm80 tile 64x64x32 }", "E-PARSE", 1, 8, ""),
    ("kernel k { tile 64x64x32 }", "E-MISSING", 1, 8, "'arch'"),
    ("kernel k { arch sm80 }", "E-MISSING", 1, 8, "'tile'"),
    ("kernel k { arch sm80\n tile 64x64x32\n tile 64x64x32 }", "E-DUP", 3, 2, "given twice"),
    ("kernel k { arch sm80 tile 64x64x32 cluster 1x1x1 }", "E-FAMILY", 1, 36, "sm90a decision"),
    ("kernel k { arch sm80 tile 64x64x32 mainloop ws }", "E-FAMILY", 1, 36, "sm90a decision"),
    ("kernel k { arch sm90a tile 128x128x64 warps 2x2 }", "E-FAMILY", 1, 39, "sm80 decision"),
    ("kernel k { arch sm90a tile 128x128x64 split_k parallel }", "E-FAMILY", 1, 39, "sm80 decision"),
    ("kernel k { arch sm80 tile 64x64x32 decomposition stream_k }", "E-FAMILY", 1, 36, "sm90a decision"),
    ("kernel k { arch sm80 tile 64x64x32 epilogue tma }", "E-VALUE", 1, 36, "sm90a epilogue"),
    ("kernel k { arch sm90a tile 128x128x64 epilogue smem }", "E-VALUE", 1, 39, "sm80 epilogue"),
    ("kernel k { arch sm80 tile 64x64x32 stages auto }", "E-VALUE", 1, 36, "stage count"),
]


@pytest.mark.parametrize("text,code,line,col,fragment", BAD)
def test_bad_input_has_located_diagnostic(text, code, line, col, fragment):
    with pytest.raises(DiagnosticError) as info:
        parse(text, "bad.l2")
    d = info.value.diagnostics[0]
    assert d.code == code, str(d)
    assert (d.span.line, d.span.col) == (line, col), str(d)
    assert fragment in d.message, str(d)
    assert str(d).startswith(f"bad.l2:{line}:{col}: {code}: ")


def test_parse_file_reports_unreadable(tmp_path):
    from l2gen.parse import parse_file

    with pytest.raises(DiagnosticError) as info:
        parse_file(tmp_path / "missing.l2")
    assert info.value.diagnostics[0].code == "E-IO"
