"""A tiny Llama-style decoder: RMSNorm, rotary positions, grouped-query attention, SwiGLU.

One forward serves every use: with `cache=None` it is the plain full-sequence model (the
reference, and what training runs); with a KV cache it writes the new tokens' keys and values
into the cache and attends over everything stored so far (prefill and decode). Module names
follow Hugging Face's Llama; qkv_proj and gate_up_proj stack its q/k/v and gate/up (checkpoint.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minillm.config import ModelConfig
from minillm.model.attention import attend


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x * rsqrt(mean(x^2) + eps) * weight in one torch call (written out: 6; 45 fewer a step)
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


def rope_tables(head_dim: int, max_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables (max_len, 1, D) for Llama's "rotate half" rotary embedding (1: broadcast
    over heads). The sin table's first half is negated: apply_rope's roll needs no neg, no cat."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(max_len, dtype=torch.float64), inv_freq)  # (max_len, D/2)
    cos, sin = angles.cos(), angles.sin()
    cos, sin = torch.cat([cos, cos], dim=-1), torch.cat([-sin, sin], dim=-1)  # (max_len, D)
    return cos.float()[:, None], sin.float()[:, None]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[i], x[i + D/2]) by a position's angle. x (B, T, H, D); cos, sin (B, T, 1, D).
    Written out: x * cos + cat([-x2, x1]) * sin, x1 and x2 the halves of x; roll gives (x2, x1)."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer, self.n_heads, self.n_kv_heads = layer, cfg.n_heads, cfg.n_kv_heads
        self.head_dim = cfg.head_dim
        # q_proj, k_proj, v_proj stacked by rows: one matmul, not three (files keep three)
        qkv = (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.dim, qkv, bias=False)
        self.o_proj = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, cos, sin, cache) -> torch.Tensor:
        """cache: None, or what a layer needs of one: attend(layer, q, k, v) stores this step's
        keys and values and attends over the whole context (engine/kv_cache.py)."""
        (B, T, _), H, Hkv = x.shape, self.n_heads, self.n_kv_heads
        qkv = self.qkv_proj(x).view(B, T, H + 2 * Hkv, self.head_dim)  # (B, T, H + 2 Hkv, D)
        qk, v = qkv.split([H + Hkv, Hkv], dim=2)  # q and k side by side; v (B, T, Hkv, D)
        q, k = apply_rope(qk, cos, sin).split([H, Hkv], dim=2)  # rotated by the same 4 calls
        if cache is None:
            out = attend(q, k, v, mask=None)  # causal over this sequence alone
        else:
            out = cache.attend(self.layer, q, k, v)  # stores k, v; attends over the context
        return self.o_proj(out.reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.dim, 2 * cfg.ffn_dim, bias=False)  # gate and up: one
        self.down_proj = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # (..., ffn_dim) each
        return self.down_proj(F.silu(gate) * up)  # SwiGLU


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.self_attn = Attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, cache):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        cos, sin = rope_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)  # (max_seq_len, 1, D)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)

    def forward(self, tokens, positions=None, cache=None, last_only=False, logits_at=None):
        """tokens (B, T) long; positions (B, T) long (default 0..T-1). Returns logits (B, T, V), or
        (B, 1, V) with last_only (prefill needs only the next token's), or (R, V) at the flat token
        indices `logits_at` (R,) (a ragged step: each row's last token, see engine/packing.py)."""
        B, T = tokens.shape
        if positions is None:
            positions = torch.arange(T, device=tokens.device).expand(B, T)
        x = self.embed_tokens(tokens)  # (B, T, dim)
        cos, sin = self.rope_cos[positions], self.rope_sin[positions]  # (B, T, 1, D): all layers
        for layer in self.layers:
            x = layer(x, cos, sin, cache)
        if last_only:
            x = x[:, -1:]
        if logits_at is not None:
            x = x.flatten(0, 1)[logits_at]  # (R, dim): the vocabulary only where a token is picked
        return self.lm_head(self.norm(x))  # (B, T, V) or (R, V)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
