"""Write the held-out shape sets: LLM-like GEMMs that no tuning run, policy training or
design decision may use, so that what the search and the library do on shapes they have
never seen can be reported on its own.

    python bench/heldout.py            # rewrites suites/heldout-nk.json and -kn.json

The draw is fixed by SEED: the same files come out on every machine (a test checks that
they are what this script writes, and that no shape in them appears in the other suites,
the sweeps' shape lists, the shipped database or the shipped policy state).

Shapes are the projections of transformer layers (qkv, o, gate_up, down) of models that
`suites/llm.json` does not use, at token counts from batch-1 decode to 4096-token prefill
chunks. A suite holds one B layout, so the set comes in two files: `nk` (B stored N x K,
an nn.Linear weight, `a @ w.T`) and `kn` (B stored K x N, weights kept transposed).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

SEED = 20261203
PER_LAYOUT = 16
ROOT = Path(__file__).resolve().parent.parent

# model: (hidden, intermediate, query heads, kv heads, head dim)
MODELS = {
    "llama3.2-1b": (2048, 8192, 32, 8, 64),
    "llama3.2-3b": (3072, 8192, 24, 8, 128),
    "qwen2.5-14b": (5120, 13824, 40, 8, 128),
    "gemma2-9b": (3584, 14336, 16, 8, 256),
    "phi3-mini": (3072, 8192, 32, 32, 96),
    "llama3.1-70b": (8192, 28672, 64, 8, 128),
    "mistral-nemo-12b": (5120, 14336, 32, 8, 128),
}
TOKENS = (1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


def projections(hidden: int, ffn: int, heads: int, kv_heads: int, head_dim: int) -> dict[str, tuple[int, int]]:
    """(N, K) of each projection: y[M, N] = x[M, K] @ W."""
    q = heads * head_dim
    kv = kv_heads * head_dim
    return {"qkv": (q + 2 * kv, hidden), "o": (hidden, q), "gate_up": (2 * ffn, hidden), "down": (hidden, ffn)}


def used_elsewhere() -> set[tuple[int, int, int]]:
    """(m, n, k) of every shape in the other suites and the sweeps' shape lists."""
    files = [p for p in sorted((ROOT / "suites").glob("*.json")) if not p.name.startswith("heldout")]
    files += sorted((ROOT / "bench" / "sweeps").glob("*-shapes.json"))
    out = set()
    for path in files:
        data = json.loads(path.read_text())
        for e in data.get("shapes", data) if isinstance(data, dict) else data:
            out.add((e["m"], e["n"], e["k"]))
    return out


def draw() -> dict[str, list[dict]]:
    """The two layouts' shapes, drawn without replacement from every (model, projection,
    tokens) triple whose shape no other suite or sweep uses."""
    taken = used_elsewhere()
    pool = []
    for model, dims in MODELS.items():
        for proj, (n, k) in projections(*dims).items():
            for m in TOKENS:
                if (m, n, k) not in taken:
                    pool.append({"m": m, "n": n, "k": k, "model": model, "proj": proj})
    rng = random.Random(SEED)
    rng.shuffle(pool)
    out: dict[str, list[dict]] = {"nk": [], "kn": []}
    seen: set[tuple[int, int, int]] = set()
    for entry in pool:
        key = (entry["m"], entry["n"], entry["k"])
        if key in seen:  # two models with one projection shape: keep the first drawn
            continue
        layout = "nk" if len(out["nk"]) < PER_LAYOUT else "kn"
        if len(out[layout]) == PER_LAYOUT:
            break
        seen.add(key)
        out[layout].append({**entry, "b": layout})
    for shapes in out.values():
        shapes.sort(key=lambda e: (e["m"], e["n"], e["k"]))
    return out


def documents() -> dict[str, dict]:
    about = ("Held out: LLM-like projection shapes that no tuning run, policy training or design "
             "decision uses; results on them are reported on their own. Drawn by bench/heldout.py "
             f"(seed {SEED}, {PER_LAYOUT} per B layout) from models suites/llm.json does not use, "
             "excluding every shape of the other suites and the sweeps.")
    return {
        f"heldout-{layout}.json": {"about": about, "seed": SEED, "b": layout, "shapes": shapes}
        for layout, shapes in draw().items()
    }


def main() -> int:
    for name, doc in documents().items():
        path = ROOT / "suites" / name
        path.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"{path.relative_to(ROOT)}: {len(doc['shapes'])} shapes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
