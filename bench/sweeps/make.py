"""Write a sweep: sm90a programs x run-time knob variants, for one group of suite shapes.

Each compile-time configuration is one library; its knob variants share it (run-time
knobs need no rebuild), so a sweep costs one build per configuration however many
variants it times.

- ``skinny``: problems with few rows (decode, M <= 256), a short K, or a narrow N are
  memory- or launch-bound and their output tiles fill only part of the 132 SMs. The
  stream-K scheduler (cooperative mainloop only, so BM = 128 or 256) splits K to fill them.
- ``large``: compute-bound problems (M, N >= 512, K >= 1024). Tile shape, cluster shape
  and mainloop schedule at compile time; rasterization order and swizzle at run time.
- ``l2gen``: l2gen's own sm90a kernel (``impl l2gen``) for the skinny, K-heavy and
  small-M problems: tile, swap-AB, stages and cache hints at compile time; the cluster
  split of K (1, 2, 4, 8 CTAs per tile) at run time.
- ``multicast``: the best of those with multicast clusters (neighbouring tiles load a
  shared operand tile once), the atomic split at 1..16 (its shapes: the l2gen sweep's).

    python bench/sweeps/make.py skinny /tmp/skinny   # shapes: bench/sweeps/skinny-shapes.json
    python bench/sweeps/make.py large /tmp/large     # shapes: bench/sweeps/large-shapes.json
    python bench/sweeps/make.py l2gen /tmp/l2gen     # shapes: bench/sweeps/l2gen-shapes.json
    python bench/sweeps/make.py multicast /tmp/mc    # the same shapes
"""
from __future__ import annotations

import itertools
import sys
from pathlib import Path

# sweep -> (compile-time configurations (BM, BN, BK, cluster, mainloop, scheduler),
#           run-time variants (raster, swizzle, decomposition, splits))
SWEEPS = {
    "skinny": (
        [(128, 64, 64, (1, 1), "cooperative", "stream_k"),
         (128, 128, 64, (1, 1), "cooperative", "stream_k"),
         (128, 256, 64, (1, 1), "cooperative", "stream_k"),
         (128, 128, 128, (1, 1), "cooperative", "stream_k"),
         (128, 128, 64, (1, 2), "cooperative", "stream_k"),
         (256, 128, 64, (1, 1), "cooperative", "stream_k")],
        [("heuristic", 0, d, s) for d, s in
         [("heuristic", 1), ("data_parallel", 1), ("stream_k", 1), ("split_k", 2), ("split_k", 4), ("split_k", 8)]],
    ),
    "large": (
        [(128, 256, 64, (2, 1), "cooperative", "persistent"),
         (128, 256, 64, (1, 2), "cooperative", "persistent"),
         (256, 128, 64, (1, 2), "cooperative", "persistent"),
         (256, 128, 64, (2, 1), "cooperative", "persistent"),
         (128, 192, 64, (2, 1), "cooperative", "persistent"),
         (128, 128, 64, (1, 2), "pingpong", "persistent"),
         (128, 128, 64, (2, 1), "pingpong", "persistent")],
        [(r, s, "heuristic", 1) for r, s in itertools.product(("heuristic", "along_m", "along_n"), (0, 1, 3))],
    ),
    # (BM, BN, BK, swap_ab, stages, hints, split_k) x (raster, swizzle, splits)
    "l2gen": (
        [(128, 128, 64, False, 5, "none", split)
         for split in ("cluster", "atomic")]
        + [(128, 64, 64, False, 6, "none", "cluster"),
           (64, 256, 64, False, 4, "stream", "cluster"),
           (128, 192, 64, False, 4, "stream", "cluster"),
           (128, 256, 64, False, 4, "none", "cluster")]
        + [(64, 128, 128, True, 4, "stream", split) for split in ("cluster", "atomic")]
        + [(64, 64, 128, True, 6, "stream", split) for split in ("cluster", "atomic")]
        + [(128, 128, 128, True, 3, "stream", "cluster"),
           (256, 128, 64, True, 4, "stream", "cluster")],
        [("heuristic", 0, s) for s in (1, 2, 4, 8)],
    ),
    # (BM, BN, BK, swap_ab, stages, hints, split_k, cluster) x (raster, swizzle, splits):
    # the best l2gen configurations of the l2gen sweep with multicast clusters beside them
    "multicast": (
        [(64, 64, 128, True, 6, "stream", "atomic", c) for c in ((1, 1), (1, 2), (1, 4), (1, 8))]
        + [(64, 128, 128, True, 4, "stream", "atomic", c) for c in ((1, 1), (1, 2), (1, 4))]
        + [(128, 128, 128, True, 3, "stream", "atomic", (1, 2)),
           (256, 128, 64, True, 4, "stream", "atomic", (1, 2))]
        + [(128, 128, 64, False, 5, "none", "atomic", c) for c in ((1, 1), (1, 2), (2, 1), (2, 2))]
        + [(128, 256, 64, False, 4, "none", "atomic", (2, 1))],
        [("heuristic", 0, s) for s in (1, 2, 4, 8, 16)],
    ),
}


def program(config: tuple, knobs: tuple) -> tuple[str, str]:
    bm, bn, bk, (cm, cn), mainloop, scheduler = config
    raster, swizzle, decomposition, splits = knobs
    name = f"{mainloop[:4]}_{bm}x{bn}x{bk}_c{cm}{cn}1_{raster}{swizzle}"
    if scheduler == "stream_k":
        name = f"skinny_{bm}x{bn}x{bk}_c{cm}{cn}1_{decomposition}{splits}"
    return name, f"""kernel {name} {{
    arch          sm90a
    b             kn
    tile          {bm} x {bn} x {bk}
    cluster       {cm} x {cn} x 1
    mainloop      {mainloop}
    epilogue      tma
    stages        auto
    scheduler     {scheduler}
    raster        {raster}
    swizzle       {swizzle}
    splits        {splits}
    decomposition {decomposition}
}}
"""


def l2gen_program(config: tuple, knobs: tuple) -> tuple[str, str]:
    bm, bn, bk, swap, stages, hints, split_k, *rest = config
    cm, cn = rest[0] if rest else (1, 1)
    raster, swizzle, splits = knobs
    cluster = f"_c{cm}{cn}" if cm * cn > 1 else ""
    name = f"l2gen_{bm}x{bn}x{bk}_{'swap_' if swap else ''}s{stages}_{hints}{cluster}_{split_k}{splits}"
    return name, f"""kernel {name} {{
    arch    sm90a
    impl    l2gen
    b       kn
    tile    {bm} x {bn} x {bk}
    swap_ab {'on' if swap else 'off'}
    stages  {stages}
    split_k {split_k}
    hints   {hints}
    cluster {cm} x {cn} x 1
    raster  {raster}
    swizzle {swizzle}
    splits  {splits}
}}
"""


def main(sweep: str, out: str) -> None:
    if sweep not in SWEEPS:
        raise SystemExit(f"unknown sweep '{sweep}': one of {', '.join(SWEEPS)}")
    configs, variants = SWEEPS[sweep]
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    write = l2gen_program if sweep in ("l2gen", "multicast") else program
    for config, knobs in itertools.product(configs, variants):
        name, text = write(config, knobs)
        (folder / f"{name}.l2").write_text(text)
    print(f"{len(configs) * len(variants)} programs ({len(configs)} libraries) in {folder}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2])
