"""The trust boundary: program text from a kernel database, an import or an LLM is parsed
and checked before any lowering, and no text from those sources reaches the C++ compiler
except as checked decision values. Each route gets hostile text: C++ fragments,
preprocessor lines, template brackets in names."""

from __future__ import annotations

import json
import sqlite3

import pytest

from l2gen.check import is_valid
from l2gen.cli import main
from l2gen.db import KernelDB
from l2gen.dispatch import Dispatcher
from l2gen.lower import lower
from l2gen.problem import Measurement, Shape
from l2gen.lower import build_program
from l2gen.search.llm_prompt import read_answer
from l2gen.targets import GPUS

H200 = GPUS["h200"]
VALID = "kernel ok {\n    arch sm80\n    tile 64 x 128 x 64\n    warps 2 x 2\n    stages 4\n}\n"
MARKERS = ("passwd", "system(", "asm", "evil", "pragma", "define", "vector", "attribute", "rm -rf")

# Unparsable: each must be refused outright.
REFUSED = [
    "kernel std::vector<int> {\n    arch sm80\n    tile 64 x 128 x 64\n}",
    "kernel ok<evil> {\n    arch sm80\n    tile 64 x 128 x 64\n}",
    'kernel ok {\n    arch sm80; asm("trap;")\n    tile 64 x 128 x 64\n}',
    VALID + '}\nextern "C" void evil() { system("rm -rf /"); }',
    "kernel __attribute__((constructor)) evil {\n    arch sm80\n    tile 64 x 128 x 64\n}",
    'kernel ok {\n    arch sm80\n    tile 64 x 128 x 64\n    epilogue smem);system("id");//\n}',
    "kernel ok {\n    arch sm80\n    tile 64 x 128 x 64 >> 2\n}",
    "kernel ok {\n    arch sm80\n    tile (64) x 128 x 64\n}",
    "kernel ok {\n    arch sm80\n    tile 64 x 128 x 64\n    stages 4 /* */ ; int evil = 0;\n}",
    "#include </etc/passwd>",
    "not a program",
    "",
]
# Parsable only because '#' starts a DSL comment: the comment must not reach the C++.
COMMENTED = [
    '#include "/etc/passwd"\n' + VALID,
    VALID.replace("arch sm80", "arch sm80  # ); system(\"rm -rf /\"); asm(\"evil\")"),
    VALID.replace("    tile", "#pragma evil\n#define tile std::vector<int>\n    tile"),
    VALID + '#endif\n#error evil __attribute__((constructor))\n',
]


def assert_clean(program) -> None:
    """The C++ lowered from a program holds none of the hostile fragments."""
    code = lower(build_program(program), H200).code
    host = lower(build_program(program), H200).host_code or ""
    for marker in MARKERS:
        # the templates' own text may hold a marker word (e.g. 'pragma unroll'): compare against a clean program's
        clean = lower(build_program(program_of(VALID)), H200)
        assert (code + host).count(marker) == (clean.code + (clean.host_code or "")).count(marker), marker


def program_of(text):
    from l2gen.parse import parse

    return parse(text)


# -- route 1: a kernel database -------------------------------------------------------------


def _hostile_db(path) -> None:
    """A database whose rows hold hostile program text, written past KernelDB (as a forged
    or damaged file would be), each a 'winner' of its own shape."""
    with KernelDB(path) as db:
        db.add(Measurement(Shape(64, 64, 64), program_of(VALID), "ok", time_us=1.0, baseline_us=10.0), H200, "tune", {"nvcc": "x"})
    conn = sqlite3.connect(path)
    for i, text in enumerate(REFUSED + COMMENTED):
        conn.execute(
            "INSERT INTO measurements (gpu, arch, m, n, k, program_text, program_key, status, time_us, baseline_us, policy, created_at, env, l2) "
            "VALUES ('h200', 'sm80', ?, 256, 256, ?, ?, 'ok', 1.0, 10.0, 'forged', '2026-01-01', '{\"nvcc\": \"x\"}', 'clean')",
            (8 * (i + 1), text, f"key{i}"))
    conn.commit()
    conn.close()


def test_database_route_parses_and_checks_before_anything_is_lowered(tmp_path):
    path = tmp_path / "forged.db"
    _hostile_db(path)
    with pytest.warns(UserWarning, match="no longer parses"), KernelDB(path, readonly=True) as db:
        best = db.best_all(H200)
    assert len(best) == 1 + len(COMMENTED)  # every refused text skipped
    for program, _, _ in best.values():
        assert_clean(program)

    loaded = []

    class Recording:
        def load(self, program, gpu):
            loaded.append(program)
            assert_clean(program)
            return object()

        def workspace(self, *args):
            return None

        def stream(self, like):
            return 0

        def eligible(self, a, b, out):
            return True

        def empty(self, like, m, n):
            return None

        def launch(self, *args):
            return 0

        def capturing(self):
            return False

        def relerr(self, out, ref):
            return 0.0

    with pytest.warns(UserWarning):
        d = Dispatcher(path, H200, launcher=Recording(), fallback=lambda a, b, out=None: None, toolchain={"nvcc": "x"}, verify=False)
    for shape in best:
        d.plan(shape.m, shape.n, shape.k) and d._prepare(shape.m, shape.n, shape.k, None)
    assert loaded and all(is_valid(p, H200) for p in loaded)


def test_database_route_a_well_formed_but_unchecked_program_is_never_loaded(tmp_path):
    path = tmp_path / "forged.db"
    too_big = VALID.replace("stages 4", "stages 8").replace("64 x 128 x 64", "256 x 256 x 64")  # over the smem limit
    assert not is_valid(program_of(too_big), H200)
    with KernelDB(path) as db:
        db.add(Measurement(Shape(64, 256, 256), program_of(too_big), "ok", time_us=1.0, baseline_us=10.0), H200, "tune", {"nvcc": "x"})
    loads = []

    class NeverLoad:
        def load(self, program, gpu):
            loads.append(program)

        def capturing(self):
            return False

    d = Dispatcher(path, H200, launcher=NeverLoad(), fallback=lambda a, b, out=None: "fallback", toolchain={"nvcc": "x"})
    assert d.plan(64, 256, 256) is not None
    assert d._prepare(64, 256, 256, None) is not None and loads == []
    assert d.served_by(64, 256, 256) == "fallback"


def test_build_from_a_forged_database_lowers_only_checked_programs(tmp_path, capsys, monkeypatch):
    path = tmp_path / "forged.db"
    _hostile_db(path)
    built = []
    monkeypatch.setattr("l2gen.build.build_many", lambda sources, **kw: built.extend(sources) or [])
    with pytest.warns(UserWarning):
        main(["build", "--db", str(path)])
    for source in built:
        assert is_valid(source.program, H200)
        for marker in ("passwd", "system(", "rm -rf", "evil"):
            assert marker not in source.code


# -- route 2: an import ---------------------------------------------------------------------


def _export(texts) -> dict:
    rows = [{"id": i + 1, "gpu": "h200", "arch": "sm80", "m": 64, "n": 256, "k": 256 + 8 * i, "program_text": t, "program_key": "k",
             "status": "ok", "time_us": 1.0, "baseline_us": 2.0, "relerr": 0.0, "error": None, "policy": "x",
             "created_at": "2026-01-01", "env": {}, "l2": "clean"} for i, t in enumerate(texts)]
    return {"format": "l2gen-kernel-db", "schema_version": 2, "gpu": "h200", "l2": "clean", "measurements": rows}


@pytest.mark.parametrize("text", REFUSED)
def test_import_route_refuses_hostile_program_text_and_stores_nothing(tmp_path, capsys, text):
    export = tmp_path / "e.json"
    export.write_text(json.dumps(_export([VALID, text])))
    db = tmp_path / "k.db"
    assert main(["db", "import", str(export), "--db", str(db)]) == 1
    assert "is not an l2gen program" in capsys.readouterr().err
    with KernelDB(db) as kdb:
        assert kdb.count() == 0  # not even the valid row before it


@pytest.mark.parametrize("text", REFUSED)
def test_import_bench_route_refuses_hostile_program_text_and_stores_nothing(tmp_path, capsys, text):
    results = tmp_path / "r.json"
    rows = [{"m": 64, "n": 256, "k": 256, "program": "p", "program_text": t, "status": "ok", "l2gen_us": 1.0, "cublas_best_us": 2.0}
            for t in (VALID, text)]
    results.write_text(json.dumps({"gpu": "h200", "mode": "events", "l2": "clean", "rows": rows}))
    db = tmp_path / "k.db"
    assert main(["db", "import-bench", str(results), "--db", str(db)]) == 1
    assert "E-DB" in capsys.readouterr().err
    with KernelDB(db) as kdb:
        assert kdb.count() == 0


@pytest.mark.parametrize("text", COMMENTED)
def test_import_route_stores_the_canonical_text_not_the_text_as_it_came(tmp_path, text):
    export = tmp_path / "e.json"
    export.write_text(json.dumps(_export([text])))
    with KernelDB(tmp_path / "k.db") as db:
        assert db.import_json(export) == 1
        stored = db._query("SELECT program_text, program_key FROM measurements")
    assert stored and all(marker not in stored[0][0] for marker in MARKERS)
    assert stored[0][1] != "k"  # the key is re-derived from the parse


# -- route 3: an LLM ------------------------------------------------------------------------


@pytest.mark.parametrize("text", REFUSED)
def test_llm_route_refuses_hostile_answers_or_keeps_only_their_kernel(text):
    """An answer is prose around one program: what is outside the kernel's braces is
    dropped (a valid kernel followed by C++ is that kernel); anything else is refused."""
    program, diags = read_answer(text, H200)
    if diags:
        assert program is None or not is_valid(program, H200)
    else:
        assert text.startswith(VALID) and is_valid(program, H200)
        assert_clean(program)


@pytest.mark.parametrize("text", COMMENTED)
def test_llm_route_lowers_only_the_decisions_of_an_answer(text):
    program, diags = read_answer("Here is my kernel:\n```\n" + text + "\n```\n", H200)
    assert not diags and is_valid(program, H200)
    assert_clean(program)


def test_llm_route_through_the_policy_and_the_loop(tmp_path):
    """Hostile answers from a (fake) server become rejected proposals; the evaluator
    never lowers them, and the valid one it lowers is clean."""
    from l2gen.search.evaluate import DeviceEvaluator
    from l2gen.search.llm import LLMPolicy
    from l2gen.search.loop import tune
    from tests.unit.test_llm import FakeOpenAI, answer, make

    server = FakeOpenAI()
    try:
        server.add(*(answer(t) for t in REFUSED[:3] + REFUSED[4:5] + COMMENTED[:1]))
        policy: LLMPolicy = make(server, repair=False)
        lowered = []

        def lower_spy(program, gpu):
            lowered.append(program)
            return lower(program, gpu)

        def run(shape, candidates):
            return [{"status": "ok", "time_us": 9.0, "baseline_us": 10.0, "relerr": 1e-4} for _ in candidates]

        class NoBuild:
            def __call__(self, sources, **kw):
                from l2gen.build import BuildResult

                return [BuildResult(s, tmp_path / "lib.so", None, "", "", 0.0) for s in sources]

        evaluator = DeviceEvaluator(H200, run, build_many=NoBuild(), lower=lower_spy, env={}, l2="clean")
        with KernelDB(tmp_path / "k.db") as db:
            tune([Shape(128, 4096, 4096)], policy, evaluator, db, budget=5, batch=5, gpu=H200, progress=False)
            statuses = sorted(m.status for m in db.history(H200, Shape(128, 4096, 4096)))
        assert statuses.count("rejected") == 4
        assert lowered and all(is_valid(p, H200) for p in lowered)
        for p in lowered:
            assert_clean(p)
    finally:
        server.close()
