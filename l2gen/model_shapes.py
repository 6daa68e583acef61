"""The GEMM shapes of a model's ``nn.Linear`` layers at given token counts.

A Llama-style decoder's Linear layers are ``y[M, N] = x[M, K] @ W[N, K].T`` (B stored
N x K: layout ``nk``) with M the tokens of one forward (a decode batch, or a prefill
chunk). Their N and K follow from a few sizes of the model's ``transformers`` config
(:class:`ModelDims`), read here from a ``config.json`` without importing
``transformers``, or from a built-in name (:data:`BUILTIN`, the published dimensions).
A model that is not Llama-style is traced instead (:mod:`l2gen.model_trace`): one
forward pass with hooks on its Linear layers. :func:`l2gen.cli.model.resolve_model` takes
either, as the ``l2gen shapes`` and ``l2gen tune --shapes-from`` commands do.

The layers are named as the models name their modules, fused as vLLM runs them
(``qkv_proj``, ``gate_up_proj``) or one per projection as ``transformers`` does
(``q_proj``, ``k_proj``, ..., ``up_proj``); layer indices read ``*``. With a
tensor-parallel degree ``tp`` each rank's shapes are given: the column-parallel layers
(qkv, gate_up, lm_head) split N, the row-parallel ones (o, down) split K, and key/value
heads fewer than ``tp`` are replicated, as vLLM does.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from .diagnostics import Diagnostic, DiagnosticError
from .ir import NOWHERE, Span
from .problem import Shape, unserved

__all__ = ["BUILTIN", "ModelDims", "ModelShape", "config_shapes", "dims_from_config", "load_config", "merge", "model_dims", "model_label",
           "parse_tokens", "suite_json"]

# The config keys a Llama-style model is read from; the ones in _OPTIONAL have defaults.
_REQUIRED = ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers", "vocab_size")
_OPTIONAL = ("num_key_value_heads", "head_dim")
_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")


@dataclass(frozen=True)
class ModelDims:
    """The sizes of a Llama-style decoder that fix its Linear layers' shapes."""

    name: str
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    num_hidden_layers: int


@dataclass(frozen=True)
class ModelShape:
    """One GEMM shape of a model's forward: ``count`` calls of it per forward of
    ``tokens`` tokens, by the layers named in ``layers``; B stored N x K."""

    m: int
    n: int
    k: int
    layers: tuple[str, ...]
    count: int
    tokens: int

    b = "nk"

    @property
    def shape(self) -> Shape:
        return Shape(self.m, self.n, self.k)

    def to_dict(self, model: str) -> dict:
        """The shape as a suite entry (what :func:`l2gen.cli.run.load_suite` reads)."""
        return {"m": self.m, "n": self.n, "k": self.k, "b": self.b, "model": model, "tokens": self.tokens,
                "layers": list(self.layers), "count": self.count}


# Published dimensions (each model's config.json on the Hugging Face hub).
BUILTIN: dict[str, ModelDims] = {d.name: d for d in (
    ModelDims("llama3.1-8b", 4096, 14336, 32, 8, 128, 128256, 32),
    ModelDims("llama3.1-70b", 8192, 28672, 64, 8, 128, 128256, 80),
    ModelDims("mistral-7b", 4096, 14336, 32, 8, 128, 32768, 32),
    ModelDims("qwen2.5-7b", 3584, 18944, 28, 4, 128, 152064, 28),
    ModelDims("qwen2.5-72b", 8192, 29568, 64, 8, 128, 152064, 80),
)}


def _error(message: str, where: Span = NOWHERE, code: str = "E-CONFIG") -> DiagnosticError:
    return DiagnosticError([Diagnostic(code, message, where)])


def _key_span(text: str | None, path: str, key: str) -> Span:
    """Where ``"key":`` first appears in a config's text (the file itself if not found)."""
    if text is not None:
        match = re.search(r'"%s"\s*:' % re.escape(key), text)
        if match:
            line = text.count("\n", 0, match.start()) + 1
            col = match.start() - (text.rfind("\n", 0, match.start()) + 1) + 1
            return Span(path, line, col)
    return Span(path)


def dims_from_config(config: dict, name: str = "model", *, where: str = "<config>", text: str | None = None) -> ModelDims:
    """A Llama-style model's sizes from a ``transformers`` config dict (a multimodal
    config's ``text_config`` if the sizes live there). ``num_key_value_heads`` defaults
    to the attention heads and ``head_dim`` to hidden_size / heads, as in
    ``transformers``. Raises :class:`~l2gen.diagnostics.DiagnosticError` (E-CONFIG) at
    the key's line in ``where`` (``text``: the file's text) for a missing or bad size."""
    if not isinstance(config, dict):
        raise _error(f"a model config is a JSON object, not {type(config).__name__}", Span(where))
    if "hidden_size" not in config and isinstance(config.get("text_config"), dict):
        config = config["text_config"]
    for key in _MOE_KEYS:
        experts = config.get(key)
        if isinstance(experts, int) and not isinstance(experts, bool) and experts > 0:
            raise _error(f"'{key}' is {experts}: a mixture-of-experts model's expert layers are not one Linear per "
                         "layer; trace the model instead (MODEL as pkg.module:factory)", _key_span(text, where, key))
    values = {}
    for key in _REQUIRED + _OPTIONAL:
        value = config.get(key)
        if value is None:
            if key in _OPTIONAL:
                continue
            raise _error(f"'{key}' is missing (a Llama-style config needs {', '.join(_REQUIRED)})", Span(where))
        if isinstance(value, bool) or not isinstance(value, int):
            raise _error(f"'{key}' must be an integer, got {json.dumps(value)[:40]}", _key_span(text, where, key))
        if value <= 0:
            raise _error(f"'{key}' must be positive, got {value}", _key_span(text, where, key))
        values[key] = value
    heads = values["num_attention_heads"]
    kv = values.get("num_key_value_heads", heads)
    if heads % kv:
        raise _error(f"num_attention_heads ({heads}) is not a multiple of num_key_value_heads ({kv})",
                     _key_span(text, where, "num_key_value_heads"))
    head_dim = values.get("head_dim")
    if head_dim is None:
        if values["hidden_size"] % heads:
            raise _error(f"hidden_size ({values['hidden_size']}) is not a multiple of num_attention_heads ({heads}), "
                         "and there is no head_dim", _key_span(text, where, "hidden_size"))
        head_dim = values["hidden_size"] // heads
    return ModelDims(name, values["hidden_size"], values["intermediate_size"], heads, kv, head_dim, values["vocab_size"],
                     values["num_hidden_layers"])


def load_config(path: str | Path) -> ModelDims:
    """:func:`dims_from_config` of a ``config.json`` (or of the one in a directory),
    named after its directory. Errors carry the file and line (E-CONFIG)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    where = str(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise _error(f"cannot read the model config: {exc}", Span(where)) from None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _error(f"not JSON: {exc.msg}", Span(where, exc.lineno, exc.colno)) from None
    except (ValueError, RecursionError) as exc:
        raise _error(f"not a usable JSON file: {str(exc)[:200]}", Span(where)) from None
    name = path.parent.name or path.stem
    return dims_from_config(config, name, where=where, text=text)


def _split(value: int, tp: int, what: str, name: str) -> int:
    if value % tp:
        raise _error(f"{name}: {what} ({value}) does not split over {tp} tensor-parallel ranks", code="E-TP")
    return value // tp


def config_shapes(dims: ModelDims, tokens: Sequence[int], *, tp: int = 1, fused: bool = True, lm_head: bool = True) -> list[ModelShape]:
    """The Linear layers' shapes of one forward of ``dims``'s model at each token count,
    per tensor-parallel rank; merged where two layers share a shape
    (:func:`merge`). ``fused``: qkv and gate_up as one layer each (vLLM), else one per
    projection (``transformers``). ``lm_head``: include the output projection (on every
    token of the forward, as ``transformers`` computes it). E-TP where a size does not
    split over ``tp`` ranks."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise _error(f"the tensor-parallel degree must be a positive integer, got {tp!r}", code="E-TP")
    heads = _split(dims.num_attention_heads, tp, "num_attention_heads", dims.name)
    if dims.num_key_value_heads >= tp:
        kv = _split(dims.num_key_value_heads, tp, "num_key_value_heads", dims.name)
    elif tp % dims.num_key_value_heads:
        raise _error(f"{dims.name}: {dims.num_key_value_heads} key/value heads cannot be replicated over {tp} ranks", code="E-TP")
    else:
        kv = 1  # fewer key/value heads than ranks: each rank holds one, replicated
    inter = _split(dims.intermediate_size, tp, "intermediate_size", dims.name)
    hidden, hd, layers = dims.hidden_size, dims.head_dim, dims.num_hidden_layers
    attn, mlp = "model.layers.*.self_attn.", "model.layers.*.mlp."
    if fused:
        per_layer = [(attn + "qkv_proj", (heads + 2 * kv) * hd, hidden), (attn + "o_proj", hidden, heads * hd),
                     (mlp + "gate_up_proj", 2 * inter, hidden), (mlp + "down_proj", hidden, inter)]
    else:
        per_layer = [(attn + "q_proj", heads * hd, hidden), (attn + "k_proj", kv * hd, hidden), (attn + "v_proj", kv * hd, hidden),
                     (attn + "o_proj", hidden, heads * hd), (mlp + "gate_proj", inter, hidden), (mlp + "up_proj", inter, hidden),
                     (mlp + "down_proj", hidden, inter)]
    vocab = dims.vocab_size if tp == 1 else math.ceil(math.ceil(dims.vocab_size / 64) * 64 / tp)  # vLLM pads to 64
    out = []
    for t in tokens:
        out += [ModelShape(t, n, k, (name,), layers, t) for name, n, k in per_layer]
        if lm_head:
            out.append(ModelShape(t, vocab, hidden, ("lm_head",), 1, t))
    return merge(out)


def merge(shapes: Iterable[ModelShape]) -> list[ModelShape]:
    """One entry per (M, N, K): the layers of each in first-seen order, counts summed;
    entries in the order their shapes first appear."""
    merged: dict[tuple, ModelShape] = {}
    for s in shapes:
        key = (s.m, s.n, s.k)
        had = merged.get(key)
        if had is None:
            merged[key] = s
        else:
            layers = had.layers + tuple(x for x in s.layers if x not in had.layers)
            merged[key] = ModelShape(s.m, s.n, s.k, layers, had.count + s.count, had.tokens)
    return list(merged.values())


def parse_tokens(text: str) -> list[int]:
    """``"1,16,64"`` as token counts (positive integers, duplicates dropped); ValueError
    with the offending item otherwise."""
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item.isdigit() or len(item) > 9 or int(item) <= 0:
            raise ValueError(f"token count {item[:20]!r} is not a positive integer (give e.g. --tokens 1,16,64)")
        if int(item) not in out:
            out.append(int(item))
    return out


def model_label(name: str, tp: int) -> str:
    """How suites name a model's shapes: its name, with ``-tpN`` when sharded."""
    return name if tp == 1 else f"{name}-tp{tp}"


def model_dims(spec: str, *, traced_too: bool = False) -> ModelDims:
    """The sizes of a ``config.json`` (or a directory holding one) or of a built-in name;
    E-MODEL for anything else."""
    if Path(spec).exists():
        return load_config(spec)
    if spec.lower() in BUILTIN:
        return BUILTIN[spec.lower()]
    raise _error(f"no model '{spec[:80]}': not a file or directory, nor a built-in name ({', '.join(BUILTIN)})"
                 + (", nor pkg.module:factory" if traced_too else ""), code="E-MODEL")


def suite_json(label: str, shapes: Sequence[ModelShape], tokens: Sequence[int], tp: int = 1) -> dict:
    """A suite file's content (``{"about", "shapes": [...]}``) holding ``shapes``, which
    ``l2gen bench --suite`` and ``l2gen tune --suite`` read."""
    return {
        "about": f"GEMM shapes of the nn.Linear layers of {label} (y[M,N] = x[M,K] @ W[N,K].T, B stored N x K: "
                 f"layout nk) at {', '.join(map(str, tokens))} tokens per forward; count: calls per forward"
                 + (f"; one of {tp} tensor-parallel ranks" if tp > 1 else ""),
        "model": label,
        "tokens": list(tokens),
        "tp": tp,
        "shapes": [s.to_dict(label) for s in shapes],
    }


def unserved_note(shape: ModelShape) -> str | None:
    """Why no l2gen program serves the shape (torch computes it), or None."""
    return unserved(shape.shape)
