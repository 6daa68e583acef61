"""The build stage without a compiler: a fake nvcc script stands in for the real one."""

from __future__ import annotations

import json
import os
import stat
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from l2gen import build as build_mod
from l2gen import toolchain
from l2gen.build import (
    BuildResult,
    build,
    build_bundle,
    build_many,
    bundle_code,
    cache_dir,
    cache_key,
    pack,
    split_includes,
)
from l2gen.ir import BLayout, Family, Program, Sm80Config, Tile
from l2gen.lower import BASE_FLAGS, KernelSource
from l2gen.toolchain import ToolchainError, detect_toolchain

# Stands in for nvcc: reports a version, logs each compile, and acts on markers in the
# source: FAKE_FAIL fails like a compile error, FAKE_HANG hangs (with a child process),
# FAKE_SLOW takes half a second, FAKE_KILLED is killed (SIGKILL) half way through. The library it writes is a copy of the source.
FAKE_NVCC = """#!{python}
import os, subprocess, sys, time
args = sys.argv[1:]
if "--version" in args:
    print("nvcc: NVIDIA (R) Cuda compiler driver")
    print("Cuda compilation tools, release {release}, V{version}")
    sys.exit(0)
with open(os.environ["FAKE_NVCC_LOG"], "a") as log:
    log.write(" ".join(args) + "\\n")
cu, out = args[args.index("-o") - 1], args[args.index("-o") + 1]
code = open(cu).read()
if "FAKE_HANG" in code:
    child = subprocess.Popen(["sleep", "60"])
    open(os.environ["FAKE_NVCC_CHILD"], "w").write(str(child.pid))
    time.sleep(60)
if "FAKE_SLOW" in code:
    time.sleep(0.5)
if "FAKE_KILLED" in code:  # killed mid-build, as by the OOM killer, with half a library written
    open(out, "w").write(code[: len(code) // 2])
    os.kill(os.getpid(), 9)
if "FAKE_FAIL" in code:
    print("kernel.cu(3): warning: something harmless")
    print('kernel.cu(7): error: identifier "FAKE_FAIL" is undefined', file=sys.stderr)
    print('1 error detected in the compilation of "kernel.cu".', file=sys.stderr)
    sys.exit(2)
open(out, "w").write(code)
"""

SM80 = "-gencode=arch=compute_80,code=sm_80"


def write_fake_nvcc(directory: Path, version: str = "13.0.88") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "nvcc"
    release = ".".join(version.split(".")[:2])
    path.write_text(FAKE_NVCC.format(python=sys.executable, release=release, version=version))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def write_fake_cutlass(root: Path, version: tuple[int, int, int] = (4, 2, 0)) -> Path:
    (root / "include" / "cute").mkdir(parents=True, exist_ok=True)
    (root / "include" / "cutlass").mkdir(parents=True, exist_ok=True)
    (root / "tools" / "util" / "include").mkdir(parents=True, exist_ok=True)
    major, minor, patch = version
    (root / "include" / "cutlass" / "version.h").write_text(
        f"#define CUTLASS_MAJOR {major}\n#define CUTLASS_MINOR {minor}\n"
        f"#define CUTLASS_PATCH {patch}\n"
    )
    return root


PROGRAM = Program(
    name="t", family=Family.SM80, b_layout=BLayout.KN, config=Sm80Config(tile=Tile(128, 128, 32))
)


def source(body: str = "", entry: str = "l2gen_test_a", gencode: str = SM80) -> KernelSource:
    code = f'#include <cuda_runtime.h>\n\nextern "C" int {entry}(int x) {{ return x; }}\n{body}\n'
    return KernelSource(program=PROGRAM, gpu="a100", entry=entry, code=code, gencode=gencode)


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A fake nvcc and CUTLASS, a private cache; returns the file the fake logs calls to."""
    monkeypatch.setenv("L2GEN_NVCC", str(write_fake_nvcc(tmp_path / "bin")))
    monkeypatch.setenv("L2GEN_CUTLASS_DIR", str(write_fake_cutlass(tmp_path / "cutlass")))
    monkeypatch.setenv("L2GEN_CACHE_DIR", str(tmp_path / "cache"))
    log = tmp_path / "calls.log"
    log.touch()
    monkeypatch.setenv("FAKE_NVCC_LOG", str(log))
    return log


def calls(log: Path) -> int:
    return len(log.read_text().splitlines())


def leftovers() -> list[Path]:
    tmp = cache_dir() / "tmp"
    return list(tmp.iterdir()) if tmp.exists() else []


# ---- toolchain ---------------------------------------------------------------------------


def test_no_nvcc_anywhere_says_how_to_get_one(bare):
    with pytest.raises(ToolchainError) as info:
        toolchain.find_nvcc()
    message = str(info.value)
    assert "CUDA_HOME" in message and "pip install 'l2gen[nvcc]'" in message
    assert "L2GEN_NVCC" in message and len(message.splitlines()) > 3


def test_nvcc_from_cuda_home(bare, monkeypatch):
    nvcc = write_fake_nvcc(bare / "cuda" / "bin")
    monkeypatch.setenv("CUDA_HOME", str(bare / "cuda"))
    assert toolchain.find_nvcc() == nvcc


def test_nvcc_from_the_pip_wheel(bare, monkeypatch):
    nvcc = write_fake_nvcc(bare / "site" / "nvidia" / "cu13" / "bin")
    monkeypatch.setattr(toolchain, "_wheel_dirs", lambda: [bare / "site" / "nvidia"])
    assert toolchain.find_nvcc() == nvcc


def test_l2gen_nvcc_wins_and_must_exist(bare, monkeypatch):
    nvcc = write_fake_nvcc(bare / "mine")
    monkeypatch.setenv("CUDA_HOME", str(write_fake_nvcc(bare / "cuda" / "bin").parent.parent))
    monkeypatch.setenv("L2GEN_NVCC", str(nvcc))
    assert toolchain.find_nvcc() == nvcc
    monkeypatch.setenv("L2GEN_NVCC", str(bare / "nowhere" / "nvcc"))
    with pytest.raises(ToolchainError, match="L2GEN_NVCC"):
        toolchain.find_nvcc()


def test_nvcc_version(tmp_path):
    assert toolchain.nvcc_version(write_fake_nvcc(tmp_path / "a", "12.4.131")) == "12.4.131"
    broken = tmp_path / "broken"
    broken.write_text("#!/bin/sh\necho hello\n")
    broken.chmod(0o755)
    with pytest.raises(ToolchainError, match="did not report a release"):
        toolchain.nvcc_version(broken)


def test_cutlass_from_a_checkout(tmp_path, monkeypatch):
    root = write_fake_cutlass(tmp_path / "cutlass", (4, 3, 1))
    monkeypatch.setenv("L2GEN_CUTLASS_DIR", str(root))
    include, util = toolchain.cutlass_include_dirs()
    assert (include, util) == (root / "include", root / "tools" / "util" / "include")
    assert toolchain.cutlass_version() == "4.3.1"
    monkeypatch.setenv("L2GEN_CUTLASS_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(ToolchainError, match="pip install nvidia-cutlass"):
        toolchain.cutlass_include_dirs()


def test_cutlass_from_the_wheel(monkeypatch):
    pytest.importorskip("cutlass_library")
    monkeypatch.delenv("L2GEN_CUTLASS_DIR", raising=False)
    include, util = toolchain.cutlass_include_dirs()
    assert (include / "cute" / "tensor.hpp").is_file() and util.is_dir()
    assert toolchain.cutlass_version().count(".") == 2


def test_cublas_from_the_wheel(bare, monkeypatch):
    assert toolchain.cublas_dirs() is None
    wheel = bare / "site" / "nvidia"
    (wheel / "cu13" / "include").mkdir(parents=True)
    (wheel / "cu13" / "include" / "cublas_v2.h").touch()
    (wheel / "cu13" / "lib").mkdir()
    (wheel / "cu13" / "lib" / "libcublas.so.13").touch()
    monkeypatch.setattr(toolchain, "_wheel_dirs", lambda: [wheel])
    assert toolchain.cublas_dirs() == (wheel / "cu13" / "include", wheel / "cu13" / "lib")


# ---- cache key ---------------------------------------------------------------------------


def test_cache_key_covers_source_flags_and_toolchain(env, tmp_path, monkeypatch):
    tc = detect_toolchain()
    a = source()
    keys = {
        cache_key(a, tc),
        cache_key(source("int y;"), tc),
        cache_key(source(gencode="-gencode=arch=compute_90a,code=sm_90a"), tc),
        cache_key(KernelSource(**{**a.__dict__, "flags": a.flags + ("-lineinfo",)}), tc),
    }
    monkeypatch.setenv("L2GEN_NVCC", str(write_fake_nvcc(tmp_path / "other", "13.1.10")))
    keys.add(cache_key(a, detect_toolchain()))
    monkeypatch.setenv("L2GEN_CUTLASS_DIR", str(write_fake_cutlass(tmp_path / "c2", (4, 3, 0))))
    keys.add(cache_key(a, detect_toolchain()))
    monkeypatch.setattr(build_mod, "BUILD_VERSION", "test")
    keys.add(cache_key(a, detect_toolchain()))
    assert len(keys) == 7
    assert cache_key(a, tc) == cache_key(source(), tc)


def test_cache_dir_from_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("L2GEN_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "l2gen"
    monkeypatch.setenv("L2GEN_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"


# ---- build -------------------------------------------------------------------------------


def test_build_then_cache_hit(env):
    src = source()
    first = build(src)
    assert first.ok and not first.cached and first.error is None
    assert first.library.read_text() == src.code
    entry = first.library.parent
    key = cache_key(src, detect_toolchain())
    assert entry == cache_dir() / key[:2] / key
    assert sorted(p.name for p in entry.iterdir()) == ["build.json", "kernel.cu", "lib.so"]
    meta = json.loads((entry / "build.json").read_text())
    assert meta["entries"] == [src.entry] and meta["nvcc_version"] == "13.0.88"
    assert {"command", "seconds", "date", "cutlass_version"} <= meta.keys()
    assert first.command.startswith(f"cd {entry} && ")
    assert first.command.endswith(f"{SM80} -I{toolchain.cutlass_include_dirs()[0]} "
                                  f"-I{toolchain.cutlass_include_dirs()[1]} kernel.cu -o lib.so")
    second = build(src)
    assert second.ok and second.cached and second.library == first.library
    assert second.command == first.command
    assert calls(env) == 1 and leftovers() == []


def test_failure_is_short_cached_and_force_retries(env):
    src = source("FAKE_FAIL")
    first = build(src)
    assert not first.ok and first.library is None and not first.cached
    assert first.error == 'kernel.cu(7): error: identifier "FAKE_FAIL" is undefined'
    assert "warning: something harmless" in first.log
    entry = Path(first.command.split()[1])
    assert sorted(p.name for p in entry.iterdir()) == ["error.log", "failed.json", "kernel.cu"]
    second = build(src)
    assert not second.ok and second.cached and second.error == first.error
    assert calls(env) == 1
    third = build(src, force=True)
    assert not third.ok and not third.cached and calls(env) == 2
    assert leftovers() == []


def test_force_replaces_an_entry(env):
    first = build(source())
    (first.library.parent / "marker").touch()
    again = build(source(), force=True)
    assert again.ok and not again.cached and again.library == first.library
    assert not (first.library.parent / "marker").exists() and leftovers() == []


def test_partial_entry_is_a_miss_and_is_replaced(env):
    src = source()
    key = cache_key(src, detect_toolchain())
    entry = cache_dir() / key[:2] / key
    entry.mkdir(parents=True)
    (entry / "kernel.cu").write_text("half written")
    result = build(src)
    assert result.ok and not result.cached and calls(env) == 1
    assert (entry / "kernel.cu").read_text() == src.code


def test_concurrent_builders_of_one_key(env):
    src = source("FAKE_SLOW")
    results: list[BuildResult] = []
    threads = [threading.Thread(target=lambda: results.append(build(src))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 3 and all(r.ok for r in results)
    assert len({r.library for r in results}) == 1
    assert results[0].library.read_text() == src.code
    entry = results[0].library.parent
    assert sorted(p.name for p in entry.iterdir()) == ["build.json", "kernel.cu", "lib.so"]
    assert leftovers() == []


def test_timeout_kills_nvcc_and_its_children(env, tmp_path, monkeypatch):
    child_file = tmp_path / "child.pid"
    monkeypatch.setenv("FAKE_NVCC_CHILD", str(child_file))
    start = time.monotonic()
    result = build(source("FAKE_HANG"), timeout=1)
    assert time.monotonic() - start < 20
    assert not result.ok and result.error == "nvcc timed out after 1 s"
    child = int(child_file.read_text())
    assert _dead(child)
    entry = Path(result.command.split()[1])
    assert (entry / "kernel.cu").is_file() and not (entry / "failed.json").exists()
    assert leftovers() == []


def _dead(pid: int, wait: float = 5.0) -> bool:
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            if state in ("Z", "X"):
                return True
        except (ProcessLookupError, FileNotFoundError):
            return True
        time.sleep(0.05)
    return False


def test_timeout_is_not_cached(env, monkeypatch, tmp_path):
    monkeypatch.setenv("FAKE_NVCC_CHILD", str(tmp_path / "child.pid"))
    src = source("FAKE_HANG")
    build(src, timeout=0.5)
    build(src, timeout=0.5)
    assert calls(env) == 2


def test_missing_nvcc_is_a_failed_result(env, monkeypatch, tmp_path):
    monkeypatch.setenv("L2GEN_NVCC", str(tmp_path / "nowhere" / "nvcc"))
    result = build(source())
    assert not result.ok and "L2GEN_NVCC" in result.error and result.library is None
    seen = []
    results = build_many([source(), source("int y;")], progress=lambda *a: seen.append(a))
    assert [r.ok for r in results] == [False, False] and len(seen) == 2


def test_unwritable_cache_is_a_failed_result(env, monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("L2GEN_CACHE_DIR", str(blocker / "cache"))
    result = build(source())
    assert not result.ok and "build cache" in result.error


def test_build_many_keeps_order_dedupes_and_reports_progress(env):
    a, b, c = source(), source("int b;"), source("FAKE_FAIL")
    build(b)  # already cached
    seen = []
    results = build_many([a, b, a, c], jobs=2, progress=lambda *args: seen.append(args))
    assert [r.source for r in results] == [a, b, a, c]
    assert [r.ok for r in results] == [True, True, True, False]
    assert results[0].library == results[2].library != results[1].library
    assert results[1].cached and not results[0].cached
    assert calls(env) == 3  # b once before, then a and c
    assert [(done, total) for done, total, _ in seen] == [(1, 3), (2, 3), (3, 3)]
    assert seen[0][2].source == b  # cache hits are reported first


def test_build_many_rejects_bad_jobs(env):
    with pytest.raises(ValueError):
        build_many([source()], jobs=0)


def test_nvcc_command_for_a_file(env, tmp_path):
    command = build_mod.nvcc_command(source(), tmp_path / "k.cu", tmp_path / "k.so")
    assert command.startswith(os.environ["L2GEN_NVCC"])
    assert command.endswith(f"{tmp_path / 'k.cu'} -o {tmp_path / 'k.so'}")


# ---- bundles -----------------------------------------------------------------------------


def test_split_includes_hoists_the_leading_includes():
    code = (
        "// banner\n#include <a>\n/* why */\n"
        "#if defined(__CUDA_ARCH__)\n#  include <dev>\n#else\n#include <host>\n#endif\n"
        '  #  include "b.h"\n'
        "#define X 1\n"
        'static const char* s = "{ #include <not> }";\n'
        "namespace { int f() { return 1; } }\n"
    )
    includes, rest = split_includes(code)
    assert includes == [
        "#include <a>",
        "#if defined(__CUDA_ARCH__)\n#  include <dev>\n#else\n#include <host>\n#endif",
        '#  include "b.h"',
    ]
    assert "#if" not in rest and "include" not in rest.replace("#include <not>", "")
    assert rest.startswith("// banner\n/* why */\n#define X 1\n") and rest.endswith("} }\n")


@pytest.mark.parametrize(
    "code",
    [
        # the sm90 template's old layout: bundling moved its includes above the #define
        "#ifndef CUTE_X\n#define CUTE_X\n#endif\n#include <cute/tensor.hpp>\n",
        "#define X 1\n#include <a>\n",
        "#pragma pack(1)\n#include <a>\n",
        "#include <a>\nint x;\n#include <b>\n",
        "void f() {\n#include <a>\n}\n",
        "#ifdef X\n#include <a>\nint y;\n#endif\n",
    ],
)
def test_split_includes_refuses_an_include_after_state(code):
    with pytest.raises(ValueError, match="#include lines must come first"):
        split_includes(code)


def test_split_includes_refuses_undef():
    with pytest.raises(ValueError, match="#undef"):
        split_includes("#include <a>\n#undef NDEBUG\n")


def test_bundle_code_namespaces_each_program():
    a, b = source(entry="l2gen_a"), source("static int helper;", entry="l2gen_b")
    code = bundle_code([a, b])
    lines = code.splitlines()
    assert lines[1] == "#include <cuda_runtime.h>" and code.count("#include") == 1
    assert "namespace l2gen_a_ns {" in code and "namespace l2gen_b_ns {" in code
    assert code.index("namespace l2gen_a_ns") < code.index('extern "C" int l2gen_a(')
    assert code.index("namespace l2gen_b_ns") < code.index("static int helper;")


def test_bundle_code_keeps_each_programs_macros_to_itself():
    a = source("#define TILE 128\n#define KEEP(x) x\nint a = TILE;", entry="l2gen_a")
    b = source("#define TILE 160\nint b = TILE;", entry="l2gen_b")
    code = bundle_code([a, b])
    undef = code.index("#undef TILE")
    assert code.index("int a = TILE;") < undef < code.index("#define TILE 160")
    assert "#undef KEEP" in code and code.count("#undef TILE") == 2


def test_bundle_builds_once_and_members_become_cache_hits(env):
    a, b = source(entry="l2gen_a"), source(entry="l2gen_b")
    seen = []
    results = build_bundle([a, b, a], progress=lambda *args: seen.append(args))
    assert [r.source for r in results] == [a, b, a] and all(r.ok for r in results)
    assert len({r.library for r in results}) == 1 and calls(env) == 1
    assert "namespace l2gen_b_ns" in results[0].library.read_text()
    assert [(d, t) for d, t, _ in seen] == [(1, 2), (2, 2)]
    alone = build(b)
    assert alone.ok and alone.cached and calls(env) == 1
    assert alone.library.resolve() == results[0].library.resolve()
    assert "namespace l2gen_a_ns" in alone.library.read_text()
    assert leftovers() == []


def test_member_whose_bundle_is_gone_is_rebuilt(env):
    a, b = source(entry="l2gen_a"), source(entry="l2gen_b")
    bundle = build_bundle([a, b])[0].library.parent
    for path in bundle.iterdir():
        path.unlink()
    bundle.rmdir()
    alone = build(b)
    assert alone.ok and not alone.cached and calls(env) == 2
    assert alone.library.read_text() == b.code and not alone.library.is_symlink()


def test_failed_bundle_falls_back_to_single_builds(env):
    good, bad = source(entry="l2gen_good"), source("FAKE_FAIL", entry="l2gen_bad")
    results = build_bundle([good, bad])
    assert [r.ok for r in results] == [True, False] and calls(env) == 3
    assert results[0].library.read_text() == good.code
    assert "FAKE_FAIL" in results[1].error


def test_failed_bundle_without_keep_going(env):
    good, bad = source(entry="l2gen_good"), source("FAKE_FAIL", entry="l2gen_bad")
    results = build_bundle([good, bad], keep_going=False)
    assert [r.ok for r in results] == [False, False] and calls(env) == 1
    assert results[0].error == results[1].error


def test_bundles_group_by_gencode_and_flags(env):
    sm90 = "-gencode=arch=compute_90a,code=sm_90a"
    srcs = [source(entry="l2gen_a"), source(entry="l2gen_b", gencode=sm90),
            source(entry="l2gen_c"), source(entry="l2gen_d", gencode=sm90)]
    results = build_bundle(srcs, jobs=1)
    assert calls(env) == 2
    assert results[0].library == results[2].library != results[1].library == results[3].library


def test_bundle_size_and_unbundleable_sources(env):
    nested = KernelSource(PROGRAM, "a100", "l2gen_n", "#define X\n#include <a>\n", SM80)
    srcs = [source(entry=f"l2gen_{i}") for i in range(4)] + [nested]
    results = build_bundle(srcs, max_size=2)
    assert calls(env) == 3 and all(r.ok for r in results)
    assert len({r.library for r in results}) == 3
    assert results[4].library.read_text() == nested.code


def test_bundles_group_by_flags(env):
    wide = ("-DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED",)
    srcs = [source(entry="l2gen_a"), replace(source(entry="l2gen_b"), flags=BASE_FLAGS + wide),
            source(entry="l2gen_c"), replace(source(entry="l2gen_d"), flags=BASE_FLAGS + wide)]
    results = build_bundle(srcs, jobs=1)
    assert calls(env) == 2
    assert results[0].library == results[2].library != results[1].library == results[3].library
    assert "-DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED" in results[1].command
    assert "-DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED" not in results[0].command


# ---- sources with host code: the device code built alone, then the host code -----------


def two_unit(entry: str, body: str = "") -> KernelSource:
    device = f'#include <cuda_fp16.h>\n\nextern "C" __global__ void {entry}_gemm() {{}}\n{body}\n'
    host = f'#include <cuda_runtime.h>\n#define L2GEN_OK 0\nextern "C" int {entry}(int x) {{ return x; }}\n'
    return replace(source(entry=entry), code=device, host_code=host)


def test_a_source_with_host_code_builds_in_two_steps(env):
    src = two_unit("l2gen_two")
    result = build(src)
    assert result.ok and calls(env) == 2
    entry = result.library.parent
    assert sorted(p.name for p in entry.iterdir()) == [
        "build.json", "host.cpp", "kernel.cu", "kernel.fatbin", "lib.so"]
    assert (entry / "kernel.fatbin").read_text() == src.code  # the fake copies its input
    assert result.library.read_text() == src.host_code
    device, host = log_lines(env)
    assert "-fatbin" in device.split() and device.endswith("kernel.cu -o kernel.fatbin")
    assert "-fatbin" not in host.split() and host.endswith("host.cpp -o lib.so")
    assert result.command.startswith(f"cd {entry} && ") and result.command.count(" && ") == 2
    assert build(src).cached and calls(env) == 2
    assert cache_key(src, detect_toolchain()) != cache_key(replace(src, host_code=""), detect_toolchain())


def test_a_failing_device_step_stops_the_build(env):
    result = build(two_unit("l2gen_bad", body="FAKE_FAIL"))
    assert not result.ok and calls(env) == 1 and "FAKE_FAIL" in result.error


def test_two_unit_sources_bundle_both_units(env):
    a, b, plain = two_unit("l2gen_a"), two_unit("l2gen_b"), source(entry="l2gen_c")
    results = build_bundle([a, b, plain], max_size=3)
    assert all(r.ok for r in results) and calls(env) == 3  # plain is built on its own
    assert results[0].library == results[1].library != results[2].library
    host = results[0].library.read_text()
    assert host.count("#include <cuda_runtime.h>") == 1
    assert 'int l2gen_a(int x)' in host and 'int l2gen_b(int x)' in host
    assert host.count("#undef L2GEN_OK") == 2
    device = (results[0].library.resolve().parent / "kernel.fatbin").read_text()
    assert "l2gen_a_gemm" in device and "l2gen_b_gemm" in device
    alone = build(b)
    assert alone.cached and (alone.library.parent / "host.cpp").read_text() == b.host_code


def test_nvcc_command_for_a_source_with_host_code(env, tmp_path):
    src = two_unit("l2gen_two")
    with pytest.raises(ValueError):
        build_mod.nvcc_command(src, tmp_path / "k.cu", tmp_path / "k.so")
    command = build_mod.nvcc_command(src, tmp_path / "k.cu", tmp_path / "k.so", tmp_path / "k.cpp")
    assert command.startswith(f"cd {tmp_path} && ")
    assert f"{tmp_path / 'k.cu'} -o kernel.fatbin && " in command
    assert command.endswith(f"{tmp_path / 'k.cpp'} -o {tmp_path / 'k.so'}")


def log_lines(log: Path) -> list[str]:
    return log.read_text().splitlines()


def test_sm90a_sources_include_only_the_hopper_pieces_of_the_mainloop_builder():
    """The umbrella collective_builder.hpp (every architecture's mainloops and builders) and
    the device-level adapter (CUTLASS 2.x device headers) only lengthen an sm90a build
    (what they cost: bench/results/README.md, "Compile time")."""
    from l2gen.lower import lower
    from l2gen.parse import parse
    from l2gen.targets import GPUS

    program = parse("kernel k {\n arch sm90a\n tile 128 x 128 x 64\n}\n")
    code = lower(program, GPUS["h200"]).code
    assert '#include "cutlass/gemm/collective/builders/sm90_gmma_builder.inl"' in code
    assert '#include "cutlass/gemm/collective/collective_builder.hpp"' not in code
    assert "gemm_universal_adapter.h" not in code and "GemmUniversalAdapter<" not in code


def test_pack_carries_builds_to_another_cache(env, tmp_path, monkeypatch):
    """A packed library unpacked into another machine's cache is a cache hit there: a lone
    build's entry, and a bundle member's with the bundle entry its library links to."""
    import tarfile

    a, b, c = source(entry="l2gen_a"), source(entry="l2gen_b"), source(entry="l2gen_c")
    build_bundle([a, b])
    member, lone = build(b), build(c)
    assert member.library.is_symlink() and calls(env) == 2
    out = tmp_path / "libs.tar.xz"
    assert pack([member.library, lone.library, lone.library], out) == 3  # b's, the bundle's, c's
    other = tmp_path / "other"
    other.mkdir()
    with tarfile.open(out) as tar:
        tar.extractall(other, filter="data")
    monkeypatch.setenv("L2GEN_CACHE_DIR", str(other))
    for s in (b, c):
        again = build(s)
        assert again.ok and again.cached and again.library.read_text() == (member if s is b else lone).library.read_text()
    assert calls(env) == 2
    with pytest.raises(ValueError, match="not a library of the build cache"):
        pack([tmp_path / "elsewhere" / "lib.so"], tmp_path / "x.tar.xz")
    assert not (tmp_path / "x.tar.xz").exists()


def test_l2gen_build_defines_macros_and_packs(env, tmp_path, capsys):
    """``l2gen build --define M=1 --pack FILE``: each program also built with -DM=1 (another
    library), every library in the archive; a bad macro is a usage error."""
    import tarfile

    from l2gen.cli import main

    path = tmp_path / "k.l2"
    path.write_text("kernel k {\n arch sm90a\n impl l2gen\n tile 128 x 64 x 64\n}\n")
    out = tmp_path / "packs" / "libs.tar.xz"
    assert main(["build", str(path), "--define", "L2GEN_X=1+L2GEN_Y", "--pack", str(out)]) == 0
    printed = capsys.readouterr()
    libraries = [line.rsplit(": ", 1)[1] for line in printed.out.splitlines()]
    assert len(set(libraries)) == 2 and " -DL2GEN_X=1 -DL2GEN_Y: " in printed.out
    assert "-DL2GEN_X=1" in Path(libraries[1]).parent.joinpath("build.json").read_text()
    assert "packed 2 cache entries" in printed.err
    with tarfile.open(out) as tar:
        names = {n.split("/")[1] for n in tar.getnames() if n.count("/") >= 1}
    assert names == {Path(lib).parent.name for lib in libraries}
    assert main(["build", str(path), "--define", "2X"]) == 2
    assert "not MACRO[=VALUE]" in capsys.readouterr().err
