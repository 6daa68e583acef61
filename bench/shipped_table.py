"""The per-shape results table of a suite: for each shape, the program the shipped database
judges best (its least favourable run) and, from the benchmark file of that run, its time
beside every baseline of the same run and the run's floor; whether the dispatcher serves it.

    python bench/shipped_table.py --suite suites/llm.json bench/results/<the files the database was built from>

Markdown on stdout. A shape the database holds no row of is listed as such, with dashes. ``floor``
is ``max(launch floor, bytes / streaming rate, FLOPs / peak)`` with the three figures that
run measured (``"floors"`` of its file); bytes count A, B and C once.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from l2gen.cli.run import load_suite  # noqa: E402
from l2gen.dispatch import Dispatcher  # noqa: E402
from l2gen.ir import BLayout  # noqa: E402
from l2gen.parse import parse  # noqa: E402
from l2gen.problem import program_key  # noqa: E402
from l2gen.protocol import Floors  # noqa: E402
from l2gen.schema import read_results  # noqa: E402
from l2gen.targets import GPUS  # noqa: E402

BASELINES = (
    ("torch.matmul", "torch_matmul_us"),
    ("cuBLAS", "cublas_us"),
    ("cuBLASLt", "cublaslt_heuristic_us"),
    ("cuBLASLt tuned", "cublaslt_autotuned_us"),
)


def runs_of(paths: list[str]) -> dict[tuple, list[tuple[dict, Floors]]]:
    """(m, n, k, program key) -> [(row, the file's floors)] over every verified row."""
    out: dict[tuple, list] = {}
    for path in paths:
        data = read_results(path)
        floors = Floors.from_dict(data["floors"])
        for row in data["rows"]:
            if row.get("status") == "ok" and row.get("program_text") and row.get("l2gen_us"):
                key = (row["m"], row["n"], row["k"], program_key(parse(row["program_text"])))
                out.setdefault(key, []).append((row, floors))
    return out


def table(suite: str, db: str, paths: list[str]) -> str:
    gpu = GPUS["h200"]
    runs = runs_of(paths)
    dispatchers = {layout: Dispatcher(db, gpu, b_layout=layout) for layout in BLayout}
    head = ["shape", "B", "best program", "µs", *(name + " µs" for name, _ in BASELINES), "× cuBLAS-best", "× torch.matmul", "floor µs", "served"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    entries = json.loads(Path(suite).read_text())["shapes"]  # load_suite checks them; "b": the layout, kn by default
    for s, entry in zip(load_suite(suite), entries):
        layout = BLayout(entry.get("b", "kn"))
        found = dispatchers[layout].recorded(s.m, s.n, s.k)  # the dispatcher's own judgement
        shape = f"{s.m}×{s.n}×{s.k}"
        if found is None:
            lines.append(f"| {shape} | {layout.value} | not in the database: torch.matmul serves it |" + " — |" * (len(head) - 4) + " no |")
            continue
        program, _ = found
        mine = runs.get((s.m, s.n, s.k, program_key(program)), [])
        if not mine:
            lines.append(f"| {shape} | {layout.value} | {program.name} (no run among the files given) |" + " — |" * (len(head) - 4) + " ? |")
            continue
        # the run the database judges by: the least favourable against cuBLAS-best
        row, floors = min(mine, key=lambda rf: rf[0]["cublas_best_us"] / rf[0]["l2gen_us"])
        base = row["baselines"]
        cells = [shape, layout.value, program.name, f"{row['l2gen_us']:.1f}"]
        cells += [f"{base[key]:.1f}" if base.get(key) else "—" for _, key in BASELINES]
        cells += [f"{row['cublas_best_us'] / row['l2gen_us']:.2f}",
                  f"{base['torch_matmul_us'] / row['l2gen_us']:.2f}" if base.get("torch_matmul_us") else "—",
                  f"{floors.floor_us(s.m, s.n, s.k):.1f}",
                  "yes" if dispatchers[layout].plan(s.m, s.n, s.k) is not None else "no"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", required=True)
    parser.add_argument("--db", default=str(ROOT / "l2gen" / "data" / "kernels_h200.db"))
    parser.add_argument("files", nargs="+", help="the benchmark results files the database was built from")
    args = parser.parse_args(argv)
    print(table(args.suite, args.db, args.files))
    return 0


if __name__ == "__main__":
    sys.exit(main())
