"""Lesson 02 exercise: a KV cache. Check your work: pytest -m lesson02"""

from __future__ import annotations

import torch


def append_kv(cached: torch.Tensor | None, new: torch.Tensor) -> torch.Tensor:
    """Add this step's keys (or values) after the ones already cached.

    cached: (1, S, n_kv_heads, head_dim), S >= 1, or None when nothing is cached yet.
    new:    (1, T, n_kv_heads, head_dim) for the T >= 1 tokens of this forward (one, or a whole chunk).
    Returns (1, S + T, n_kv_heads, head_dim): the cached tokens, then the new ones, in order, in their dtype.
    Leave both arguments as they are (return a new tensor).
    """
    raise NotImplementedError("lesson 02: append the new keys/values after the cached ones")


def cached_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_positions: torch.Tensor) -> torch.Tensor:
    """Attention of new queries over every cached key, without peeking at the future.

    q: (1, T, n_heads, head_dim) for the new tokens, at positions q_positions (1, T).
    k, v: (1, S, n_kv_heads, head_dim), the whole cache including the new tokens (S >= T >= 1).
    The new tokens are the cache's last T: q_positions is [[S - T, ..., S - 1]] (T = 1: a decode step; T = S:
    a whole prompt). A query at position p may see keys 0..p. n_heads is a multiple of n_kv_heads: key/value
    head j serves query heads j * group .. (j + 1) * group - 1, group = n_heads // n_kv_heads (hint:
    torch.repeat_interleave on dim 2). Any head_dim >= 1; float32 or float64, and scores of any size: a
    softmax that exponentiates the raw scores overflows past about 88 (torch's softmax subtracts the max).
    Returns (1, T, n_heads, head_dim): softmax(q k^T / sqrt(head_dim)) v (to within a relative 1e-4).
    Leave q, k, v and q_positions as they are (no in-place ops on them).
    """
    raise NotImplementedError("lesson 02: write masked attention over the cached keys and values")


class SimpleKVCache:
    """A one-sequence cache built from your two functions; it plugs into the real model:
    `model(tokens, cache.prepare([0], T), cache)`. (Given: nothing to write here.)"""

    def __init__(self, n_layers: int, append=append_kv, attention=cached_attention):
        self.k: list[torch.Tensor | None] = [None] * n_layers
        self.v: list[torch.Tensor | None] = [None] * n_layers
        self.length = 0
        self.append, self.attention = append, attention

    def prepare(self, seats: list[int], num_new: int) -> torch.Tensor:
        self.positions = torch.arange(self.length, self.length + num_new)[None]  # (1, T)
        self.length += num_new
        return self.positions

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.k[layer] = self.append(self.k[layer], k)
        self.v[layer] = self.append(self.v[layer], v)
        return self.attention(q, self.k[layer], self.v[layer], self.positions.to(q.device))
