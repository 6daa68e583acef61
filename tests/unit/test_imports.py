"""The package's import graph, read from the source with ``ast``: no cycles, and the
serving path does not import the tuner.

Every import statement counts, module-level and function-level alike (a function-level
import is a dependency too; it only runs later), and so do imports under
``TYPE_CHECKING``. An edge goes to the module named: ``from .x import y`` is an edge to
``l2gen.x``, or to ``l2gen.x.y`` where that is a module. The implicit import of a parent
package (``l2gen.search`` when ``l2gen.search.base`` is imported) is not an edge: the
package ``__init__`` files import nothing eagerly. Dynamic imports (``importlib``) are
not seen.
"""

from __future__ import annotations

import ast
from pathlib import Path

import l2gen

PACKAGE = Path(l2gen.__file__).resolve().parent
SERVING = ("l2gen.dispatch", "l2gen.db", "l2gen.runtime")


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ("l2gen", *path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The l2gen module that a dotted name is, or lies in; None outside the package."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    """Module -> the l2gen modules it imports (anywhere in its body)."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        package = name if is_package else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    base_name = ".".join(base + ([node.module] if node.module else []))
                else:
                    base_name = node.module or ""
                targets = [f"{base_name}.{alias.name}" if f"{base_name}.{alias.name}" in modules else base_name for alias in node.names]
            for target in targets:
                if not target.startswith("l2gen"):
                    continue
                resolved = _resolve(target, modules)
                if resolved is not None and resolved != name and resolved != "l2gen":
                    graph[name].add(resolved)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _reaches(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for w in graph[todo.pop()]:
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def test_the_graph_is_read():
    graph = import_graph()
    assert "l2gen.problem" in graph["l2gen.db"]
    assert "l2gen.lower" in graph["l2gen.dispatch"]  # a function-level import counts
    assert "l2gen.search.base" in graph["l2gen.search.loop"]  # a relative import inside a subpackage
    assert "l2gen.check" in graph["l2gen.space"]  # `from . import check as rules`


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_cycles_are_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_serving_path_does_not_import_the_search():
    graph = import_graph()
    for module in SERVING:
        direct = sorted(m for m in graph[module] if m == "l2gen.search" or m.startswith("l2gen.search."))
        assert direct == [], f"{module} imports {direct}"
        reached = sorted(m for m in _reaches(graph, module) if m == "l2gen.search" or m.startswith("l2gen.search."))
        assert reached == [], f"{module} reaches {reached} through its imports"


def test_import_l2gen_stays_light_and_works_without_torch():
    """``import l2gen`` and ``l2gen.matmul`` import no torch (the torch op and
    ``l2gen.patch`` do, on first use); without torch they still import, and the op's
    modules say what is missing."""
    import subprocess
    import sys

    light = "import sys, l2gen; l2gen.matmul; assert 'torch' not in sys.modules, 'torch imported'"
    without = ("import sys; sys.modules['torch'] = None; import l2gen; l2gen.matmul\n"
               "for name in ('patch', 'nn', 'torch_ops'):\n"
               "    try:\n"
               "        getattr(l2gen, name)\n"
               "    except ImportError as exc:\n"
               "        assert 'torch' in str(exc), exc\n"
               "    else:\n"
               "        raise AssertionError(name)\n")
    for code in (light, without):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
