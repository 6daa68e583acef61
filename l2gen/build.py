"""Build: KernelSources to shared libraries with nvcc, through a content-addressed cache.

Failures are data: every function here returns a :class:`BuildResult` per source, whose
``ok`` is False when nvcc failed, timed out or could not be found; none raises for that.

The cache lives in ``$L2GEN_CACHE_DIR``, else ``$XDG_CACHE_HOME/l2gen``, else
``~/.cache/l2gen``; one entry per library::

    <root>/<key[:2]>/<key>/kernel.cu     the CUDA translation unit, kept to reproduce the build
                           host.cpp      the host translation unit  (two-unit sources)
                           kernel.fatbin kernel.cu's device code    (two-unit sources)
                           lib.so        the library              (success)
                           build.json    command, seconds, versions, entries, date
                           error.log     nvcc's whole output      (failure)
                           failed.json   as build.json, plus the error
    <root>/tmp/                          entries being built

A source with ``host_code`` (the sm80 family) is built in two nvcc runs: ``kernel.cu``
alone to ``kernel.fatbin`` (device code only: its host code never parses CuTe), then
``host.cpp``, which embeds that fatbin, to ``lib.so``.

The key covers the source's code, gencode and flags, the nvcc and CUTLASS versions and
:data:`BUILD_VERSION`. An entry is built in a fresh directory under ``tmp/`` and renamed
into place whole, so a reader sees a complete entry or none, and concurrent builders of one
key cannot corrupt each other: the first rename wins and an equal later one is dropped.
Compile errors are cached like successes (``force=True`` retries); a timeout or an nvcc
killed by a signal leaves only ``kernel.cu`` and ``error.log``, which the next build replaces.

Bundles (:func:`build_bundle`) put several programs into one translation unit, to pay for
parsing the CUTLASS headers once. Each program's leading ``#include`` lines are hoisted to
the top of the bundle (deduplicated), the rest is wrapped in ``namespace <entry>_ns``
(``extern "C"`` names keep their C names inside it), and each macro the rest defines is
``#undef``'d after it, so that no program sees another's. A bundled program compiles to the
same machine code as the program alone, provided nothing that changes code generation sits
in the source before its ``#include`` lines: settings such as
``CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED`` are flags (``KernelSource.flags``, part of the
key; bundles group by flags). :func:`split_includes` enforces the layout it needs, and a
program it refuses is built on its own: every ``#include`` comes before any code or other
preprocessor line (``#if`` groups holding only ``#include`` lines are hoisted whole), none
``#undef``s a macro, and its code is valid inside a named namespace.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import tarfile
import tempfile
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from hashlib import sha256
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

from .lower import FATBIN
from .toolchain import Toolchain, ToolchainError, cutlass_include_dirs, detect_toolchain, find_nvcc

if TYPE_CHECKING:
    from .lower import KernelSource

CU, HOST, LIBRARY = "kernel.cu", "host.cpp", "lib.so"  # the files of a cache entry

# Bump when the build itself changes in a way that changes its output (command, layout).
# 2: bundles no longer move sm90 sources' includes above the extended-shapes #define; a
# library built by version 1 in a bundle may be another kernel than its program alone.
BUILD_VERSION = "2"

LOG_TAIL_CHARS = 20_000
ERROR_LINES = 3


@dataclass(frozen=True)
class BuildResult:
    """What building one KernelSource gave. ``library`` is None unless the build succeeded."""

    source: KernelSource
    library: Path | None
    error: str | None = None  # short: nvcc's first error lines
    log: str = ""  # the tail of nvcc's output (stdout and stderr)
    command: str = ""  # `cd DIR && nvcc ...`: reproduces the build from the kept kernel.cu
    seconds: float = 0.0  # nvcc's wall time (of the whole bundle, for a bundle member)
    cached: bool = False

    @property
    def ok(self) -> bool:
        return self.library is not None and self.error is None


Progress = Callable[[int, int, BuildResult], None]


def cache_dir() -> Path:
    """The root of the build cache (read from the environment on every call)."""
    if os.environ.get("L2GEN_CACHE_DIR"):
        return Path(os.environ["L2GEN_CACHE_DIR"]).expanduser().absolute()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base.absolute() / "l2gen"


def cache_key(source: KernelSource, toolchain: Toolchain) -> str:
    """The cache key of a source: its code and flags, the toolchain and the build version."""
    return _key(source.key, toolchain)


def cache_entry(source: KernelSource) -> Path | None:
    """The cache folder holding ``source``'s built library (for the toolchain found now),
    or None if it has not been built. Its ``lib.so`` may link to a bundle's entry."""
    try:
        toolchain = detect_toolchain()
    except ToolchainError:
        return None
    entry = _entry_dir(_key(source.key, toolchain))
    return entry if _rank(entry) == 2 else None


def _key(source_key: str, toolchain: Toolchain) -> str:
    h = sha256()
    for part in (source_key, toolchain.nvcc_version, toolchain.cutlass_version, BUILD_VERSION):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def nvcc_command(
    source: KernelSource, cu: Path | str, library: Path | str, host: Path | str | None = None
) -> str:
    """The shell command that compiles ``cu`` (the source's code) to ``library``.

    A source with host code needs ``host``, the file holding it: the command then runs in
    ``library``'s folder, where the device code's fatbin is written for the host code to
    embed. Names plain ``nvcc`` if none is found, so a command can be written out anywhere.
    """
    try:
        nvcc = str(find_nvcc())
    except ToolchainError:
        nvcc = "nvcc"
    if source.host_code and host is None:
        raise ValueError("a source with host code needs the path of its host file")
    commands = _nvcc_commands(nvcc, cutlass_include_dirs(), source, cu, library, host or HOST)
    joined = " && ".join(shlex.join(c) for c in commands)
    if source.host_code:
        return f"cd {shlex.quote(str(Path(library).parent))} && {joined}"
    return joined


def _nvcc_commands(nvcc, include_dirs, source, cu=CU, library=LIBRARY, host=HOST) -> list[list[str]]:
    """The nvcc runs that build a source: one, or two for a source with host code."""
    includes = [f"-I{d}" for d in include_dirs]
    if not source.host_code:
        return [[str(nvcc), *source.flags, source.gencode, *includes, str(cu), "-o", str(library)]]
    return [
        [str(nvcc), "-fatbin", *source.flags, source.gencode, *includes, str(cu), "-o", FATBIN],
        [str(nvcc), *source.flags, source.gencode, str(host), "-o", str(library)],
    ]


def build(source: KernelSource, *, timeout: float = 600, force: bool = False) -> BuildResult:
    """Build one source (or fetch it from the cache). ``timeout`` is in seconds."""
    return build_many([source], jobs=1, timeout=timeout, force=force)[0]


def build_many(
    sources: Iterable[KernelSource],
    *,
    jobs: int | None = None,
    timeout: float = 600,
    force: bool = False,
    progress: Progress | None = None,
) -> list[BuildResult]:
    """Build sources in parallel, one translation unit each; results in input order.

    Identical sources (same key) build once. ``jobs`` nvcc processes run at a time
    (default: the number of CPUs). ``progress(done, total, result)`` is called from the
    calling thread as each distinct source finishes (cache hits first).
    """
    return _build_all(list(sources), 1, jobs, timeout, force, True, progress)


def build_bundle(
    sources: Iterable[KernelSource],
    *,
    max_size: int | None = None,
    jobs: int | None = None,
    timeout: float = 600,
    force: bool = False,
    keep_going: bool = True,
    progress: Progress | None = None,
) -> list[BuildResult]:
    """Build sources several to a translation unit; results in input order.

    Sources already in the cache are not rebuilt. The rest are grouped by gencode and
    flags, and each group is cut into bundles of at most ``max_size`` programs (default:
    enough bundles to keep ``jobs`` nvcc processes busy, at least two programs in each).
    A bundle's members share its library. If a bundle fails and ``keep_going`` is set, its
    members are built one by one so that each error lands on the program that caused it;
    otherwise they all get the bundle's error. ``timeout`` is per program: a bundle of n
    gets n times as long. Each member of a built bundle also gets a cache entry of its own
    (its library a link to the bundle's), so a later :func:`build` of it is a cache hit.
    """
    return _build_all(list(sources), max_size, jobs, timeout, force, keep_going, progress)


# ---- translation units ------------------------------------------------------------------


@dataclass(frozen=True)
class _Unit:
    """One library to build: its translation unit(s) and the sources it serves."""

    sources: tuple[KernelSource, ...]
    code: str
    host_code: str = ""

    @classmethod
    def of(cls, sources: Sequence[KernelSource]) -> "_Unit":
        if len(sources) == 1:
            return cls(tuple(sources), sources[0].code, sources[0].host_code)
        host = _bundle([s.host_code for s in sources], sources) if sources[0].host_code else ""
        return cls(tuple(sources), bundle_code(sources), host)

    @property
    def source(self) -> KernelSource:
        """A KernelSource with this unit's code (the gencode and flags of its sources)."""
        return replace(self.sources[0], code=self.code, host_code=self.host_code)


# One token of C++ that matters for finding the leading #include lines: a preprocessor
# line (with continuations), a comment, a string or character literal, or a brace.
_TOKEN = re.compile(
    r"(?P<pp>^[ \t]*#(?:[^\n\\]|\\.)*)"
    r"|(?P<comment>//[^\n]*|/\*.*?\*/)"
    r"|\"(?:[^\"\\\n]|\\.)*\"|'(?:[^'\\\n]|\\.)*'"
    r"|[{}]",
    re.MULTILINE | re.DOTALL,
)
_DIRECTIVE = re.compile(r"[ \t]*#[ \t]*(\w*)[ \t]*(\w*)")
_OPENS, _BRANCHES = {"if", "ifdef", "ifndef"}, {"elif", "else", "elifdef", "elifndef"}


def split_includes(code: str) -> tuple[list[str], str]:
    """Split a translation unit into its leading ``#include`` lines and the rest.

    The leading block is everything before the first code or other preprocessor line:
    comments, ``#include`` lines and ``#if`` groups that hold only those (returned whole, as
    one entry). Raises ValueError where hoisting the includes to the top of a bundle could
    change what the program compiles to: an ``#include`` after the leading block (after
    code, or after a ``#define`` or other preprocessor state that its header could read),
    or an ``#undef``, which would reach the programs after it in a bundle.
    """
    tokens = list(_TOKEN.finditer(code))
    heads: list[str] = []
    cuts: list[tuple[int, int]] = []  # spans of the hoisted lines, cut from the rest
    depth = group = pos = 0  # #if nesting in the leading block; where its open group began
    rest, stop = len(tokens), None  # first token after the leading block, and what ended it
    for i, token in enumerate(tokens):
        if code[pos : token.start()].strip():  # code between tokens
            rest, stop = i, code[pos : token.start()].strip().splitlines()[0]
            break
        pos = token.end()
        if token["comment"]:
            continue
        if token["pp"] is None:  # a string or a brace
            rest, stop = i, token.group()
            break
        name = _DIRECTIVE.match(token["pp"]).group(1)
        if name in _OPENS:
            if depth == 0:
                group = i
            depth += 1
        elif name in _BRANCHES and depth:
            pass
        elif name == "endif" and depth:
            depth -= 1
            if depth == 0:
                start = tokens[group].start()
                heads.append("\n".join(ln.strip() for ln in code[start : token.end()].splitlines()))
                cuts.append((start, token.end() + 1))  # and its newline
        elif name == "include":
            if depth == 0:  # (one inside a group goes with the group)
                heads.append(token["pp"].strip())
                cuts.append((token.start(), token.end() + 1))
        else:
            rest, stop = i, token["pp"].strip()
            break
    if depth:  # a group that holds more than includes stays in the rest, whole
        rest = min(rest, group)
    for token in tokens[rest:]:
        name = _DIRECTIVE.match(token["pp"]).group(1) if token["pp"] else ""
        if name == "include":
            raise ValueError(f"{token['pp'].strip()} comes after {stop!r}: #include lines must come first")
        if name == "undef":
            raise ValueError(f"{token['pp'].strip()}: a bundle cannot keep it from the programs after it")
    body, start = [], 0
    for a, b in cuts:
        body.append(code[start:a])
        start = b
    body.append(code[start:])
    return heads, "".join(body)


def _defined_macros(code: str) -> list[str]:
    """The names of the macros ``code`` #defines, in order."""
    names: dict[str, None] = {}
    for token in _TOKEN.finditer(code):
        if token["pp"]:
            name, macro = _DIRECTIVE.match(token["pp"]).groups()
            if name == "define" and macro:
                names[macro] = None
    return list(names)


def bundle_code(sources: Sequence[KernelSource]) -> str:
    """One translation unit holding every source's code: the hoisted includes, then one
    namespace per program. Raises ValueError if a source cannot be bundled
    (:func:`split_includes`)."""
    return _bundle([s.code for s in sources], sources)


def _bundle(codes: Sequence[str], sources: Sequence[KernelSource]) -> str:
    includes: dict[str, None] = {}
    bodies = []
    for code, source in zip(codes, sources):
        head, body = split_includes(code)
        includes.update(dict.fromkeys(head))
        ns = f"{source.entry}_ns"
        undef = "".join(f"#undef {name}\n" for name in _defined_macros(body))
        bodies.append(f"namespace {ns} {{\n{body.rstrip()}\n}}  // namespace {ns}\n{undef}")
    banner = "// l2gen bundle: " + " ".join(s.entry for s in sources)
    return "\n".join([banner, *includes, "", *bodies])


def _plan(sources: list[KernelSource], max_size: int | None, jobs: int) -> list[_Unit]:
    """Cut sources into units: singles, or bundles of one gencode, flags and layout."""
    if max_size == 1:
        return [_Unit.of([s]) for s in sources]
    units, groups = [], {}
    for source in sources:
        try:
            for code in (source.code, source.host_code) if source.host_code else (source.code,):
                split_includes(code)
        except ValueError:
            units.append(_Unit.of([source]))
            continue
        groups.setdefault((source.gencode, source.flags, bool(source.host_code)), []).append(source)
    for members in groups.values():
        size = max_size or max(2, math.ceil(len(members) / jobs))
        units += [_Unit.of(members[i : i + size]) for i in range(0, len(members), size)]
    return units


# ---- the build loop -----------------------------------------------------------------------


def _build_all(sources, max_size, jobs, timeout, force, keep_going, progress):
    jobs = (os.cpu_count() or 1) if jobs is None else jobs
    if jobs < 1 or (max_size is not None and max_size < 1):
        raise ValueError("jobs and max_size must be at least 1")
    distinct: dict[str, KernelSource] = {}
    for source in sources:
        distinct.setdefault(source.key, source)
    done: dict[str, BuildResult] = {}

    def finish(result: BuildResult, source: KernelSource) -> None:
        done[source.key] = replace(result, source=source)
        if progress:
            progress(len(done), len(distinct), done[source.key])

    try:
        toolchain = detect_toolchain()
    except ToolchainError as e:
        for source in distinct.values():
            finish(_failure(source, str(e)), source)
        return [replace(done[s.key], source=s) for s in sources]

    todo = []
    for source in distinct.values():
        hit = None if force else _load(_entry_dir(_key(source.key, toolchain)), source)
        if hit:
            finish(hit, source)
        else:
            todo.append(source)

    live: set[subprocess.Popen] = set()  # this call's nvcc processes, to kill on Ctrl-C
    with ThreadPoolExecutor(max_workers=jobs) as pool:

        def submit(unit: _Unit):
            seconds = timeout * len(unit.sources)
            return pool.submit(_compile, unit, toolchain, seconds, force, live)

        running = {submit(unit): unit for unit in _plan(todo, max_size, jobs)}
        try:
            while running:
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    unit = running.pop(future)
                    result = future.result()
                    if result.ok or len(unit.sources) == 1 or not keep_going:
                        for source in unit.sources:
                            finish(result, source)
                        if result.ok and len(unit.sources) > 1:
                            _alias_members(unit, result, toolchain, force)
                    else:  # build the members alone to learn which one fails
                        singles = [_Unit.of([s]) for s in unit.sources]
                        running.update({submit(u): u for u in singles})
        except BaseException:
            for future in running:
                future.cancel()
            for proc in list(live):
                _kill_group(proc)
            raise
    return [replace(done[s.key], source=s) for s in sources]


def _entry_dir(key: str) -> Path:
    return cache_dir() / key[:2] / key


_SLOTS: threading.BoundedSemaphore | None = None
_SLOTS_LOCK = threading.Lock()


def nvcc_slots() -> threading.BoundedSemaphore:
    """The process-wide cap on nvcc processes running at once: ``$L2GEN_MAX_NVCC``, else
    the number of CPUs. Builds started from several threads (``l2gen tune --parallel``)
    share it, so they queue instead of oversubscribing the machine; a build's timeout
    counts from when its nvcc starts."""
    global _SLOTS
    with _SLOTS_LOCK:
        if _SLOTS is None:
            raw = os.environ.get("L2GEN_MAX_NVCC", "")
            _SLOTS = threading.BoundedSemaphore(int(raw) if raw.isdigit() and int(raw) > 0 else (os.cpu_count() or 1))
        return _SLOTS


def _compile(
    unit: _Unit, toolchain: Toolchain, timeout: float, force: bool, live: set
) -> BuildResult:
    """Run nvcc on one unit and publish the entry; the result names the unit's first source."""
    source = unit.sources[0]
    final = _entry_dir(_key(unit.source.key, toolchain))
    commands = _nvcc_commands(toolchain.nvcc, toolchain.include_dirs, unit.source)
    command = " && ".join([f"cd {shlex.quote(str(final))}", *(shlex.join(c) for c in commands)])
    try:
        if not force:  # another builder may have finished it since the caller looked
            hit = _load(final, source)
            if hit:
                return hit
        (cache_dir() / "tmp").mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=final.name[:16] + ".", dir=cache_dir() / "tmp"))
    except OSError as e:
        return _failure(source, f"cannot use the build cache at {cache_dir()}: {e}", command)
    try:
        (work / CU).write_text(unit.code)
        if unit.host_code:
            (work / HOST).write_text(unit.host_code)
        with nvcc_slots():
            start = time.monotonic()
            status, output, timed_out = _run(commands, work, timeout, live)
            seconds = time.monotonic() - start
        meta = {
            "command": command,
            "seconds": round(seconds, 3),
            "nvcc": str(toolchain.nvcc),
            "nvcc_version": toolchain.nvcc_version,
            "cutlass_version": toolchain.cutlass_version,
            "entries": [s.entry for s in unit.sources],
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "log": output[-LOG_TAIL_CHARS:],
        }
        if status == 0 and (work / "lib.so").is_file():
            meta["sha256"] = _digest(work / "lib.so")  # checked on every load (_rank)
            (work / "build.json").write_text(json.dumps(meta, indent=1))
            if not _publish(work, final, force):
                return _load(final, source) or _failure(source, "lost the cache entry", command)
            return BuildResult(source, final / "lib.so", None, meta["log"], command, seconds)
        if timed_out:
            error = f"nvcc timed out after {timeout:g} s"
        elif status == 0:
            error = "nvcc succeeded but wrote no lib.so"
        else:
            error = _first_errors(output) or f"nvcc exited with status {status}"
        (work / "error.log").write_text(output)
        if not timed_out and status >= 0:  # deterministic: cache it
            (work / "failed.json").write_text(json.dumps({**meta, "error": error}, indent=1))
        (work / "lib.so").unlink(missing_ok=True)
        _publish(work, final, force)
        return BuildResult(source, None, error, meta["log"], command, seconds)
    except OSError as e:
        return _failure(source, f"build failed: {e}", command)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _failure(source: KernelSource, error: str, command: str = "") -> BuildResult:
    return BuildResult(source, None, error=error, log=error, command=command)


def _run(commands: list[list[str]], cwd: Path, timeout: float, live: set) -> tuple[int, str, bool]:
    """Run commands one after another, each in its own process group, until one fails;
    ``timeout`` covers them all, and on timeout the running group is killed whole."""
    deadline = time.monotonic() + timeout
    outputs: list[str] = []
    for args in commands:
        status, output, timed_out = _run_one(args, cwd, deadline - time.monotonic(), live)
        outputs.append(output)
        if status != 0 or timed_out:
            break
    return status, "".join(outputs), timed_out


def _run_one(args: list[str], cwd: Path, timeout: float, live: set) -> tuple[int, str, bool]:
    proc = subprocess.Popen(
        args,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    live.add(proc)
    timed_out = False
    try:
        out, _ = proc.communicate(timeout=max(timeout, 0.001))
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc)
        out, _ = proc.communicate()
    except BaseException:  # e.g. Ctrl-C: leave no nvcc behind
        _kill_group(proc)
        proc.wait()
        raise
    finally:
        live.discard(proc)
    return proc.returncode, out.decode(errors="replace"), timed_out


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


_ERROR = re.compile(r"\berror\b|\bfatal\b", re.IGNORECASE)
_ERROR_COUNT = re.compile(r"errors? detected in the compilation", re.IGNORECASE)


def _first_errors(output: str) -> str:
    lines = [ln.strip() for ln in output.splitlines()]
    errors = [ln for ln in lines if _ERROR.search(ln) and not _ERROR_COUNT.search(ln)]
    chosen = errors[:ERROR_LINES] or [ln for ln in lines if ln][-ERROR_LINES:]
    return "\n".join(ln if len(ln) <= 400 else ln[:400] + " ..." for ln in chosen)


# ---- cache entries ------------------------------------------------------------------------


def pack(libraries: Iterable[Path | str], out: Path | str) -> int:
    """Write the cache entries holding ``libraries`` into the tar.xz ``out``, named relative
    to the cache root, and return how many. A bundle member's library links to its bundle's
    entry, which goes in too. Unpacked into another machine's cache
    (``tar xJf OUT -C $L2GEN_CACHE_DIR``), those builds are cache hits there wherever the
    toolchain is the same (nvcc and CUTLASS versions are part of the key): build on a
    machine without a GPU, run on one. ``out`` is written whole or not at all. Raises
    ValueError for a library outside the cache."""
    root = cache_dir()
    entries: set[Path] = set()
    for library in libraries:
        library = Path(os.path.normpath(Path(library).absolute()))
        linked = library  # a bundle member's lib.so: a relative link to its bundle's
        if library.is_symlink():
            linked = Path(os.path.normpath(library.parent / os.readlink(library)))
        for entry in {library.parent, linked.parent}:
            if entry.parent.parent != root:  # <root>/<key[:2]>/<key>
                raise ValueError(f"{library} is not a library of the build cache {root}")
            entries.add(entry)
    out = Path(out)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.")
    os.close(fd)
    try:
        with tarfile.open(tmp, "w:xz") as tar:
            for entry in sorted(entries):
                tar.add(entry, arcname=str(entry.relative_to(root)))
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return len(entries)


def _rank(entry: Path) -> int:
    """2: a built library; 1: a cached failure; 0: nothing usable (absent, partial, or a
    library whose bytes are not those its build recorded: a corrupt entry is rebuilt,
    never loaded)."""
    if (entry / "failed.json").is_file():
        return 1
    if not ((entry / "lib.so").exists() and (entry / "build.json").is_file()):
        return 0
    try:
        recorded = json.loads((entry / "build.json").read_text()).get("sha256")
        return 2 if recorded and recorded == _digest(entry / "lib.so") else 0
    except (OSError, ValueError, AttributeError):
        return 0


def _digest(path: Path) -> str:
    """sha256 of a file's bytes (a built library's, recorded in its build.json)."""
    h = sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _load(entry: Path, source: KernelSource) -> BuildResult | None:
    """The cached result of an entry, or None if it holds no finished build."""
    rank = _rank(entry)
    if rank == 0:
        return None
    try:
        meta = json.loads((entry / ("build.json" if rank == 2 else "failed.json")).read_text())
        library = entry / "lib.so" if rank == 2 else None
        return BuildResult(
            source,
            library,
            error=meta.get("error"),
            log=meta.get("log", ""),
            command=meta["command"],
            seconds=meta["seconds"],
            cached=True,
        )
    except (OSError, ValueError, KeyError):
        return None


def _publish(work: Path, final: Path, force: bool) -> bool:
    """Rename a finished entry into place. An entry already there stays unless ours ranks
    higher or ``force`` is set. True if ours is now in place."""
    final.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(5):
        try:
            os.replace(work, final)
            return True
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        if not force and _rank(final) >= _rank(work):
            return False
        trash = Path(tempfile.mkdtemp(prefix="old.", dir=work.parent))
        try:
            os.replace(final, trash)
        except FileNotFoundError:
            pass
        shutil.rmtree(trash, ignore_errors=True)
        force = False  # whoever publishes from now on built it after us
    return False


def _alias_members(unit: _Unit, result: BuildResult, toolchain: Toolchain, force: bool) -> None:
    """Give each member of a built bundle an entry whose lib.so links to the bundle's."""
    meta = json.loads((result.library.parent / "build.json").read_text())
    meta["bundle"] = result.library.parent.name
    for source in unit.sources:
        final = _entry_dir(_key(source.key, toolchain))
        try:
            work = Path(tempfile.mkdtemp(prefix=final.name[:16] + ".", dir=cache_dir() / "tmp"))
            try:
                (work / CU).write_text(source.code)
                if source.host_code:
                    (work / HOST).write_text(source.host_code)
                (work / "build.json").write_text(json.dumps(meta, indent=1))
                final.parent.mkdir(parents=True, exist_ok=True)
                # tmp/<name> and <key[:2]>/<key> are equally deep: the link resolves in both.
                os.symlink(os.path.relpath(result.library, final), work / "lib.so")
                _publish(work, final, force)
            finally:
                shutil.rmtree(work, ignore_errors=True)
        except OSError:
            pass  # an alias only saves a later rebuild


# ---- helper libraries -----------------------------------------------------------------


class HelperBuildError(RuntimeError):
    """A helper library (the cuBLAS shim, the timing probes) could not be built; the
    message has the command and nvcc's output."""


def build_helper(what: str, folder: str, stem: str, source: Path, command: Callable[[str], list[str]],
                 *, version: str, timeout: float = 600, force: bool = False) -> Path:
    """Build a library from one hand-written ``.cu`` file (or find it in the cache) and
    return its path: ``<cache>/<folder>/<stem>-<hash>.so``, the hash over the source, the
    command (``command("OUT")``) and ``version``. ``command(out)`` is the nvcc command line
    that writes the library to ``out``; ``what`` names the library in errors.

    The library is written to a temporary name and renamed into place, so a reader sees
    the whole library or none. Raises :class:`HelperBuildError`."""
    h = sha256()
    for part in (source.read_text(), *command("OUT"), version):
        h.update(part.encode())
        h.update(b"\0")
    target = cache_dir() / folder
    library = target / f"{stem}-{h.hexdigest()[:16]}.so"
    if library.is_file() and not force:
        return library
    target.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{stem}-", suffix=".so", dir=target)
    os.close(fd)
    args = command(tmp)
    try:
        run = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        os.unlink(tmp)
        raise HelperBuildError(f"{shlex.join(args)}\n{e}") from None
    if run.returncode != 0:
        os.unlink(tmp)
        raise HelperBuildError(f"building {what} failed:\n{shlex.join(args)}\n{(run.stdout + run.stderr).strip()}")
    os.replace(tmp, library)
    return library
