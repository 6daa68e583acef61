"""Report: a bench results file (:mod:`l2gen.bench`) as a terminal table and a plot."""

from __future__ import annotations

from pathlib import Path

from .baselines import BASELINES, result_key
from .console import Columns, plain
from .compare import sustained_speedup
from .protocol import Protocol

# ---- the table and the plot -----------------------------------------------------------

_SHORT = {"torch_matmul": "torch", "cublas": "cublas", "cublas_tt": "cublasTT",
          "cublaslt_heuristic": "lt", "cublaslt_autotuned": "lt_auto"}


def _fmt(x, spec: str, missing: str = "-") -> str:
    return missing if x is None else format(x, spec)


def format_table(results: dict) -> str:
    """The terminal table: a row per (shape, program) with time, TFLOP/s, % of the floor,
    speedup over each baseline and over cuBLAS-best, relerr; then the baselines' times."""
    return plain(table_blocks(results))


def table_blocks(results: dict) -> list:
    """:func:`format_table`'s tables and lines, as :func:`l2gen.console.show` prints them."""
    names = _baseline_names(results)
    head = ["shape", "program", "status", "us", "TFLOP/s", "floor%"]
    head += [f"x{_SHORT.get(n, n)}" for n in names] + ["xbest", "relerr"]
    loops = any("sustained_us" in r for r in results["rows"])  # bench --sustained
    if loops:
        head += ["b2b us", "xbest b2b"]
    body = []
    for r in results["rows"]:
        shape = f"{r['m']}x{r['n']}x{r['k']}"
        t = r["l2gen_us"]
        line = [shape, r["program"], r["status"], _fmt(t, ".2f"), _fmt(r["tflops"], ".1f"),
                _fmt(r["floor_pct"], ".1f")]
        for n in names:
            b = r["baselines"].get(result_key(n))
            line.append(_fmt(b / t if b and t else None, ".2f"))
        line += [_fmt(r["speedup_vs_best"], ".2f"), _fmt(r["relerr"], ".1e")]
        if loops:
            line += [_fmt(r.get("sustained_us"), ".2f"), _fmt(sustained_speedup(r), ".2f")]
        body.append(line)
    out: list = [Columns(head, body, frozenset({0, 1, 2}))]
    failures = [r for r in results["rows"] if r["status"] != "ok" and r.get("error")]
    for r in failures:
        first = r["error"].strip().splitlines()[0] if r["error"].strip() else ""
        out.append(f"  {r['m']}x{r['n']}x{r['k']} {r['program']}: {r['status']}: {first}")
    if results.get("shapes"):
        bhead = ["shape"] + [f"{_SHORT.get(n, n)} us" for n in names] + ["best us", "best program", "xbest"]
        brows = []
        for s in results["shapes"]:
            line = [f"{s['m']}x{s['n']}x{s['k']}"]
            line += [_fmt(s["baselines"].get(result_key(n)), ".2f") for n in names]
            line += [_fmt(s["cublas_best_us"], ".2f"), s["best_program"] or "-",
                     _fmt(s["speedup_vs_best"], ".2f")]
            brows.append(line)
        out += ["", Columns(bhead, brows, frozenset({0, len(bhead) - 2}))]
    if Protocol.of(results).mode == "server":
        out += ["", _server_table(results)]
    out += ["", _protocol_line(results)]
    return out


def _protocol_line(results: dict) -> str:
    """How the run was timed, and the floor its floor% is taken against."""
    line = f"timed in {Protocol.of(results).describe()}"
    floors = results.get("floors")
    if not floors:
        return line + "; floors not recorded"
    launch = floors.get("launch_floor_us")
    return (line + f"; floor% against max(launch {_fmt(launch, '.2f')} us, bytes / {floors['stream_tbs']:.2f} TB/s, "
            f"FLOPs / {floors['peak_tflops']:.0f} TFLOP/s), measured in this run"
            + ("" if str(floors.get("peak_source", "")).startswith("measured") else f" (peak: {floors.get('peak_source')})"))


def _server_table(results: dict) -> "Columns | str":
    """Server mode: per program and baseline, event and wall time per call, median and mean."""
    head = ["shape", "runner", "calls", "event med", "event mean", "wall med", "wall mean"]
    body, seen = [], set()
    for r in results.get("rows", []) + results.get("shapes", []):
        shape = f"{r['m']}x{r['n']}x{r['k']}"
        figures = [(r["program"], r.get("server"))] if "program" in r else []
        figures += [(key[:-3] if key.endswith("_us") else key, v) for key, v in (r.get("baseline_server") or {}).items()]
        for name, f in figures:
            if not f or (shape, name) in seen:
                continue
            seen.add((shape, name))
            body.append([shape, name, str(f["calls"]), _fmt(f["event_median_us"], ".2f"), _fmt(f["event_mean_us"], ".2f"),
                         _fmt(f["wall_median_us"], ".2f"), _fmt(f["wall_mean_us"], ".2f")])
    return Columns(head, body, frozenset({0, 1})) if body else "(no server-mode figures)"


def _baseline_names(results: dict) -> list[str]:
    seen = []
    for r in results.get("rows", []) + results.get("shapes", []):
        for key in r["baselines"]:
            name = key[:-3] if key.endswith("_us") else key
            if name not in seen:
                seen.append(name)
    return seen or list(BASELINES)


def plot_speedups(results: dict, path: Path | str) -> bool:
    """A bar per shape: the best program's speedup over cuBLAS-best (1.0 marked).
    Returns False, writing nothing, when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    shapes = results.get("shapes", [])
    labels = [f"{s['m']}x{s['n']}x{s['k']}" for s in shapes]
    values = [s["speedup_vs_best"] or 0.0 for s in shapes]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(shapes) + 2), 4.5))
    colors = ["tab:green" if v >= 1 else ("tab:red" if v == 0 else "tab:orange") for v in values]
    ax.bar(range(len(values)), values, color=colors)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(values)), labels, rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("speedup over cuBLAS-best")
    ax.set_title(f"l2gen on {results.get('device') or results.get('gpu')} "
                 f"(best program per shape; 0 = none passed)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
