"""The end-to-end benchmark's model and script on the CPU: a decode with the KV cache
computes what a full recompute does, the prefill's last logits are the full forward's,
and the script runs its steps (at tiny sizes, through l2gen.patch) and writes its
results; without a GPU it says so."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from l2gen.model_shapes import ModelDims

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
TINY = {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "vocab_size": 256, "num_hidden_layers": 2}


def _load(name: str):
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="module")
def lm():
    return _load("llama_model")


def _run_tiny(tmp_path, *options) -> tuple[int, Path]:
    """The script on the CPU over the tiny model, decoding 3 tokens after a 4-token prompt:
    its exit code and its results file."""
    e2e = _load("e2e_llama")
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY))
    out = tmp_path / "e2e.json"
    rc = e2e.main(["--model", str(config), "--device", "cpu", "--new-tokens", "3", "--prompt", "4", *options, "--out", str(out)])
    return rc, out


def _tiny(lm, dtype=torch.float32, seed=0):
    config = ModelDims("tiny", **TINY)
    return config, lm.build(config, seed=seed, dtype=dtype, device="cpu", max_positions=64)


def test_decode_with_the_cache_equals_a_full_recompute(lm):
    config, model = _tiny(lm)
    prompt = torch.randint(0, config.vocab_size, (3, 5), generator=torch.Generator().manual_seed(1))
    cache = lm.KVCache(config, 3, 16, dtype=torch.float32, device="cpu")
    seq = prompt
    with torch.no_grad():
        logits = model(prompt, cache, torch.tensor(0))
        assert torch.allclose(logits, model(prompt), atol=1e-5)
        pos = torch.tensor(prompt.shape[1])
        for _ in range(6):
            token = logits[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, token], 1)
            logits = model(token, cache, pos)
            pos += 1  # in place, as a captured step advances it
            assert torch.allclose(logits, model(seq)[:, -1:], atol=1e-5, rtol=1e-4)
    assert seq.shape == (3, 11)


def test_a_prefill_computes_the_last_tokens_logits_of_the_full_forward(lm):
    config, model = _tiny(lm)
    tokens = torch.randint(0, config.vocab_size, (2, 9))
    cache = lm.KVCache(config, 2, 9, dtype=torch.float32, device="cpu")
    with torch.no_grad():
        last = model(tokens, cache, torch.tensor(0), last_only=True)
        assert last.shape == (2, 1, config.vocab_size)
        assert torch.allclose(last, model(tokens)[:, -1:], atol=1e-5)


def test_weights_are_seeded_and_named_as_transformers_names_them(lm):
    _, a = _tiny(lm, seed=3)
    _, b = _tiny(lm, seed=3)
    _, c = _tiny(lm, seed=4)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)
    names = {n for n, m in a.named_modules() if isinstance(m, torch.nn.Linear)}
    assert "model.layers.1.self_attn.qkv_proj" in names and "model.layers.0.mlp.gate_up_proj" in names and "lm_head" in names


def test_the_script_runs_every_step_on_the_cpu_and_writes_its_results(tmp_path, capsys):
    rc, out = _run_tiny(tmp_path, "--batches", "1,2", "--prefill", "8", "--reps", "1")
    assert rc == 0
    results = json.loads(out.read_text())
    rows = results["rows"]
    assert [(r["phase"], r["batch"], r["variant"], r["mode"]) for r in rows] == [
        ("decode", 1, "torch", "eager"), ("decode", 1, "l2gen", "eager"), ("decode", 2, "torch", "eager"),
        ("decode", 2, "l2gen", "eager"), ("prefill", 1, "torch", "eager"), ("prefill", 1, "l2gen", "eager")]
    for r in rows:
        assert r["step_ms"] > 0 and r["tokens_per_s"] > 0 and r["gemm_us_per_step"] > 0
        assert r["first_step_rel_logits"] == 0.0  # on the CPU the patched layers compute what torch does
    assert all(r["tokens_match_torch"] for r in rows if r["phase"] == "decode")
    assert [c["max_rel_logits"] for c in results["checks"]] == [0.0, 0.0, 0.0] and results["ok"]
    assert results["config"]["num_hidden_layers"] == 2 and results["config"]["dtype"] == "fp16"
    # every Linear shape of the runs, none served by an l2gen kernel on the CPU
    served = results["served"]
    assert "2x256x64" in served["by_shape"] and "8x192x64" in served["by_shape"] and served["served_by_l2gen"] == 0
    printed = capsys.readouterr().out
    assert "rel logits" in printed.splitlines()[0] and f"results: {out}" in printed


def test_the_host_profile_names_each_eager_decodes_operators(tmp_path, capsys):
    rc, out = _run_tiny(tmp_path, "--batches", "1", "--prefill", "0", "--host-profile", "2")
    assert rc == 0
    rows = json.loads(out.read_text())["rows"]
    for r in rows:  # every eager decode row has its operators, the matrix products among them
        ops = r["host_ops"]["ops"]
        assert r["host_ops"]["self_cpu_us_per_step"] > 0 and ops["aten::mm"]["calls"] > 0
    assert "eager host time, l2gen against torch" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is present")
def test_without_a_gpu_the_script_says_so(tmp_path, capsys):
    e2e = _load("e2e_llama")
    assert e2e.main(["--out", str(tmp_path / "x.json")]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_a_bad_model_is_refused_before_anything_runs(tmp_path, capsys):
    e2e = _load("e2e_llama")
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**TINY, "hidden_size": -1}))
    assert e2e.main(["--model", str(config), "--device", "cpu", "--out", str(tmp_path / "x.json")]) == 2
    assert "E-CONFIG: 'hidden_size' must be positive" in capsys.readouterr().err


def test_pdl_adds_a_variant_and_puts_the_default_dispatchers_back(tmp_path, monkeypatch):
    from l2gen import dispatch

    monkeypatch.delenv("L2GEN_PDL", raising=False)
    rc, out = _run_tiny(tmp_path, "--batches", "1", "--prefill", "0", "--pdl")
    assert rc == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["variant"] for r in rows] == ["torch", "l2gen", "l2gen+pdl"]
    assert all(r["tokens_match_torch"] for r in rows)
    assert dispatch.dispatcher(b_layout=dispatch.BLayout.NK).pdl is False  # the default again after the run
