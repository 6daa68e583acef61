"""Rebuild a shipped kernel database from the committed bench results it is made of.

``bench/shipped_sources.json`` lists, per GPU, the two-run bench files (in import order) and
the shapes each leaves out; this imports them with ``KernelDB.import_bench`` (the rules it
applies, e.g. a kernel of at least ``SUSTAINED_MIN_US`` judged by the less favourable of one
call at a time and back to back, are today's) into a fresh database, leaves it as one file
(no WAL), and prints each shape's best program and whether the dispatcher serves it. CPU only:

    python bench/ship_db.py h200                   # -> l2gen/data/kernels_h200.db
    python bench/ship_db.py h100 -o /tmp/k.db      # anywhere else
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from l2gen.db import KernelDB  # noqa: E402
from l2gen.dispatch import Dispatcher  # noqa: E402
from l2gen.ir import BLayout  # noqa: E402
from l2gen.problem import Shape  # noqa: E402
from l2gen.targets import GPUS  # noqa: E402

SOURCES = ROOT / "bench" / "shipped_sources.json"


def sources(gpu: str, manifest: Path = SOURCES) -> list[tuple[Path, list[Shape]]]:
    """The (results file, shapes to leave out) of ``gpu``'s shipped database, in order."""
    doc = json.loads(manifest.read_text())
    if gpu not in doc:
        known = ", ".join(k for k in doc if k != "about")
        raise SystemExit(f"{manifest}: no shipped database for {gpu!r} (it lists {known})")
    out = []
    for entry in doc[gpu]:
        skip = [Shape(*(int(x) for x in s.split("x"))) for s in entry.get("skip", [])]
        out.append((ROOT / entry["file"], skip))
    return out


def build(gpu: str, out: Path, manifest: Path = SOURCES) -> int:
    """A fresh database at ``out`` from ``gpu``'s sources; returns the rows added."""
    out.unlink(missing_ok=True)
    added = 0
    with KernelDB(out) as db:
        for path, skip in sources(gpu, manifest):
            added += db.import_bench(path, skip=skip)
    con = sqlite3.connect(out)  # one self-contained file, as the package ships it
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.execute("PRAGMA journal_mode=DELETE")
    con.execute("VACUUM")
    con.close()
    return added


def served(gpu: str, path: Path) -> list[tuple[str, Shape, str, float, float | None, bool]]:
    """(B layout, shape, best program, speedup over cuBLAS-best, over torch.matmul, served)
    for every shape of the database, as the dispatcher of that layout judges it."""
    rows = []
    for layout in (BLayout.KN, BLayout.NK):
        d = Dispatcher(path, GPUS[gpu], b_layout=layout, toolchain={})  # plans only: nothing launched
        for shape, (program, speedup, _) in sorted(d._recorded.items(), key=lambda kv: (kv[0].m, kv[0].n, kv[0].k)):
            rows.append((layout.value, shape, program.name, speedup, d._over_fallback.get(shape), d._wins(shape, speedup)))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gpu", help="the GPU whose shipped database to rebuild (h200, h100)")
    ap.add_argument("-o", "--out", type=Path, help="where (default l2gen/data/kernels_<gpu>.db)")
    args = ap.parse_args(argv)
    out = args.out or ROOT / "l2gen" / "data" / f"kernels_{args.gpu}.db"
    fresh = out.with_name(out.name + ".new")  # the shipped file is replaced only once whole
    added = build(args.gpu, fresh)
    fresh.replace(out)
    rows = served(args.gpu, out)
    shown = out.resolve().relative_to(ROOT) if out.resolve().is_relative_to(ROOT) else out
    print(f"{shown}: {added} measured rows; {sum(r[5] for r in rows)} of {len(rows)} shapes served")
    for layout, shape, name, speedup, over, ok in rows:
        fallback = f"{over:.3f}" if over is not None else "  -  "
        print(f"  {layout}  {str(shape):>18}  {name:<42} x cuBLAS-best {speedup:.3f}  x torch {fallback}  "
              f"{'served' if ok else '-'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
