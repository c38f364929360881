"""Lesson 12 exercise: split a layer over tp cards, and count what each card holds and sends. Check: pytest -m lesson12

Weights are laid out as PyTorch's nn.Linear keeps them, (out_features, in_features), and as minillm fuses them:
the attention's qkv_proj is q's rows, then k's, then v's; the MLP's gate_up_proj is gate's rows, then up's.
No torch.distributed here: the tp cards are a Python loop, and `all_reduce` (given) is the one way they share a tensor.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

GiB = 2**30


def shard_qkv(qkv: torch.Tensor, n_heads: int, n_kv_heads: int, head_dim: int, rank: int, tp: int) -> torch.Tensor:
    """Card `rank`'s share of the fused q/k/v weight ((n_heads + 2 n_kv_heads) x head_dim, dim), column-parallel:
    its n_heads / tp query heads, then its n_kv_heads / tp key heads, then the same value heads, as one weight
    ((n_heads + 2 n_kv_heads) / tp x head_dim, dim). Card r takes the r-th run of whole heads of each.
    tp divides n_kv_heads (which divides n_heads): a card may hold one kv head, several, or all of them (tp = 1:
    the whole weight). Return a new tensor; leave qkv as it is."""
    raise NotImplementedError("lesson 12: card rank's query, key and value heads of the fused qkv weight")


def shard_down(down: torch.Tensor, rank: int, tp: int) -> torch.Tensor:
    """Card `rank`'s share of the MLP's down_proj weight (dim, ffn), row-parallel: the part that multiplies the
    ffn / tp columns the card computed (its r-th run of them): a (dim, ffn / tp) weight. tp divides ffn."""
    raise NotImplementedError("lesson 12: card rank's share of a row-parallel weight")


def tp_mlp(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    tp: int,
    all_reduce: Callable[[list[torch.Tensor]], list[torch.Tensor]],
) -> torch.Tensor:
    """minillm's MLP, down(silu(gate(x)) * up(x)), run on tp cards: return what card 0 ends with, (tokens, dim).

    x: (tokens, dim), the same on every card. gate_up: (2 ffn, dim), gate's rows then up's. down: (dim, ffn).
    Each card computes its ffn / tp columns of gate and of up (column-parallel: no communication), SiLU(gate) x up,
    then multiplies them by its columns of down (row-parallel): a partial sum of the output.
    all_reduce(tensors): one tensor per card in, one per card out, each the sum of them all. Call it once, where the
    cards must add up their parts: every all-reduce costs a trip over the link. tp divides ffn; tp may be 1 (one
    card: calling all_reduce on its one tensor is fine, and so is not calling it). Leave x and the weights as
    they are (all_reduce returns new tensors: return card 0's, do not copy it into x).
    """
    raise NotImplementedError("lesson 12: the MLP on tp cards, with its one all-reduce")


def card_memory_gib(params: int, kv_bytes_per_token: float, tokens: int, tp: int, weight_bits: float = 16) -> float:
    """GiB (2**30 bytes) that each of tp cards holds: its share of the weights (params of weight_bits bits each) and
    its share of the KV cache of `tokens` cached tokens (kv_bytes_per_token bytes each, for the whole model).
    weight_bits need not be whole bytes (4.125: int4 with its scales); tokens may be 0."""
    raise NotImplementedError("lesson 12: what one card of tp holds")


def allreduce_bytes(hidden: int, layers: int, tokens: int, tp: int, act_bits: float = 16) -> float:
    """Bytes each card sends in one step's all-reduces: two per layer (after o_proj and after down_proj), each over
    tokens x hidden activations of act_bits bits, of which a ring all-reduce sends 2(tp - 1)/tp from each card
    (nothing at tp = 1). act_bits need not be a multiple of 8."""
    raise NotImplementedError("lesson 12: the bytes one step's all-reduces send from each card")
