"""Where l2gen's persistent grid wins or loses against waves of CTAs: every measured pair of
one l2gen sm90a program on one shape under `decomposition heuristic` (the persistent grid
where the tiles outnumber the CTAs the GPU holds) and `decomposition data_parallel` (a CTA
per tile, in waves), all its other knobs equal, from tune and sweep databases:

    python bench/decomposition_pairs.py bench/results/*.db
    python bench/decomposition_pairs.py --all bench/results/*.db   # every pair, not only those 3% apart

Prints heuristic / data_parallel (the best of each) per (GPU, shape, configuration, raster,
swizzle); programs with a grid cap are left out (a cap changes what the grid is).
"""

from __future__ import annotations

import re
import sqlite3
import sys
from collections import defaultdict

_KNOB = re.compile(r"^\s*(decomposition|raster|swizzle|grid|splits)\s+(\S+)\s*$", re.M)


def _knobs(text: str) -> dict[str, str]:
    return {name: value for name, value in _KNOB.findall(text)}


def _config(text: str) -> str:
    """The program's compile-time decisions on one line (name and knobs dropped)."""
    body = _KNOB.sub("", text)
    body = re.sub(r"kernel\s+\S+\s*\{|\}", "", body)
    return " ".join(body.split()).replace("arch sm90a impl l2gen ", "")


def pairs(paths: list[str]) -> list[tuple[str, int, int, int, str, str, float, float]]:
    best: dict[tuple, dict[str, float]] = defaultdict(dict)
    for path in paths:
        try:
            con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            rows = con.execute("SELECT gpu, m, n, k, time_us, program_text FROM measurements "
                               "WHERE status = 'ok' AND time_us > 0 AND program_text LIKE '%impl%l2gen%'").fetchall()
        except sqlite3.Error as e:
            print(f"{path}: skipped ({e})", file=sys.stderr)
            continue
        for gpu, m, n, k, us, text in rows:
            kn = _knobs(text)
            if kn.get("grid", "0") != "0" or kn.get("splits", "1") != "1":
                continue
            key = (gpu, m, n, k, _config(text), f"{kn.get('raster', 'heuristic')} swizzle {kn.get('swizzle', '0')}")
            mode = kn.get("decomposition", "heuristic")
            best[key][mode] = min(us, best[key].get(mode, float("inf")))
    return [(*key, v["heuristic"], v["data_parallel"]) for key, v in best.items()
            if "heuristic" in v and "data_parallel" in v]


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    every = argv[0] == "--all"
    found = pairs(argv[1:] if every else argv)
    shown = [p for p in found if every or abs(p[6] / p[7] - 1.0) > 0.03]
    for gpu, m, n, k, config, order, heuristic, dp in sorted(shown, key=lambda p: (p[0], p[1] * p[2] * p[3])):
        print(f"{gpu} {m}x{n}x{k:<7} {heuristic:9.1f} {dp:9.1f} us  heuristic/dp {heuristic / dp:5.3f}  {config}  ({order})")
    print(f"{len(shown)} of {len(found)} pairs shown (heuristic and data_parallel more than 3% apart"
          f"{'' if not every else ', or all'})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
