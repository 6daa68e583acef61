"""Where an eager decode step of the e2e model spends its host time, l2gen against torch.

Eager decode steps are host-bound (a batch-1 step of the 2-layer model keeps the GPU busy
for ~0.7 ms and the host for 1.5-3 ms), so their time is the host's. For each variant,
twice in one process: the host time to issue 50 steps (no sync), the same drained, and
50 steps each followed by a sync; then the host time of each patched Linear call
(``l2gen.torch_ops._call``, the launch included) by shape, and a cProfile of 20 l2gen
steps.

    python3 bench/eager_host.py DB [BATCH]     # DB: the kernel database l2gen serves from
"""

from __future__ import annotations

import cProfile
import dataclasses
import pstats
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
if str(HERE.parent) not in sys.path:
    sys.path.insert(1, str(HERE.parent))

import torch  # noqa: E402

import e2e_llama as E  # noqa: E402
import l2gen.torch_ops as torch_ops  # noqa: E402
from l2gen.dispatch import use_db  # noqa: E402
from l2gen.model_shapes import model_dims  # noqa: E402


def warmed(model, prompt, steps: int) -> "E.Decoder":
    """A decoder from the prompt, five steps in and synchronized (under the caller's
    variant), with room for ``steps`` steps per pass it is timed over."""
    dec = E.Decoder(model, prompt, 4 * steps)
    dec.prefill()
    for _ in range(5):
        dec.step()
    torch.cuda.synchronize()
    return dec


def issue_times(model, prompt, name: str, steps: int = 50) -> tuple[float, float, float]:
    """(issue, issue + drain, step + sync) host µs per step of one variant."""
    with E.variant(model, name):
        dec = warmed(model, prompt, steps)
        t = time.perf_counter()
        for _ in range(steps):
            dec.step()
        issue = time.perf_counter() - t
        torch.cuda.synchronize()
        drained = time.perf_counter() - t
        t = time.perf_counter()
        for _ in range(steps):
            dec.step()
            torch.cuda.synchronize()
        serial = time.perf_counter() - t
    return tuple(x / steps * 1e6 for x in (issue, drained, serial))


def linear_calls(model, prompt, steps: int = 20) -> dict:
    """Host µs of each patched Linear call over ``steps`` l2gen steps, by operand shapes."""
    calls: dict = {}
    original = torch_ops._call

    def timed(a, b, *args, **kwargs):
        t = time.perf_counter()
        out = original(a, b, *args, **kwargs)
        calls.setdefault((tuple(a.shape), tuple(b.shape)), []).append((time.perf_counter() - t) * 1e6)
        return out

    with E.variant(model, "l2gen"):
        dec = warmed(model, prompt, steps)
        torch_ops._call = timed
        try:
            for _ in range(steps):
                dec.step()
        finally:
            torch_ops._call = original
        torch.cuda.synchronize()
    return calls


def main(argv: list[str]) -> int:
    if not argv or not torch.cuda.is_available():
        print(__doc__, file=sys.stderr)
        return 2
    use_db(argv[0])
    batch = int(argv[1]) if len(argv) > 1 else 1
    dims = dataclasses.replace(model_dims("llama3.1-8b"), num_hidden_layers=2)
    model = E.build(dims, seed=0, dtype=torch.float16, device=torch.device("cuda"), max_positions=512)
    prompt = torch.randint(0, dims.vocab_size, (batch, 16)).cuda()
    with torch.no_grad():
        for name in ("torch", "l2gen", "torch", "l2gen"):
            issue, drained, serial = issue_times(model, prompt, name)
            print(f"{name:6} batch {batch}: host issue {issue:7.1f} us/step, issue+drain {drained:7.1f}, "
                  f"step+sync {serial:7.1f}", flush=True)
        for (sa, sb), times in sorted(linear_calls(model, prompt).items()):
            times.sort()
            print(f"  Linear {sa} x {sb}: {len(times)} calls, median {times[len(times) // 2]:.1f} us, max {times[-1]:.1f}")
        with E.variant(model, "l2gen"):
            dec = warmed(model, prompt, 20)
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(20):
                dec.step()
            profile.disable()
            torch.cuda.synchronize()
    pstats.Stats(profile).sort_stats("tottime").print_stats(25)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
