"""Write the skinny-problem sweep: sm90a stream-K programs x run-time knob variants.

Problems with few rows (decode, M <= 256) or a short K are memory- or launch-bound, and
their output tiles fill only part of the 132 SMs. The stream-K scheduler (cooperative
mainloop only, so BM = 128) splits K to fill them. Each compile-time configuration below
is one library; its knob variants (split count, decomposition) share it, so the sweep
costs six builds however many variants it times.

    python bench/sweeps/make_skinny.py bench/sweeps/skinny      # then l2gen bench ...
"""
from __future__ import annotations

import sys
from pathlib import Path

CONFIGS = [  # (BM, BN, BK, cluster)
    (128, 64, 64, "1 x 1 x 1"),
    (128, 128, 64, "1 x 1 x 1"),
    (128, 256, 64, "1 x 1 x 1"),
    (128, 128, 128, "1 x 1 x 1"),
    (128, 128, 64, "1 x 2 x 1"),
    (256, 128, 64, "1 x 1 x 1"),
]
KNOBS = [  # (decomposition, splits)
    ("heuristic", 1),
    ("data_parallel", 1),
    ("stream_k", 1),
    ("split_k", 2),
    ("split_k", 4),
    ("split_k", 8),
]


def program(bm: int, bn: int, bk: int, cluster: str, decomposition: str, splits: int) -> tuple[str, str]:
    c = cluster.replace(" x ", "")
    name = f"skinny_{bm}x{bn}x{bk}_c{c}_{decomposition}{splits}"
    return name, f"""kernel {name} {{
    arch          sm90a
    b             kn
    tile          {bm} x {bn} x {bk}
    cluster       {cluster}
    mainloop      cooperative
    epilogue      tma
    stages        auto
    scheduler     stream_k
    raster        heuristic
    swizzle       0
    splits        {splits}
    decomposition {decomposition}
}}
"""


def main(out: str) -> None:
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    for cfg in CONFIGS:
        for knobs in KNOBS:
            name, text = program(*cfg, *knobs)
            (folder / f"{name}.l2").write_text(text)
    print(f"{len(CONFIGS) * len(KNOBS)} programs ({len(CONFIGS)} libraries) in {folder}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/sweeps/skinny")
