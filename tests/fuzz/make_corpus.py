"""Writes the fuzz corpus: malformed and adversarial inputs to the CLI, each with the exit
class it must end in (tests/fuzz/test_corpus.py runs them, no nvcc, no GPU).

    python tests/fuzz/make_corpus.py     # rewrites tests/fuzz/corpus/ and tests/fuzz/cases.json

A case is a command line (``{input}``: the case's input file, copied to a scratch folder
first; ``{tmp}``: that folder), a ``prepare`` step for inputs that are built rather than
stored (SQLite files), and ``expect``: ``"ok"`` (exit 0), ``"bad"`` (exit 1 or 2), or an
exact exit code. Every case must end without a traceback and write nothing but what its
``writes`` names (and never change an input it was not asked to write).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

HERE = Path(__file__).parent
CORPUS = HERE / "corpus"
ROOT = HERE.parent.parent

cases: list[dict] = []


def case(name: str, argv: list[str], expect, *, input: str | bytes | None = None, ext: str = "", prepare: str | None = None,
         writes: list[str] = (), unchanged: bool = False, same_input_as: str | None = None) -> None:
    entry = {"name": name, "argv": argv, "expect": expect}
    if same_input_as is not None:  # one stored file, several commands
        entry["input"] = next(c for c in cases if c["name"] == same_input_as)["input"]
    elif input is not None:
        path = CORPUS / f"{name}{ext}"
        (path.write_bytes if isinstance(input, bytes) else path.write_text)(input)
        entry["input"] = path.name
    if prepare:
        entry["prepare"] = prepare
    if writes:
        entry["writes"] = list(writes)
    if unchanged:
        entry["unchanged"] = True  # the input must be byte for byte the same afterwards
    cases.append(entry)


# Inputs that may be fine (a checker's call, not a crash): no traceback is all they must show.
ANY_KERNEL = ("bom", "cr_only", "tabs", "keyword_as_name", "stages_one", "min_blocks_zero", "tile_odd", "splits_huge",
              "swizzle_huge", "long_line", "smem_swizzle_bad", "warps_huge")
ANY_SHAPE = ("64 x 64 x 64", "٦٤x64x64")


def kernels() -> None:
    """DSL files for check, fmt and compile."""
    tiny = (ROOT / "examples" / "tiny_sm80.l2").read_text()
    sm90 = (ROOT / "examples" / "streamk_sm90.l2").read_text()
    l2g = (ROOT / "examples" / "decode_swap_l2gen.l2").read_text()
    body = tiny[tiny.index("\nkernel ") + 1:]  # the program without its leading comment
    good = {"tiny": tiny, "sm90": sm90, "l2gen": l2g, "l2gen_pdl": l2g.replace("stages  4", "stages  4\n    pdl on"),
            "sm90_grid": sm90.replace("stages        auto", "stages        auto\n    grid 64"),
            "sm90_epilogue_tile": sm90.replace("epilogue      tma", "epilogue      tma\n    epilogue_tile 64"),
            "sm90_epilogue_stages": sm90.replace("epilogue      tma", "epilogue      tma\n    epilogue_stages 3")}
    for name, text in good.items():
        case(f"kernel_ok_{name}", ["check", "{input}"], "ok", input=text, ext=".l2")
    bad = {
        "empty": "",
        "whitespace": "   \n\t\n",
        "nul_bytes": body.replace("kn", "k\x00n"),
        "not_utf8": b"kernel \xff\xfe {\n arch sm80\n}\n",
        "bom": "\ufeff" + body,
        "no_close": body.rstrip().rstrip("}"),
        "two_kernels": body + body,
        "no_arch": body.replace("arch         sm80\n", ""),
        "no_tile": body.replace("tile         32 x 64 x 64\n", ""),
        "arch_sm70": body.replace("sm80", "sm70"),
        "tile_zero": body.replace("32 x 64 x 64", "0 x 64 x 64"),
        "tile_negative": body.replace("32 x 64 x 64", "-32 x 64 x 64"),
        "tile_float": body.replace("32 x 64 x 64", "32.5 x 64 x 64"),
        "tile_huge": body.replace("32 x 64 x 64", "99999999999999999999 x 64 x 64"),
        "tile_200k_digits": body.replace("32 x 64 x 64", "3" + "2" * 200_000 + " x 64 x 64"),
        "tile_hex": body.replace("32 x 64 x 64", "0x20 x 64 x 64"),
        "tile_odd": body.replace("32 x 64 x 64", "33 x 64 x 64"),
        "tile_two_dims": body.replace("32 x 64 x 64", "32 x 64"),
        "stages_zero": body.replace("stages       3", "stages       0"),
        "stages_one": body.replace("stages       3", "stages       1"),
        "stages_huge": body.replace("stages       3", "stages       4294967297"),
        "stages_auto_sm80": body.replace("stages       3", "stages       auto"),
        "stages_zero_sm90a": sm90.replace("stages        auto", "stages        0"),
        "stages_zero_l2gen": l2g.replace("stages  4", "stages  0"),
        "stages_digits_sm90a": sm90.replace("stages        auto", "stages        " + "7" * 5000),
        "splits_zero": body.replace("splits       1", "splits       0"),
        "splits_huge": body.replace("splits       1", "splits       1000000000"),
        "splits_too_many_digits": body.replace("splits       1", "splits       " + "1" * 50),
        "swizzle_negative": body.replace("swizzle      0", "swizzle      -1"),
        "swizzle_huge": body.replace("swizzle      0", "swizzle      123456789"),
        "min_blocks_200k_digits": body.replace("min_blocks   2", "min_blocks   " + "9" * 200_000),
        "min_blocks_zero": body.replace("min_blocks   2", "min_blocks   0"),
        "warps_zero": body.replace("warps        1 x 2", "warps        0 x 2"),
        "warps_huge": body.replace("warps        1 x 2", "warps        64 x 64"),
        "smem_swizzle_bad": body.replace("smem_swizzle 3 3 3", "smem_swizzle 9 9 9"),
        "duplicate_decision": body.replace("stages       3", "stages       3\n    stages       4"),
        "sm90_decision_on_sm80": body.replace("stages       3", "stages       3\n    mainloop     pingpong"),
        "sm80_decision_on_sm90": sm90.replace("stages        auto", "stages        auto\n    warps 2 x 2"),
        "cluster_9": sm90.replace("cluster       1 x 1 x 1", "cluster       9 x 1 x 1"),
        "cluster_zero": sm90.replace("cluster       1 x 1 x 1", "cluster       0 x 1 x 1"),
        "epilogue_tma_sm80": body.replace("epilogue     direct", "epilogue     tma"),
        "epilogue_smem_sm90": sm90.replace("epilogue      tma", "epilogue      smem"),
        "unknown_word": body.replace("raster       heuristic", "raster       diagonal"),
        "unknown_decision": body.replace("stages       3", "stages       3\n    unroll       4"),
        "impl_on_sm80": body.replace("arch         sm80", "arch         sm80\n    impl l2gen"),
        "pdl_on_sm80": body.replace("stages       3", "stages       3\n    pdl on"),
        "pdl_on_cutlass": sm90.replace("stages        auto", "stages        auto\n    pdl on"),
        "pdl_maybe_l2gen": l2g.replace("stages  4", "stages  4\n    pdl maybe"),
        "grid_on_sm80": body.replace("stages       3", "stages       3\n    grid 64"),
        "grid_on_cluster_split": l2g.replace("stages  4", "stages  4\n    grid 64"),
        "grid_past_the_sms": sm90.replace("stages        auto", "stages        auto\n    grid 500"),
        "grid_negative": sm90.replace("stages        auto", "stages        auto\n    grid -4"),
        "epilogue_tile_on_l2gen": l2g.replace("stages  4", "stages  4\n    epilogue_tile 64"),
        "epilogue_tile_uneven": sm90.replace("epilogue      tma", "epilogue      tma\n    epilogue_tile 24"),
        "epilogue_stages_on_sm80": body.replace("stages       3", "stages       3\n    epilogue_stages 2"),
        "epilogue_stages_too_deep": sm90.replace("epilogue      tma", "epilogue      tma\n    epilogue_stages 64"),
        "name_template": body.replace("kernel tiny_sm80", "kernel tiny<int>"),
        "name_namespace": body.replace("kernel tiny_sm80", "kernel std::tiny"),
        "name_digit": body.replace("kernel tiny_sm80", "kernel 9tiny"),
        "name_unicode": body.replace("kernel tiny_sm80", "kernel tïny"),
        "name_missing": body.replace("kernel tiny_sm80", "kernel"),
        "cpp_fragment": body.replace("}", '}\nextern "C" void evil() { system("id"); }'),
        "cpp_in_value": body.replace("epilogue     direct", 'epilogue     direct); system("id"); //'),
        "semicolons": body.replace("\n    ", ";\n    "),
        "braces_nested": body.replace("{", "{ {", 1),
        "block_comment": body.replace("stages       3", "stages       3 /* */"),
        "line_continuation": body.replace("stages       3", "stages \\\n 3"),
        "only_comment": "# nothing but a comment\n",
        "deep_braces": "kernel x " + "{" * 5000 + "}" * 5000,
        "long_line": body.replace("stages       3", "stages       3" + " " * 100_000),
        "many_decisions": body.replace("stages       3", "\n".join(["    stages 3"] * 2000)),
        "keyword_as_name": body.replace("kernel tiny_sm80", "kernel kernel"),
        "cr_only": body.replace("\n", "\r"),
        "tabs": body.replace("    ", "\t"),
        "caps": body.replace("sm80", "SM80"),
    }
    for name, text in bad.items():
        case(f"kernel_{name}", ["check", "{input}"], "any" if name in ANY_KERNEL else "bad",
             input=text if isinstance(text, (str, bytes)) else str(text), ext=".l2")
    for name in ("tile_200k_digits", "stages_zero_sm90a", "cpp_fragment", "name_template", "no_close", "not_utf8"):
        case(f"fmt_{name}", ["fmt", "{input}"], "bad", same_input_as=f"kernel_{name}")
        case(f"compile_{name}", ["compile", "{input}", "-o", "{tmp}/out"], "bad", same_input_as=f"kernel_{name}")
    case("fmt_w_inline_comment", ["fmt", "-w", "{input}"], "bad", input=body.replace("stages       3", "stages       3   # keep me"),
         ext=".l2", unchanged=True)
    case("fmt_w_inner_comment_line", ["fmt", "-w", "{input}"], "bad", input=body.replace("    stages", "    # why three\n    stages"),
         ext=".l2", unchanged=True)
    case("fmt_w_leading_comment_ok", ["fmt", "-w", "{input}"], "ok", input="# a kernel\n" + body, ext=".l2", writes=["{input}"])
    case("compile_ok", ["compile", "{input}", "-o", "{tmp}/out"], "ok", input=tiny, ext=".l2", writes=["out/"])
    case("compile_o_is_a_file", ["compile", "{input}", "-o", "{input}"], 2, input=tiny, ext=".l2", unchanged=True)
    case("compile_o_under_a_file", ["compile", "{input}", "-o", "{input}/sub"], 2, input=tiny, ext=".l2", unchanged=True)
    case("compile_o_proc", ["compile", "{input}", "-o", "/proc/l2gen-fuzz"], 2, input=tiny, ext=".l2")
    case("check_missing_file", ["check", "{tmp}/missing.l2"], 1)
    case("check_directory", ["check", "{tmp}"], 1)


def suites() -> None:
    """Suite files for tune --simulate."""
    def shapes(*entries):
        return json.dumps({"shapes": list(entries)})

    bad = {
        "infinity": '{"shapes": [{"m": Infinity, "n": 64, "k": 64}]}',
        "neg_infinity": '{"shapes": [{"m": -Infinity, "n": 64, "k": 64}]}',
        "nan": '{"shapes": [{"m": NaN, "n": 64, "k": 64}]}',
        "float": shapes({"m": 64.5, "n": 64, "k": 64}),
        "float_whole": shapes({"m": 64.0, "n": 64, "k": 64}),
        "bool": shapes({"m": True, "n": 64, "k": 64}),
        "string": shapes({"m": "64", "n": 64, "k": 64}),
        "null": shapes({"m": None, "n": 64, "k": 64}),
        "negative": shapes({"m": -64, "n": 64, "k": 64}),
        "zero": shapes({"m": 0, "n": 64, "k": 64}),
        "huge": shapes({"m": 10**30, "n": 64, "k": 64}),
        "int32_overflow": shapes({"m": 2**31, "n": 64, "k": 64}),
        "digits_200k": '{"shapes": [{"m": ' + "9" * 200_000 + ', "n": 64, "k": 64}]}',
        "missing_k": shapes({"m": 64, "n": 64}),
        "list_entry": shapes([64, 64, 64]),
        "string_entry": shapes("64x64x64"),
        "empty_shapes": shapes(),
        "no_shapes": json.dumps({"about": "x"}),
        "shapes_object": json.dumps({"shapes": {"m": 64}}),
        "top_number": "42",
        "top_string": '"shapes"',
        "not_json": "shapes: [64x64x64]",
        "truncated": '{"shapes": [{"m": 64, "n"',
        "empty": "",
        "deep_nesting": "[" * 100_000 + "]" * 100_000,
        "not_utf8": b'{"shapes": [{"m": 64, "n": 64, "k": 64, "x": "\xff"}]}',
        "b_layout_bad": shapes({"m": 64, "n": 64, "k": 64, "b": "mn"}),
        "b_layout_number": shapes({"m": 64, "n": 64, "k": 64, "b": 1}),
        "b_layout_mixed": shapes({"m": 64, "n": 64, "k": 64, "b": "kn"}, {"m": 64, "n": 128, "k": 64, "b": "nk"}),
        "n_not_multiple_of_8": shapes({"m": 64, "n": 63, "k": 64}),
    }
    for name, text in bad.items():
        case(f"suite_{name}", ["tune", "--simulate", "--budget", "1", "--suite", "{input}", "--db", "{tmp}/s.db"],
             "bad", input=text, ext=".json")
    case("suite_ok", ["tune", "--simulate", "--budget", "1", "--suite", "{input}", "--db", "{tmp}/s.db"], "ok",
         input=shapes({"m": 64, "n": 4096, "k": 4096}), ext=".json", writes=["s.db"])
    case("suite_duplicates_ok", ["tune", "--simulate", "--budget", "1", "--suite", "{input}", "--db", "{tmp}/s.db"], "ok",
         input=shapes({"m": 64, "n": 4096, "k": 4096}, {"m": 64, "n": 4096, "k": 4096}), ext=".json", writes=["s.db"])


def shapes_and_numbers() -> None:
    """--shape and the numeric options."""
    tune = ["tune", "--simulate", "--db", "{tmp}/s.db"]
    for i, text in enumerate(["99999999999999999999999x4096x4096", "0x64x64", "-1x64x64", "64x64", "64x64x64x64", "64X64X64X",
                              "axbxc", "64.0x64x64", "1e3x64x64", "", "x", "64xx64", "٦٤x64x64", "2147483648x64x64",
                              "64 x 64 x 64", "64x64x" + "9" * 5000, "0x0x0", "64x63x64"]):
        if text in ANY_SHAPE:
            case(f"shape_{i:02d}", tune + ["--budget", "1", "--shape", text], "any", writes=["s.db"])
        else:
            case(f"shape_{i:02d}", tune + ["--budget", "1", "--shape", text], "bad")
    case("shape_ok_spaces_around", tune + ["--budget", "1", "--shape", " 64x4096x4096 "], "any", writes=["s.db"])
    case("shape_int32_max_n_unserved", tune + ["--budget", "1", "--shape", "1x2147483647x64"], "bad")
    numbers = {
        "budget_zero": tune + ["--shape", "64x4096x4096", "--budget", "0"],
        "budget_negative": tune + ["--shape", "64x4096x4096", "--budget", "-3"],
        "budget_word": tune + ["--shape", "64x4096x4096", "--budget", "many"],
        "budget_float": tune + ["--shape", "64x4096x4096", "--budget", "2.5"],
        "budget_digits": tune + ["--shape", "64x4096x4096", "--budget", "9" * 5000],
        "batch_zero": tune + ["--shape", "64x4096x4096", "--batch", "0"],
        "parallel_zero": tune + ["--shape", "64x4096x4096", "--parallel", "0"],
        "bundle_zero": tune + ["--shape", "64x4096x4096", "--bundle", "0"],
        "reps_zero": tune + ["--shape", "64x4096x4096", "--reps", "0"],
        "reps_29": tune + ["--shape", "64x4096x4096", "--reps", "29"],
        "rounds_zero": tune + ["--shape", "64x4096x4096", "--rounds", "0"],
        "jobs_zero_tune": tune + ["--shape", "64x4096x4096", "-j", "0"],
        "jobs_zero_build": ["build", "-j", "0", "{root}/examples/tiny_sm80.l2"],
        "jobs_negative_build": ["build", "-j", "-4", "{root}/examples/tiny_sm80.l2"],
        "timeout_zero_build": ["build", "--timeout", "0", "{root}/examples/tiny_sm80.l2"],
        "timeout_nan_build": ["build", "--timeout", "nan", "{root}/examples/tiny_sm80.l2"],
        "timeout_inf_build": ["build", "--timeout", "inf", "{root}/examples/tiny_sm80.l2"],
        "sample_count_negative": ["sample", "--count", "-1"],
        "sample_count_zero": ["sample", "--count", "0"],
        "sample_bundle_zero": ["sample", "--bundle", "0"],
        "sample_jobs_zero": ["sample", "-j", "0"],
        "sample_timeout_negative": ["sample", "--timeout", "-1"],
        "bench_reps_zero": ["bench", "--shape", "64x64x64", "--reps", "0", "-o", "{tmp}/b.json"],
        "bench_rounds_zero": ["bench", "--shape", "64x64x64", "--rounds", "0", "-o", "{tmp}/b.json"],
        "bench_seeds_zero": ["bench", "--shape", "64x64x64", "--seeds", "0", "-o", "{tmp}/b.json"],
        "bench_top_zero": ["bench", "--db", "{tmp}/none.db", "--top", "0", "-o", "{tmp}/b.json"],
        "bench_qps_zero": ["bench", "--shape", "64x64x64", "--mode", "server", "--qps", "0", "-o", "{tmp}/b.json"],
        "bench_qps_nan": ["bench", "--shape", "64x64x64", "--mode", "server", "--qps", "nan", "-o", "{tmp}/b.json"],
        "bench_graph_calls_zero": ["bench", "--shape", "64x64x64", "--mode", "graph", "--graph-calls", "0", "-o", "{tmp}/b.json"],
        "compare_tolerance_negative": ["compare", "a.json", "b.json", "--tolerance", "-0.1"],
        "compare_tolerance_inf": ["compare", "a.json", "b.json", "--tolerance", "inf"],
        "curves_budget_zero": ["curves", "{tmp}/none.db", "--budget", "0"],
        "gpu_unknown": ["--gpu", "h900", "check", "{root}/examples/tiny_sm80.l2"],
        "no_command": [],
        "unknown_command": ["frobnicate"],
        "unknown_option": ["check", "--frob", "{root}/examples/tiny_sm80.l2"],
        "l2_unknown": tune + ["--shape", "64x4096x4096", "--l2", "lukewarm"],
        "policy_unknown": tune + ["--shape", "64x4096x4096", "--policy", "psychic"],
        "llm_unconfigured": tune + ["--shape", "64x4096x4096", "--policy", "llm", "--llm-base-url", "http://127.0.0.1:9/v1"],
    }
    for name, argv in numbers.items():
        case(f"arg_{name}", argv, "bad")


def outputs() -> None:
    """Output paths that are directories, unwritable, or under a file."""
    tune = ["tune", "--simulate", "--budget", "2", "--shape", "64x4096x4096", "--db", "{tmp}/s.db"]
    for name, extra in {
        "curves_dir": ["--curves", "{tmp}"],
        "curves_proc": ["--curves", "/proc/l2gen-fuzz.json"],
        "curves_under_file": ["--curves", "{input}/c.json"],
        "policy_state_proc": ["--policy-state", "/proc/p.json"],
        "policy_state_dir": ["--policy-state", "{tmp}"],
        "policy_state_under_file": ["--policy-state", "{input}/p.json"],
    }.items():
        case(f"out_tune_{name}", tune + extra, 2, input="a file, not a directory\n", ext=".txt", unchanged=True)
    case("out_tune_curves_ok", tune + ["--curves", "{tmp}/new/c.json"], "ok", writes=["s.db", "new/"])
    results = json.dumps({"gpu": "h200", "rows": [], "shapes": []})
    for name, argv in {
        "export_dir": ["db", "export", "{tmp}", "--db", "{tmp}/s.db"],
        "export_proc": ["db", "export", "/proc/e.json", "--db", "{tmp}/s.db"],
        "compare_o_dir": ["compare", "{input}", "{input}", "-o", "{tmp}"],
        "compare_o_proc": ["compare", "{input}", "{input}", "-o", "/proc/c.json"],
        "sample_o_dir": ["sample", "--count", "1", "-o", "{tmp}"],
        "sample_o_proc": ["sample", "--count", "1", "-o", "/proc/s.json"],
        "bench_o_dir": ["bench", "--shape", "64x64x64", "-o", "{tmp}"],
        "bench_o_proc": ["bench", "--shape", "64x64x64", "-o", "/proc/b.json"],
        "curves_o_dir": ["curves", "{tmp}/s.db", "-o", "{tmp}"],
        "curves_plot_proc": ["curves", "{tmp}/s.db", "--plot", "/proc/c.png"],
    }.items():
        case(f"out_{name}", argv, 2, input=results, ext=".json", prepare="simulated_db", writes=["s.db"], unchanged=True)


def databases() -> None:
    """Database paths: foreign SQLite files, not SQLite at all, odd names."""
    tune = ["tune", "--simulate", "--budget", "2", "--shape", "64x4096x4096", "--db"]
    for prepare in ("foreign_with_meta", "foreign_without_meta", "foreign_meta_and_measurements", "text_file", "truncated_db",
                    "corrupt_pages", "random_bytes", "newer_schema"):
        case(f"db_tune_{prepare}", tune + ["{tmp}/x.db"], "bad", prepare=prepare, unchanged=True)
        case(f"db_show_{prepare}", ["db", "show", "--db", "{tmp}/x.db"], "bad", prepare=prepare, unchanged=True)
        case(f"db_import_{prepare}", ["db", "import", "{input}", "--db", "{tmp}/x.db"], "bad", prepare=prepare, unchanged=True,
             input=json.dumps({"format": "l2gen-kernel-db", "schema_version": 2, "measurements": []}), ext=".json")
    case("db_tune_directory", tune + ["{tmp}"], "bad")
    case("db_show_missing", ["db", "show", "--db", "{tmp}/missing.db"], "bad")
    case("db_export_missing", ["db", "export", "{tmp}/e.json", "--db", "{tmp}/missing.db"], "bad")
    for i, name in enumerate(["a?b.db", "a#b.db", "a%20b.db", "a%b.db", "a b.db", "a?mode=ro.db", "ä.db"]):
        case(f"db_name_{i}", tune + ["{tmp}/" + name], "ok", writes=[name])
    case("db_tune_measured_then_simulated", tune + ["{tmp}/x.db"], 2, prepare="measured_db", unchanged=True)
    case("db_import_bench_into_simulated", ["db", "import-bench", "{input}", "--db", "{tmp}/s.db"], 2, prepare="simulated_db",
         input=json.dumps({"gpu": "h200", "rows": []}), ext=".json", writes=["s.db"])


def results_files() -> None:
    """Bench results files for compare and db import-bench, and exports for db import."""
    row = {"m": 64, "n": 4096, "k": 4096, "program": "tiny", "program_text": (ROOT / "examples" / "tiny_sm80.l2").read_text(),
           "status": "ok", "l2gen_us": 20.0, "cublas_best_us": 17.0, "speedup_vs_best": 0.85, "relerr": 2e-4,
           "baselines": {"cublas_us": 17.0}}
    good = {"gpu": "h200", "mode": "events", "l2": "clean", "rows": [row],
            "shapes": [{"m": 64, "n": 4096, "k": 4096, "cublas_best_us": 17.0, "speedup_vs_best": 0.85}]}

    def with_row(**changes):
        return json.dumps(dict(good, rows=[dict(row, **changes)]))

    bad = {
        "negative_m": with_row(m=-64),
        "zero_n": with_row(n=0),
        "string_k": with_row(k="4096"),
        "float_m": with_row(m=64.5),
        "bool_m": with_row(m=True),
        "huge_m": with_row(m=10**40),
        "missing_m": json.dumps(dict(good, rows=[{k: v for k, v in row.items() if k != "m"}])),
        "nan_time": with_row(l2gen_us=float("nan")),
        "inf_time": with_row(l2gen_us=float("inf")),
        "negative_time": with_row(l2gen_us=-1.0),
        "string_time": with_row(l2gen_us="fast"),
        "negative_speedup": with_row(speedup_vs_best=-2.0),
        "program_number": with_row(program=7),
        "program_text_number": with_row(program_text=7),
        "program_text_garbage": with_row(program_text="not a program"),
        "program_text_cpp": with_row(program_text='#include <cstdlib>\nint main() { system("id"); }'),
        "status_number": with_row(status=3),
        "baselines_list": with_row(baselines=[1, 2]),
        "baseline_negative": with_row(baselines={"cublas_us": -5}),
        "rows_number": json.dumps(dict(good, rows=5)),
        "rows_string": json.dumps(dict(good, rows="rows")),
        "row_list": json.dumps(dict(good, rows=[[64, 4096, 4096]])),
        "shapes_negative": json.dumps(dict(good, shapes=[{"m": -1, "n": 8, "k": 8}])),
        "top_list": json.dumps([good]),
        "not_json": "rows: []",
        "empty": "",
        "digits_200k": '{"gpu": "h200", "rows": [{"m": ' + "9" * 200_000 + "}]}",
        "deep": "[" * 100_000 + "]" * 100_000,
        "mode_unknown": json.dumps(dict(good, mode="quantum")),
        "l2_unknown": json.dumps(dict(good, l2="tepid")),
    }
    for name, text in bad.items():
        # compare reads speedups, not programs: a program text it cannot parse is no reason to refuse
        expect = "any" if name in ("program_text_garbage", "program_text_cpp") else "bad"
        case(f"results_compare_{name}", ["compare", "{input}", "{input}"], expect, input=text, ext=".json", unchanged=True)
        if name not in ("program_text_number",):
            case(f"results_import_bench_{name}", ["db", "import-bench", "{input}", "--db", "{tmp}/k.db"], "bad",
                 same_input_as=f"results_compare_{name}", unchanged=True, writes=["k.db"])
    case("results_compare_ok", ["compare", "{input}", "{input}"], "ok", input=json.dumps(good), ext=".json")
    case("results_import_bench_ok", ["db", "import-bench", "{input}", "--db", "{tmp}/k.db"], "ok", input=json.dumps(good), ext=".json",
         writes=["k.db"])

    record = {"id": 1, "gpu": "h200", "arch": "sm80", "m": 64, "n": 4096, "k": 4096, "program_text": row["program_text"],
              "program_key": "x", "status": "ok", "time_us": 20.0, "baseline_us": 17.0, "relerr": 2e-4, "error": None,
              "policy": "bench", "created_at": "2026-12-01T00:00:00+00:00", "env": {}, "l2": "clean"}
    export = {"format": "l2gen-kernel-db", "schema_version": 2, "gpu": "h200", "l2": "clean", "measurements": [record]}

    def with_record(**changes):
        return json.dumps(dict(export, measurements=[dict(record, **changes)]))

    bad_exports = {
        "not_a_program": with_record(program_text="not a program"),
        "program_cpp": with_record(program_text='kernel x { arch sm80 tile 64 x 64 x 32 } extern "C" int y;'),
        "program_template_name": with_record(program_text="kernel x<y> { arch sm80 tile 64 x 64 x 32 }"),
        "program_number": with_record(program_text=12),
        "arch_mismatch": with_record(arch="sm90a"),
        "negative_m": with_record(m=-1),
        "string_n": with_record(n="4096"),
        "nan_time": with_record(time_us=float("nan")),
        "status_unknown": with_record(status="great"),
        "gpu_number": with_record(gpu=1),
        "env_list": with_record(env=[1]),
        "created_missing": json.dumps(dict(export, measurements=[{k: v for k, v in record.items() if k != "created_at"}])),
        "l2_unknown": with_record(l2="tepid"),
        "two_gpus": json.dumps(dict(export, gpu=None, measurements=[record, dict(record, gpu="a100", id=2)])),
        "wrong_format": json.dumps(dict(export, format="sqlite")),
        "schema_string": json.dumps(dict(export, schema_version="2")),
        "schema_newer": json.dumps(dict(export, schema_version=99)),
        "measurements_object": json.dumps(dict(export, measurements={})),
        "record_string": json.dumps(dict(export, measurements=["row"])),
        "top_list": json.dumps([export]),
        "empty": "",
        "not_json": "{format: l2gen}",
        "digits_200k": '{"format": "l2gen-kernel-db", "schema_version": ' + "9" * 200_000 + "}",
    }
    for name, text in bad_exports.items():
        case(f"export_import_{name}", ["db", "import", "{input}", "--db", "{tmp}/k.db"], "bad", input=text, ext=".json", unchanged=True,
             writes=["k.db"])
    case("export_import_ok", ["db", "import", "{input}", "--db", "{tmp}/k.db"], "ok", input=json.dumps(export), ext=".json",
         writes=["k.db"])


def main() -> None:
    if CORPUS.exists():
        shutil.rmtree(CORPUS)
    CORPUS.mkdir(parents=True)
    kernels()
    suites()
    shapes_and_numbers()
    outputs()
    databases()
    results_files()
    names = [c["name"] for c in cases]
    assert len(names) == len(set(names)), "case names must be unique"
    (HERE / "cases.json").write_text(json.dumps(cases, indent=1) + "\n")
    print(f"{len(cases)} cases, {len(list(CORPUS.iterdir()))} input files in {CORPUS}")


if __name__ == "__main__":
    main()
