"""A Llama-style decoder in plain torch, for the end-to-end benchmark (bench/e2e_llama.py).

RMSNorm, rotary position embeddings, grouped-query attention through
``scaled_dot_product_attention``, a SwiGLU MLP and an output projection, with the fused
``qkv_proj`` and ``gate_up_proj`` Linear layers vLLM runs; modules are named as in
``transformers`` (``model.layers.N.self_attn.qkv_proj``, ``lm_head``), so that
``l2gen shapes`` of the same config lists exactly this model's GEMMs. Weights are random
(seeded): no download, no ``transformers``.

A forward takes token ids ``[batch, t]`` and either no cache (causal attention over the
``t`` tokens: a full recompute) or a :class:`KVCache` and the position ``start`` of the
first token, a 0-dim long tensor on the model's device: the keys and values are written
at ``start .. start + t - 1`` and attention reads the whole preallocated cache under a
mask, so a decode step has the same shapes at every position and a CUDA graph can
capture it (replaying it with ``start`` advanced in place).
"""

from __future__ import annotations

import math
import torch
import torch.nn.functional as F
from torch import nn

from l2gen.model_shapes import ModelDims


ROPE_THETA = 500000.0  # Llama 3's RoPE base
RMS_NORM_EPS = 1e-5


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return x32.to(x.dtype) * self.weight


def _rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class KVCache:
    """Keys and values of every layer, ``[batch, kv_heads, max_len, head_dim]`` each,
    allocated once."""

    def __init__(self, dims: ModelDims, batch: int, max_len: int, *, dtype, device):
        shape = (batch, dims.num_key_value_heads, max_len, dims.head_dim)
        self.max_len = max_len
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(dims.num_hidden_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(dims.num_hidden_layers)]


class Attention(nn.Module):
    def __init__(self, c: ModelDims):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.qkv_proj = nn.Linear(c.hidden_size, (self.heads + 2 * self.kv_heads) * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, c.hidden_size, bias=False)

    def forward(self, x, cos, sin, positions, cache: KVCache | None, layer: int):
        b, t, _ = x.shape
        q, k, v = self.qkv_proj(x).split([self.heads * self.head_dim, self.kv_heads * self.head_dim,
                                          self.kv_heads * self.head_dim], dim=-1)
        q = q.view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        if cache is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            cache.k[layer].index_copy_(2, positions, k)
            cache.v[layer].index_copy_(2, positions, v)
            keys = torch.arange(cache.max_len, device=x.device)
            mask = keys[None, :] <= positions[:, None]  # [t, max_len]: each token sees the cache up to itself
            out = F.scaled_dot_product_attention(q, cache.k[layer], cache.v[layer], attn_mask=mask, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, c: ModelDims):
        super().__init__()
        self.gate_up_proj = nn.Linear(c.hidden_size, 2 * c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, c: ModelDims, eps: float):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, eps)
        self.mlp = MLP(c)

    def forward(self, x, cos, sin, positions, cache, layer):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, positions, cache, layer)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, c: ModelDims, eps: float):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(c, eps) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, eps)


class LlamaForCausalLM(nn.Module):
    """The decoder and its output projection; ``forward`` returns logits ``[batch, t, vocab]``
    (``last_only``: of the last token only, ``[batch, 1, vocab]``, as serving computes a
    prefill's). Its sizes are an :class:`l2gen.model_shapes.ModelDims`, the one record
    ``l2gen shapes`` reads its GEMMs from."""

    def __init__(self, dims: ModelDims, max_positions: int = 4096, *, rope_theta: float = ROPE_THETA,
                 rms_norm_eps: float = RMS_NORM_EPS):
        super().__init__()
        self.dims = dims
        self.model = LlamaModel(dims, rms_norm_eps)
        self.lm_head = nn.Linear(dims.hidden_size, dims.vocab_size, bias=False)
        half = dims.head_dim // 2
        inv_freq = 1.0 / (rope_theta ** (torch.arange(half, dtype=torch.float32) / half))
        angles = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        self.register_buffer("rope_cos", torch.cat((angles.cos(), angles.cos()), dim=-1), persistent=False)
        self.register_buffer("rope_sin", torch.cat((angles.sin(), angles.sin()), dim=-1), persistent=False)

    def forward(self, tokens, cache: KVCache | None = None, start=None, *, last_only: bool = False):
        t = tokens.shape[1]
        positions = torch.arange(t, device=tokens.device)
        if cache is not None:
            positions = positions + (start if start is not None else 0)
        cos = self.rope_cos.index_select(0, positions).to(self.lm_head.weight.dtype)
        sin = self.rope_sin.index_select(0, positions).to(self.lm_head.weight.dtype)
        x = self.model.embed_tokens(tokens)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, positions, cache, i)
        x = self.model.norm(x)
        if last_only:
            x = x[:, -1:]
        return self.lm_head(x)

    @torch.no_grad()
    def init_random(self, seed: int) -> "LlamaForCausalLM":
        """Seeded random weights, scaled so activations stay of order 1 in fp16: Linear
        weights N(0, 1/K), embeddings N(0, 1), norms 1. Drawn on the model's device."""
        device = self.lm_head.weight.device
        gen = torch.Generator(device=device).manual_seed(seed)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                module.weight.normal_(0.0, 1.0 / math.sqrt(module.in_features), generator=gen)
            elif isinstance(module, nn.Embedding):
                module.weight.normal_(0.0, 1.0, generator=gen)
            elif isinstance(module, RMSNorm):
                module.weight.fill_(1.0)
        return self


def build(dims: ModelDims, *, seed: int = 0, dtype=torch.float16, device="cuda", max_positions: int = 4096) -> LlamaForCausalLM:
    """The model with seeded random weights, in ``dtype`` on ``device``, in eval mode."""
    with torch.device(device):
        model = LlamaForCausalLM(dims, max_positions)
    return model.to(dtype).init_random(seed).eval()
