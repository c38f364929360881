"""Tensor parallelism: one model split across `tp` ranks, each holding 1/tp of every layer's heads and MLP columns.

A layer is two matmul pairs, and each pair splits the same way (Megatron-LM's layout, as vLLM and SGLang run it):

    attention:  x ──qkv_proj──> q, k, v of this rank's heads ──attend──> ──o_proj──> partial sum ──all-reduce──> out
                   (column-parallel: the rows of W for its heads)         (row-parallel: the columns for its heads)
    MLP:        x ──gate_up_proj──> this rank's ffn columns ──SwiGLU──> ──down_proj──> partial sum ──all-reduce──> out

The first matmul of a pair needs no communication: every rank has the whole input x and computes its own heads (or
ffn columns). The second multiplies those by its slice of the output matrix, which gives a partial sum of the
full output; one all-reduce per pair adds the ranks' partial sums, so every rank holds the same full output and
goes on to the next layer. Two all-reduces per layer, of one activation (tokens x dim) each.

Attention splits by whole heads: a query head and the key/value head it reads stay on one rank, so attention
itself needs no communication, and each rank's KV cache holds only its own key/value heads (1/tp of the bytes).
The embedding and the vocabulary head are kept whole on every rank: minillm's vocabulary is 260 tokens, a sliver of
its weights, and a whole head leaves rank 0 the full logits to sample from, as one device does. (A 128k-token
vocabulary is split too, by vocabulary rows, at the cost of one more gather; minillm's gains nothing from it.)
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from minillm.config import ModelConfig, check_split


def check_tp(cfg: ModelConfig, tp: int) -> None:
    """`tp` must split the query heads, the key/value heads and the MLP's columns evenly."""
    check_split("this model", cfg.n_heads, cfg.n_kv_heads, cfg.ffn_dim, tp)


def shard_view(cfg: ModelConfig, tp: int) -> ModelConfig:
    """What one rank's KV cache holds: 1/tp of the heads (and of the width they span); head_dim unchanged."""
    return replace(cfg, dim=cfg.dim // tp, n_heads=cfg.n_heads // tp, n_kv_heads=cfg.n_kv_heads // tp,
                   ffn_dim=cfg.ffn_dim // tp)  # fmt: skip


class RowParallelLinear(nn.Linear):
    """A linear layer holding some of its input columns: its output is a partial sum, completed by an all-reduce
    over the ranks (the one communication of its layer pair)."""

    def __init__(self, weight: torch.Tensor):  # (out, in / tp)
        super().__init__(weight.shape[1], weight.shape[0], bias=False, device=weight.device, dtype=weight.dtype)
        self.weight = nn.Parameter(weight.contiguous(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.weight)  # (..., out): this rank's share of the sum
        dist.all_reduce(out)  # every rank: the sum of all shares, the full output
        return out


def column_linear(weight: torch.Tensor) -> nn.Linear:
    """A linear layer from some of its output rows (column-parallel: no communication)."""
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device=weight.device, dtype=weight.dtype)
    layer.weight = nn.Parameter(weight.contiguous(), requires_grad=False)
    return layer


def rows_of(weight: torch.Tensor, rank: int, tp: int) -> torch.Tensor:
    """Rank `rank`'s tp-th of the rows of `weight` (a run of whole heads, or of ffn columns)."""
    size = weight.shape[0] // tp
    return weight[rank * size : (rank + 1) * size]


@torch.no_grad()
def shard_model(model: nn.Module, rank: int, tp: int) -> nn.Module:
    """Cut the ordinary model down to rank `rank`'s share, in place (the checkpoint is sliced, not converted)."""
    check_tp(model.cfg, tp)
    for layer in model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        H, Hkv, D = attn.n_heads, attn.n_kv_heads, attn.head_dim
        q, k, v = attn.qkv_proj.weight.split([H * D, Hkv * D, Hkv * D])  # (heads * D, dim) each
        attn.qkv_proj = column_linear(torch.cat([rows_of(w, rank, tp) for w in (q, k, v)]))
        attn.o_proj = RowParallelLinear(rows_of(attn.o_proj.weight.T, rank, tp).T)  # its heads' input columns
        attn.n_heads, attn.n_kv_heads = H // tp, Hkv // tp
        gate, up = mlp.gate_up_proj.weight.chunk(2)  # (ffn, dim) each
        mlp.gate_up_proj = column_linear(torch.cat([rows_of(gate, rank, tp), rows_of(up, rank, tp)]))
        mlp.down_proj = RowParallelLinear(rows_of(mlp.down_proj.weight.T, rank, tp).T)
    return model
