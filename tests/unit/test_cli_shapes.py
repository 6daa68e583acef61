"""``l2gen shapes`` (a table; a suite file that bench and tune read back) and ``l2gen tune
--shapes-from`` (the model's shapes tuned as nk, on the simulator here), with their
errors."""

from __future__ import annotations

import json

import pytest

from l2gen.cli import main
from l2gen.cli.run import load_suite, suite_layout
from l2gen.db import KernelDB
from l2gen.problem import Shape
from l2gen.targets import GPUS

LLAMA_8B_16 = [Shape(16, 6144, 4096), Shape(16, 4096, 4096), Shape(16, 28672, 4096), Shape(16, 4096, 14336), Shape(16, 128256, 4096)]


def test_shapes_prints_a_table_of_the_models_gemms(capsys):
    assert main(["shapes", "llama3.1-8b", "--tokens", "16"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("llama3.1-8b: 5 GEMM shapes (B stored N x K)")
    line = next(x for x in out.splitlines() if "qkv_proj" in x)
    assert line.split()[:5] == ["16", "16", "6144", "4096", "32"]


def test_the_json_is_a_suite_that_bench_and_tune_read(tmp_path, capsys):
    path = tmp_path / "llama.json"
    assert main(["shapes", "llama3.1-8b", "--tokens", "16", "--json", "-o", str(path)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(path.read_text())
    assert load_suite(str(path)) == LLAMA_8B_16 and suite_layout(str(path)) == "nk"
    assert printed["shapes"][0]["layers"] == ["model.layers.*.self_attn.qkv_proj"] and printed["shapes"][0]["count"] == 32


def test_shapes_of_a_sharded_unfused_config_file(tmp_path, capsys):
    config = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
              "num_hidden_layers": 32, "vocab_size": 128256}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert main(["shapes", str(tmp_path), "--tokens", "1", "--tp", "2", "--unfused", "--no-lm-head", "--json"]) == 0
    shapes = {(e["n"], e["k"]): e for e in json.loads(capsys.readouterr().out)["shapes"]}
    assert set(shapes) == {(2048, 4096), (512, 4096), (4096, 2048), (7168, 4096), (4096, 7168)}
    assert shapes[(512, 4096)]["layers"] == ["model.layers.*.self_attn.k_proj", "model.layers.*.self_attn.v_proj"]


def test_a_bad_config_is_an_error_at_its_line(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text('{\n "hidden_size": 4096,\n "intermediate_size": 0,\n "num_attention_heads": 32,\n'
                    ' "num_hidden_layers": 2,\n "vocab_size": 100\n}')
    assert main(["shapes", str(path), "--tokens", "1"]) == 1
    assert capsys.readouterr().err.strip() == f"{path}:3:2: E-CONFIG: 'intermediate_size' must be positive, got 0"


@pytest.mark.parametrize("argv, code, message", [
    (["shapes", "llama3.1-8b", "--tokens", "0"], 2, "is not a positive integer"),
    (["shapes", "llama3.1-8b"], 2, "--tokens"),
    (["shapes", "gpt-17", "--tokens", "1"], 1, "E-MODEL: no model 'gpt-17'"),
    (["shapes", "llama3.1-8b", "--tokens", "1", "--tp", "3"], 1, "E-TP"),
    (["tune", "--shapes-from", "llama3.1-8b", "--simulate"], 2, "--shapes-from needs --tokens"),
    (["tune", "--shape", "16x16x16", "--tokens", "16", "--simulate"], 2, "--tokens without --shapes-from"),
    (["tune", "--shapes-from", "llama3.1-8b", "--tokens", "16", "--b", "kn", "--simulate"], 2, "the B layouts disagree"),
])
def test_usage_errors(argv, code, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == code
    assert message in capsys.readouterr().err


def test_tune_shapes_from_a_model_tunes_its_shapes_as_nk(tmp_path, capsys):
    db = tmp_path / "k.db"
    assert main(["tune", "--shapes-from", "llama3.1-8b", "--tokens", "16", "--simulate", "--budget", "2", "--batch", "2",
                 "--policy", "random", "--db", str(db)]) == 0
    assert "llama3.1-8b: 5 GEMM shapes of its Linear layers at 16 tokens" in capsys.readouterr().err
    with KernelDB(db, readonly=True) as kdb:
        assert kdb.shapes(GPUS["h200"]) == sorted(LLAMA_8B_16)
        layouts = {m.program.b_layout.value for s in LLAMA_8B_16 for m in kdb.history(GPUS["h200"], s)}
    assert layouts == {"nk"}


def test_tune_skips_a_model_shape_no_program_serves(tmp_path, capsys):
    config = {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, "num_hidden_layers": 1, "vocab_size": 1001}
    (tmp_path / "config.json").write_text(json.dumps(config))
    db = tmp_path / "k.db"
    assert main(["tune", "--shapes-from", str(tmp_path / "config.json"), "--tokens", "4", "--simulate", "--budget", "1",
                 "--batch", "1", "--policy", "random", "--db", str(db)]) == 0
    err = capsys.readouterr().err
    assert "lm_head at 4 tokens: skipped" in err and "N = 1001 is not a multiple of 8" in err
    with KernelDB(db, readonly=True) as kdb:
        assert Shape(4, 1001, 64) not in kdb.shapes(GPUS["h200"]) and Shape(4, 192, 64) in kdb.shapes(GPUS["h200"])
