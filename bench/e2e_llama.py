"""End to end: a Llama-style model (bench/llama_model.py) with and without l2gen.

    python3 bench/e2e_llama.py --out e2e.json                  # on a machine with a CUDA GPU
    python3 bench/e2e_llama.py --model path/to/config.json --layers 4 --db tuned.db

The model has a config's dimensions (default Llama-3.1-8B's, 2 of its layers) and seeded
random weights: no download, no ``transformers``. For each decode batch size (greedy,
``--new-tokens`` steps after a ``--prompt``-token prefill, a preallocated KV cache) and
for a ``--prefill``-token prefill at batch 1, it runs the model with torch's Linear
layers and with ``l2gen.patch(model)``, eagerly and as a captured CUDA graph (of one
decode step; of the whole prefill), and reports:

- per-step latency: the median of CUDA-event times around each step (or prefill), and
  tokens per second over the whole decode (batch x steps / first start to last end);
- GEMM time: the device time of the Linear layers' kernels per step, from one profiled
  eager run (``torch.profiler``, each Linear call a range), as a share of all kernel time
  and of the step's latency;
- accuracy: l2gen's logits against torch's at every step, with both fed torch's greedy
  tokens (max |l2gen - torch| / max |torch|, at most ``--tolerance``), whether the greedy
  tokens agree, and each timed run's tokens against torch's;
- which Linear shapes an l2gen kernel served (the rest fall back to torch's own call).

It writes the results as JSON (``--out``) and prints a table last. Exit 0, 1 if a logits
difference exceeds the tolerance, 2 if it cannot run (no CUDA GPU: ``--device cpu``
runs the same steps with no graphs at tiny dimensions, to test the script).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
if str(HERE.parent) not in sys.path:
    sys.path.insert(1, str(HERE.parent))  # the checkout's l2gen, when it is not installed

import torch  # noqa: E402

import l2gen  # noqa: E402
from l2gen.diagnostics import DiagnosticError  # noqa: E402
from l2gen.model_shapes import model_dims, parse_tokens  # noqa: E402
from llama_model import KVCache, build  # noqa: E402

GEMM_RANGE = "e2e:linear"


class Clock:
    """CUDA events on a GPU (read after a synchronize), the host clock on the CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def ms(self, a, b) -> float:
        return a.elapsed_time(b) if self.cuda else (b - a) * 1e3

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


def rel_diff(a: torch.Tensor, ref: torch.Tensor) -> float:
    """max |a - ref| / max |ref|, in fp32."""
    a, ref = a.float(), ref.float()
    return float((a - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


DB = None  # --db: the kernel database the l2gen variants serve from (None: the default)


@contextmanager
def variant(model, name: str):
    """The model as torch runs it ("torch"), with its Linear layers through l2gen ("l2gen"),
    or through l2gen with l2gen's own kernels launched with programmatic dependent launch
    ("l2gen+pdl": default dispatchers of their own, made for the run and put back after)."""
    if name == "torch":
        yield
        return
    from l2gen.dispatch import use_db

    if name == "l2gen+pdl":
        use_db(DB, pdl=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an fp32 model (--dtype fp32): patch warns that it changes nothing
        handle = l2gen.patch(model)
    try:
        yield
    finally:
        handle.undo()
        if name == "l2gen+pdl":
            use_db(DB)  # the default again ($L2GEN_PDL)


@contextmanager
def linear_ranges(model):
    """Each Linear call inside a profiler range named GEMM_RANGE."""
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]

    def wrap(layer):
        def forward(x):
            with torch.profiler.record_function(GEMM_RANGE):
                return type(layer).forward(layer, x)
        return forward

    for layer in layers:
        layer.forward = wrap(layer)
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward


def gemm_time(model, run, steps: int, device: torch.device) -> dict:
    """Device time (host time on the CPU) of the Linear layers' kernels per call of
    ``run``, and of all kernels, from ``steps`` profiled calls."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    try:
        with linear_ranges(model), profile(activities=activities) as prof:
            for _ in range(steps):
                run()
            Clock(device).sync()
        events = [e for e in prof.events() if e.device_type == DeviceType.CPU]
        if device.type == "cuda":
            gemm = sum(e.device_time_total for e in events if e.name == GEMM_RANGE)
            total = sum(k.duration for e in events for k in e.kernels)
        else:
            gemm = sum(e.cpu_time_total for e in events if e.name == GEMM_RANGE)
            total = None
    except Exception as exc:  # the profiler is a report, not a result: say why it has none
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    return {"gemm_us": gemm / steps, "kernel_us": None if total is None else total / steps,
            "share_of_kernels": None if not total else gemm / total}


def host_ops(run, steps: int, device: torch.device, top: int = 25) -> dict:
    """Where the host's time goes in ``steps`` calls of ``run``: the ``top`` operators by
    self CPU time, per call (the profiler's own cost is in every figure alike)."""
    from torch.profiler import ProfilerActivity, profile

    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                run()
            Clock(device).sync()
        stats = {e.key: (e.self_cpu_time_total / steps, e.count / steps) for e in prof.key_averages()}
    except Exception as exc:  # a report, not a result
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    ranked = sorted(stats.items(), key=lambda kv: -kv[1][0])[:top]
    return {"self_cpu_us_per_step": sum(v[0] for v in stats.values()),
            "ops": {k: {"self_cpu_us": round(us, 2), "calls": round(n, 2)} for k, (us, n) in ranked}}


def host_diff(torch_ops: dict, l2gen_ops: dict, top: int = 10) -> list[str]:
    """The operators whose host time per step differs most between the two eager variants."""
    a, b = torch_ops.get("ops", {}), l2gen_ops.get("ops", {})
    names = set(a) | set(b)
    delta = sorted(names, key=lambda k: -abs(b.get(k, {}).get("self_cpu_us", 0.0) - a.get(k, {}).get("self_cpu_us", 0.0)))
    out = [f"  host us/step: torch {torch_ops.get('self_cpu_us_per_step', 0):.0f}, l2gen {l2gen_ops.get('self_cpu_us_per_step', 0):.0f}"]
    for k in delta[:top]:
        ta, tb = a.get(k, {}), b.get(k, {})
        out.append(f"  {k[:60]:60s} torch {ta.get('self_cpu_us', 0):8.1f} us ({ta.get('calls', 0):5.1f} calls)"
                   f"  l2gen {tb.get('self_cpu_us', 0):8.1f} us ({tb.get('calls', 0):5.1f} calls)")
    return out


def capture(fn, warmup: int = 3):
    """A CUDA graph of ``fn()`` (after ``warmup`` calls on a side stream) and its outputs."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


class Decoder:
    """Greedy decode at one batch size: static token, position and cache buffers that
    the eager steps and a captured step share."""

    def __init__(self, model, prompt: torch.Tensor, new_tokens: int):
        self.model, self.prompt, self.steps = model, prompt, new_tokens
        batch, plen = prompt.shape
        device, dtype = prompt.device, model.lm_head.weight.dtype
        self.cache = KVCache(model.dims, batch, plen + new_tokens + 4, dtype=dtype, device=device)  # + warm-up steps
        self.zero = torch.zeros((), dtype=torch.long, device=device)
        self.tok = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.pos = torch.zeros((), dtype=torch.long, device=device)

    def prefill(self) -> torch.Tensor:
        logits = self.model(self.prompt, self.cache, self.zero, last_only=True)
        self.tok.copy_(logits[:, -1].argmax(-1, keepdim=True))
        self.pos.fill_(self.prompt.shape[1])
        return logits

    def step(self) -> torch.Tensor:
        logits = self.model(self.tok, self.cache, self.pos)
        self.tok.copy_(logits[:, -1].argmax(-1, keepdim=True))
        self.pos.add_(1)
        return logits


def lockstep_decode(model, prompt, new_tokens: int) -> dict:
    """torch and l2gen side by side, both fed torch's greedy tokens: the largest relative
    logits difference, the steps whose greedy tokens differ, torch's tokens."""
    ref, ours = Decoder(model, prompt, new_tokens), Decoder(model, prompt, new_tokens)
    worst, differ, tokens, first_logits = 0.0, 0, [], None

    def compare(ll, lt):
        nonlocal worst, differ
        worst = max(worst, rel_diff(ll[:, -1], lt[:, -1]))
        differ += int((ll[:, -1].argmax(-1) != lt[:, -1].argmax(-1)).any())
        ours.tok.copy_(ref.tok)  # teacher forcing: the next step of both reads torch's token

    lt = ref.prefill()
    with variant(model, "l2gen"):
        ll = ours.prefill()
    compare(ll, lt)
    for i in range(new_tokens):
        lt = ref.step()
        with variant(model, "l2gen"):
            ll = ours.step()
        compare(ll, lt)
        if i == 0:
            first_logits = lt[:, -1].clone()
        tokens.append(ref.tok.clone())
    return {"max_rel_logits": worst, "steps_with_other_tokens": differ, "tokens": torch.cat(tokens, 1),
            "first_step_logits": first_logits}


@contextmanager
def linear_shapes(model, into: set):
    """Add each Linear call's (M, N, K) to ``into``."""
    def note(layer, args):
        x = args[0]
        into.add((x.numel() // x.shape[-1], layer.out_features, layer.in_features))

    hooks = [m.register_forward_pre_hook(note) for m in model.modules() if isinstance(m, torch.nn.Linear)]
    try:
        yield
    finally:
        for h in hooks:
            h.remove()


def timed_decode(model, prompt, new_tokens: int, name: str, graphed: bool, ref: dict, clock: Clock,
                 host_steps: int = 0) -> dict:
    """One timed greedy decode (eager steps or replays of a captured step)."""
    dec = Decoder(model, prompt, new_tokens)
    with variant(model, name):
        if graphed:
            dec.prefill()
            graph, out = capture(dec.step)
            run = graph.replay

            def step():
                run()
                return out
        else:
            step = dec.step
            for _ in range(3):  # warm up
                dec.step()
        dec.prefill()
        first_rel = rel_diff(step()[:, -1], ref["first_step_logits"])
        dec.prefill()  # the timed run starts from the prompt again
        generated = torch.zeros(prompt.shape[0], new_tokens, dtype=torch.long, device=prompt.device)
        marks = []
        for i in range(new_tokens):
            a = clock.mark()
            step()
            b = clock.mark()
            generated[:, i] = dec.tok[:, 0]
            marks.append((a, b))
        clock.sync()
        profiled = host = None
        if not graphed:
            dec.prefill()  # from the prompt again: the profiled steps stay inside the cache
            profiled = gemm_time(model, dec.step, min(8, new_tokens), prompt.device)
            if host_steps:
                dec.prefill()
                host = host_ops(dec.step, min(host_steps, new_tokens), prompt.device)
    times = [clock.ms(a, b) for a, b in marks]
    total_s = clock.ms(marks[0][0], marks[-1][1]) / 1e3
    same = generated == ref["tokens"]
    diverged = None if bool(same.all()) else int((~same).any(0).nonzero()[0, 0])
    return {"step_ms": statistics.median(times), "step_ms_min": min(times), "step_ms_max": max(times),
            "tokens_per_s": prompt.shape[0] * new_tokens / total_s, "first_step_rel_logits": first_rel,
            "tokens_match_torch": diverged is None, "first_divergent_step": diverged, "profile": profiled,
            **({"host_ops": host} if host is not None else {})}


def lockstep_prefill(model, prompt) -> dict:
    cache = KVCache(model.dims, prompt.shape[0], prompt.shape[1], dtype=model.lm_head.weight.dtype, device=prompt.device)
    zero = torch.zeros((), dtype=torch.long, device=prompt.device)
    lt = model(prompt, cache, zero, last_only=True)
    with variant(model, "l2gen"):
        ll = model(prompt, cache, zero, last_only=True)
    return {"max_rel_logits": rel_diff(ll, lt), "steps_with_other_tokens": int((ll.argmax(-1) != lt.argmax(-1)).any()),
            "logits": lt}


def timed_prefill(model, prompt, name: str, graphed: bool, reps: int, ref: dict, clock: Clock) -> dict:
    cache = KVCache(model.dims, prompt.shape[0], prompt.shape[1], dtype=model.lm_head.weight.dtype, device=prompt.device)
    zero = torch.zeros((), dtype=torch.long, device=prompt.device)

    def forward():
        return model(prompt, cache, zero, last_only=True)

    with variant(model, name):
        if graphed:
            graph, out = capture(forward)

            def run():
                graph.replay()
                return out
        else:
            run = forward
            for _ in range(2):
                forward()
        first_rel = rel_diff(run(), ref["logits"])
        marks = []
        for _ in range(reps):
            a = clock.mark()
            run()
            marks.append((a, clock.mark()))
        clock.sync()
        profiled = gemm_time(model, forward, 2, prompt.device) if not graphed else None
    times = [clock.ms(a, b) for a, b in marks]
    return {"step_ms": statistics.median(times), "step_ms_min": min(times), "step_ms_max": max(times),
            "tokens_per_s": prompt.numel() / (statistics.median(times) / 1e3), "first_step_rel_logits": first_rel,
            "profile": profiled}


def _gemm_fields(row: dict, eager_profile: dict | None) -> None:
    """The GEMM time of the variant's eager profile, as shares of this row's step."""
    p = eager_profile or {}
    gemm = p.get("gemm_us")
    row["gemm_us_per_step"] = gemm
    row["gemm_share_of_kernels"] = p.get("share_of_kernels")
    # (on the CPU the profiled host time includes the profiler's own: no share of a step)
    row["gemm_share_of_step"] = None if gemm is None or p.get("kernel_us") is None else gemm / (row["step_ms"] * 1e3)
    if "error" in p:
        row["profile_error"] = p["error"]


def run_all(model, args, device: torch.device) -> dict:
    clock = Clock(device)
    graph_modes = [False] + ([True] if device.type == "cuda" and not args.no_graph else [])
    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    vocab = model.dims.vocab_size
    rows, checks, shapes = [], [], set()
    work = [("decode", b) for b in args.batches] + ([("prefill", 1)] if args.prefill else [])
    for phase, batch in work:
        plen = args.prompt if phase == "decode" else args.prefill
        prompt = torch.randint(0, vocab, (batch, plen), generator=gen).to(device)
        with torch.no_grad():
            with linear_shapes(model, shapes):
                ref = lockstep_decode(model, prompt, args.new_tokens) if phase == "decode" else lockstep_prefill(model, prompt)
            checks.append({"phase": phase, "batch": batch, "tokens": plen, "max_rel_logits": ref["max_rel_logits"],
                           "steps_with_other_tokens": ref["steps_with_other_tokens"]})
            profiles = {}
            for graphed in graph_modes:
                for name in ("torch", "l2gen", *(("l2gen+pdl",) if args.pdl else ())):
                    if phase == "decode":
                        r = timed_decode(model, prompt, args.new_tokens, name, graphed, ref, clock, args.host_profile)
                    else:
                        r = timed_prefill(model, prompt, name, graphed, args.reps, ref, clock)
                    if not graphed:
                        profiles[name] = r["profile"]
                    r.pop("profile")
                    row = {"phase": phase, "batch": batch, "tokens": plen, "variant": name, "mode": "graph" if graphed else "eager", **r}
                    _gemm_fields(row, profiles.get(name))
                    rows.append(row)
                    print(f"[e2e] {phase} batch {batch}: {name} {row['mode']}: {row['step_ms']:.3f} ms/step", file=sys.stderr, flush=True)
            eager = {r["variant"]: r for r in rows if r["phase"] == phase and r["batch"] == batch and r["mode"] == "eager"}
            if all("host_ops" in eager.get(v, {}) for v in ("torch", "l2gen")):
                lines = host_diff(eager["torch"]["host_ops"], eager["l2gen"]["host_ops"])
                print(f"[e2e] {phase} batch {batch}: eager host time, l2gen against torch\n" + "\n".join(lines), file=sys.stderr, flush=True)
    return {"rows": rows, "checks": checks, "shapes": sorted(shapes)}


def served(shapes) -> dict:
    """Which program serves each Linear shape (M, N, K) through l2gen's nn.Linear path."""
    from l2gen.dispatch import dispatcher
    from l2gen.ir import BLayout

    d = dispatcher(b_layout=BLayout.NK)
    by = {f"{m}x{n}x{k}": d.served_by(m, n, k) for m, n, k in shapes}
    return {"db": str(getattr(d.db, "path", None) or "none"), "trusted_l2": d.l2, "by_shape": by,
            "served_by_l2gen": sum(v not in ("fallback", "unprepared") for v in by.values()), "shapes": len(by)}


def table(results: dict) -> str:
    head = ["phase", "batch", "variant", "mode", "ms/step", "tokens/s", "GEMM % step", "rel logits", "tokens"]
    lines = []
    for r in results["rows"]:
        share = r["gemm_share_of_step"]
        tok = "-" if r["phase"] == "prefill" else ("same" if r["tokens_match_torch"] else f"differ@{r['first_divergent_step']}")
        lines.append([r["phase"], str(r["batch"]), r["variant"], r["mode"], f"{r['step_ms']:.3f}", f"{r['tokens_per_s']:.0f}",
                      "-" if share is None else f"{100 * share:.0f}", f"{r['first_step_rel_logits']:.1e}", tok])
    widths = [max(len(x) for x in col) for col in zip(head, *lines)]
    out = ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in [head] + lines]
    for c in results["checks"]:
        out.append(f"{c['phase']} batch {c['batch']}: max rel logits l2gen vs torch {c['max_rel_logits']:.2e} "
                   f"(tolerance {results['tolerance']:g}); steps whose greedy token differs: {c['steps_with_other_tokens']}")
    s = results["served"]
    out.append(f"{s['served_by_l2gen']} of {s['shapes']} Linear shapes served by l2gen kernels (db {s['db']}, l2 {s['trusted_l2']}); "
               "the rest by torch")
    return "\n".join(out)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama3.1-8b", help="a built-in name or a transformers config.json (default llama3.1-8b)")
    p.add_argument("--layers", type=int, default=2, help="decoder layers (default 2)")
    p.add_argument("--new-tokens", type=int, default=128, help="greedy decode steps per batch size")
    p.add_argument("--prompt", type=int, default=16, help="prompt tokens prefilled before each decode")
    p.add_argument("--batches", type=parse_tokens, default=[1, 16, 64], help="decode batch sizes (default 1,16,64)")
    p.add_argument("--prefill", type=int, default=2048, help="tokens of the batch-1 prefill (0: none)")
    p.add_argument("--reps", type=int, default=10, help="timed prefills per variant and mode")
    p.add_argument("--tolerance", type=float, default=1e-2, help="largest max-relative logits difference accepted")
    p.add_argument("--db", help="kernel database for l2gen (default: $L2GEN_DB or the shipped one)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=("fp16", "fp32"), default="fp16")
    p.add_argument("--device", default="cuda", help="cuda (default), or cpu to test the script itself at tiny sizes (no graphs)")
    p.add_argument("--no-graph", action="store_true", help="skip the CUDA graph runs")
    p.add_argument("--pdl", action="store_true",
                   help="also run l2gen with its own kernels launched with programmatic dependent launch (variant l2gen+pdl)")
    p.add_argument("--host-profile", type=int, default=0, metavar="STEPS",
                   help="profile STEPS eager decode steps of each variant on the host (torch.profiler, CPU): the operators "
                        "whose time differs most are printed, the top ones of each saved (default 0: none)")
    p.add_argument("--out", default="e2e-llama.json", help="results JSON")
    args = p.parse_args(argv)
    for name in ("layers", "new_tokens", "prompt", "reps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.prefill < 0:
        p.error("--prefill must be at least 0")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("e2e_llama: needs a CUDA GPU (torch.cuda.is_available() is False); --device cpu tests the script", file=sys.stderr)
        return 2
    try:
        dims = model_dims(args.model)
    except DiagnosticError as exc:
        print(f"e2e_llama: {exc}", file=sys.stderr)
        return 2
    dims = dataclasses.replace(dims, num_hidden_layers=args.layers or dims.num_hidden_layers)
    if args.db:
        from l2gen.dispatch import use_db

        global DB
        DB = args.db
        use_db(args.db)
    dtype = torch.float16 if args.dtype == "fp16" else torch.float32
    if dtype is not torch.float16:
        print("e2e_llama: l2gen serves fp16 Linear layers only: with --dtype fp32 the l2gen runs are torch's", file=sys.stderr)
    max_positions = max(args.prompt + args.new_tokens + 4, args.prefill)
    model = build(dims, seed=args.seed, dtype=dtype, device=device, max_positions=max_positions)
    start = time.time()
    results = run_all(model, args, device)
    results["served"] = served(results.pop("shapes"))
    results = {
        "command": " ".join(["python3", "bench/e2e_llama.py"] + list(sys.argv[1:] if argv is None else argv)),
        "commit": os.environ.get("L2GEN_COMMIT") or None,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__, "python": platform.python_version(),
        "model": args.model, "config": {**dataclasses.asdict(dims), "dtype": args.dtype}, "seed": args.seed,
        "new_tokens": args.new_tokens, "prompt": args.prompt, "tolerance": args.tolerance,
        "seconds": round(time.time() - start, 1), **results,
    }
    ok = all(c["max_rel_logits"] <= args.tolerance for c in results["checks"])
    ok &= all(r["first_step_rel_logits"] <= args.tolerance for r in results["rows"])
    results["ok"] = ok
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    print(table(results))
    print(f"results: {args.out}" + ("" if ok else f"  FAILED: a logits difference above {args.tolerance:g}"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
