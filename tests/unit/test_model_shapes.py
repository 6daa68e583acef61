"""A model's GEMM shapes: from transformers-style configs (known dimensions give the
known shapes, tensor parallelism, errors at the key's line), and from one traced forward
pass of a module (hooks on nn.Linear; the meta device)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from l2gen.diagnostics import DiagnosticError
from l2gen.cli.model import resolve_model
from l2gen.model_shapes import BUILTIN, ModelShape, config_shapes, dims_from_config, load_config, parse_tokens

ROOT = Path(__file__).resolve().parents[2]

LLAMA_8B_CONFIG = {  # the keys of meta-llama/Llama-3.1-8B's config.json that matter here, and some that do not
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 128256,
    "rope_theta": 500000.0, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
}


def _by_shape(shapes):
    return {(s.m, s.n, s.k): s for s in shapes}


def _error(exc_info) -> str:
    return "\n".join(str(d) for d in exc_info.value.diagnostics)


def test_llama_8b_at_16_tokens_has_the_published_projection_shapes():
    shapes = _by_shape(config_shapes(BUILTIN["llama3.1-8b"], [16]))
    assert shapes[(16, 6144, 4096)].layers == ("model.layers.*.self_attn.qkv_proj",)
    assert shapes[(16, 6144, 4096)].count == 32
    assert shapes[(16, 4096, 4096)].layers == ("model.layers.*.self_attn.o_proj",)
    assert shapes[(16, 28672, 4096)].layers == ("model.layers.*.mlp.gate_up_proj",)
    assert shapes[(16, 4096, 14336)].layers == ("model.layers.*.mlp.down_proj",)
    assert shapes[(16, 128256, 4096)] == ModelShape(16, 128256, 4096, ("lm_head",), 1, 16)
    assert len(shapes) == 5 and all(s.b == "nk" for s in shapes.values())


def test_a_config_dict_gives_what_the_built_in_name_gives():
    dims = dims_from_config(LLAMA_8B_CONFIG, "llama3.1-8b")
    assert dims == BUILTIN["llama3.1-8b"]  # head_dim derived as hidden / heads


@pytest.mark.parametrize("model, tp", [("llama3.1-8b", 1), ("qwen2.5-7b", 1), ("llama3.1-70b", 8)])
def test_built_in_models_give_the_llm_suite_shapes(model, tp):
    label = model if tp == 1 else f"{model}-tp{tp}"
    suite = [e for e in json.loads((ROOT / "suites" / "llm.json").read_text())["shapes"] if e["model"] == label]
    tokens = sorted({e["m"] for e in suite})
    got = config_shapes(BUILTIN[model], tokens, tp=tp, lm_head=False)
    assert {(s.m, s.n, s.k) for s in got} == {(e["m"], e["n"], e["k"]) for e in suite}


def test_unfused_projections_share_shapes_and_add_their_counts():
    shapes = _by_shape(config_shapes(BUILTIN["llama3.1-8b"], [1], fused=False, lm_head=False))
    kv = shapes[(1, 1024, 4096)]
    assert kv.layers == ("model.layers.*.self_attn.k_proj", "model.layers.*.self_attn.v_proj") and kv.count == 64
    assert shapes[(1, 14336, 4096)].count == 64  # gate and up
    assert shapes[(1, 4096, 4096)].layers == ("model.layers.*.self_attn.q_proj", "model.layers.*.self_attn.o_proj")
    assert shapes[(1, 4096, 4096)].count == 64


def test_tensor_parallel_splits_columns_and_rows_and_replicates_few_kv_heads():
    shapes = _by_shape(config_shapes(BUILTIN["qwen2.5-7b"], [1], tp=4))
    assert (1, (7 + 2 * 1) * 128, 3584) in shapes  # 28/4 query heads; 4 kv heads: one per rank
    assert (1, 3584, 7 * 128) in shapes and (1, 2 * 18944 // 4, 3584) in shapes and (1, 3584, 18944 // 4) in shapes
    assert (1, 152064 // 4, 3584) in shapes
    replicated = _by_shape(config_shapes(BUILTIN["llama3.1-8b"], [1], tp=16, lm_head=False))
    assert (1, (2 + 2) * 128, 4096) in replicated  # 8 kv heads over 16 ranks: one each
    with pytest.raises(DiagnosticError) as exc:
        config_shapes(BUILTIN["qwen2.5-7b"], [1], tp=3)
    assert "E-TP" in _error(exc) and "num_attention_heads (28)" in _error(exc)


def test_a_config_json_file_or_its_directory(tmp_path):
    config = {"text_config": {**LLAMA_8B_CONFIG, "head_dim": 128}, "model_type": "mllama"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert load_config(tmp_path) == replace(BUILTIN["llama3.1-8b"], name=tmp_path.name)
    label, shapes = resolve_model(str(tmp_path / "config.json"), [16])
    assert label == tmp_path.name and (16, 6144, 4096) in _by_shape(shapes)
    no_kv = {k: v for k, v in LLAMA_8B_CONFIG.items() if k != "num_key_value_heads"}
    assert dims_from_config(no_kv).num_key_value_heads == 32  # transformers' default: one kv head per head


def _bad(tmp_path, **changes):
    config = {**LLAMA_8B_CONFIG, **changes}
    config = {k: v for k, v in config.items() if v is not ...}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config, indent=2))
    with pytest.raises(DiagnosticError) as exc:
        load_config(path)
    return _error(exc), path


def _line_of(path: Path, key: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if f'"{key}"' in line)


def test_a_missing_size_names_the_key_and_the_file(tmp_path):
    text, path = _bad(tmp_path, intermediate_size=...)
    assert text.startswith(f"{path}:1:1: E-CONFIG: 'intermediate_size' is missing")


@pytest.mark.parametrize("key, value, message", [
    ("hidden_size", 0, "'hidden_size' must be positive, got 0"),
    ("num_hidden_layers", -2, "'num_hidden_layers' must be positive, got -2"),
    ("vocab_size", "128256", "'vocab_size' must be an integer, got \"128256\""),
    ("num_attention_heads", 4.0, "'num_attention_heads' must be an integer"),
    ("num_key_value_heads", 5, "num_attention_heads (32) is not a multiple of num_key_value_heads (5)"),
])
def test_a_bad_size_is_reported_at_its_line(tmp_path, key, value, message):
    text, path = _bad(tmp_path, **{key: value})
    assert f"{path}:{_line_of(path, key)}:3: E-CONFIG: {message}" in text


def test_a_mixture_of_experts_config_is_refused_with_a_way_out(tmp_path):
    text, path = _bad(tmp_path, num_local_experts=8)
    assert f"{path}:{_line_of(path, 'num_local_experts')}:3: E-CONFIG" in text and "trace the model" in text


def test_a_file_that_is_not_json_is_reported_at_the_fault(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{\n  "hidden_size": 4096,\n  oops\n}')
    with pytest.raises(DiagnosticError) as exc:
        load_config(path)
    assert _error(exc).startswith(f"{path}:3:3: E-CONFIG: not JSON")


def test_an_unknown_model_lists_what_is_known():
    with pytest.raises(DiagnosticError) as exc:
        resolve_model("no-such-model", [1])
    assert "E-MODEL" in _error(exc) and "llama3.1-8b" in _error(exc)


def test_token_counts():
    assert parse_tokens("1, 16,64,16") == [1, 16, 64]
    for bad in ("", "0", "1,-2", "x", "1,,2", "1.5"):
        with pytest.raises(ValueError):
            parse_tokens(bad)


# -- traced ---------------------------------------------------------------------------------

torch = pytest.importorskip("torch")
nn = torch.nn


class TwoTowers(nn.Module):
    """Linear layers in a stack (indices become *), one shared under two names, one
    called twice per forward, and a Linear subclass: every call is a GEMM."""

    class Sub(nn.Linear):
        pass

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32)) for _ in range(3))
        self.shared = nn.Linear(32, 32, bias=False)
        self.alias = self.shared
        self.head = self.Sub(32, 10)

    def example_inputs(self, tokens):
        return (torch.zeros(2, tokens, 32),)  # batch 2: M is 2 x tokens

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(self.alias(self.shared(x)))


def two_towers():
    return TwoTowers()


def test_a_traced_forward_gives_each_linear_calls_shape_and_count():
    from l2gen.model_trace import trace_shapes

    shapes = _by_shape(trace_shapes(TwoTowers(), [8]))
    assert shapes[(16, 64, 32)] == ModelShape(16, 64, 32, ("blocks.*.*",), 3, 8)  # every index reads *
    assert shapes[(16, 32, 64)] == ModelShape(16, 32, 64, ("blocks.*.*",), 3, 8)
    assert shapes[(16, 32, 32)] == ModelShape(16, 32, 32, ("shared",), 2, 8)
    assert shapes[(16, 10, 32)].layers == ("head",)
    assert len(shapes) == 4


def test_an_import_path_is_built_and_traced_on_the_meta_device():
    label, shapes = resolve_model(f"{__name__}:two_towers", [1, 4])
    assert label == f"{__name__}:two_towers"
    assert {(s.m, s.n, s.k) for s in shapes} >= {(2, 64, 32), (8, 64, 32)}


def _llama_factory():
    import importlib.util

    import sys

    if "llama_model" not in sys.modules:
        spec = importlib.util.spec_from_file_location("llama_model", ROOT / "bench" / "llama_model.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["llama_model"] = module
        spec.loader.exec_module(module)
    return sys.modules["llama_model"]


def llama_8b_two_layers():
    lm = _llama_factory()
    return lm.LlamaForCausalLM(replace(BUILTIN["llama3.1-8b"], num_hidden_layers=2), max_positions=64)


def test_the_e2e_model_traced_on_meta_has_exactly_its_configs_shapes():
    """The benchmark's model at Llama-3.1-8B's dimensions (no memory for its weights on
    the meta device): its traced GEMMs are what the config gives for two layers."""
    _, traced = resolve_model(f"{__name__}:llama_8b_two_layers", [1, 16])
    assert traced == config_shapes(replace(BUILTIN["llama3.1-8b"], num_hidden_layers=2), [1, 16])


def not_a_module():
    return 42


def fails():
    raise RuntimeError("no weights here")


@pytest.mark.parametrize("spec, message", [
    ("no_such_package_xyz.mod:f", "cannot import no_such_package_xyz.mod"),
    (f"{__name__}:missing", f"{__name__} has no attribute missing"),
    (f"{__name__}:ROOT", "ROOT is not callable"),
    (f"{__name__}:not_a_module", "is a int, not a torch.nn.Module"),
    (f"{__name__}:fails", "fails() failed on the meta device: RuntimeError: no weights here"),
    (f"{__name__}:two_towers.bad", "has no attribute two_towers.bad"),
])
def test_a_model_that_cannot_be_traced_is_an_error_naming_it(spec, message):
    with pytest.raises(DiagnosticError) as exc:
        resolve_model(spec, [4])
    assert "E-MODEL" in _error(exc) and message in _error(exc)


def test_a_forward_that_fails_names_the_token_count():
    from l2gen.model_trace import trace_shapes

    with pytest.raises(DiagnosticError) as exc:
        trace_shapes(nn.Sequential(nn.Linear(8, 8)), [3])  # takes floats, given token ids
    assert "the forward at 3 tokens failed" in _error(exc)


def test_a_traced_model_takes_no_tensor_parallel_degree():
    with pytest.raises(DiagnosticError) as exc:
        resolve_model(f"{__name__}:two_towers", [4], tp=2)
    assert "E-TP" in _error(exc)


def test_a_module_in_the_working_directory_is_found_as_the_l2gen_command_runs(tmp_path, monkeypatch):
    (tmp_path / "my_models_for_l2gen.py").write_text(
        "import torch\n\ndef build():\n    return torch.nn.Sequential(torch.nn.Embedding(10, 16), torch.nn.Linear(16, 24))\n")
    monkeypatch.chdir(tmp_path)
    import os
    import sys

    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", os.getcwd())])  # as the console script starts
    _, shapes = resolve_model("my_models_for_l2gen:build", [5])
    assert shapes == [ModelShape(5, 24, 16, ("*",), 1, 5)]  # (a Sequential's index reads * too)
