"""Model sizes for timing only: the shipped shape and two larger ones that meet this machine's memory wall.

A decode step's time does not depend on the weights' values, only on their shapes, so the larger
sizes are random weights run through the very same Transformer, KV cache and runner as the shipped
model. What makes them worth timing is where their weights live:

    3m    the shipped model (ModelConfig's defaults): 12 MB of fp32 weights, which sit in a CPU's
          last-level cache (32 MiB on this project's machine); a step is mostly the fixed cost per call
    25m   102 MB: about 3x that cache, so every step streams its weights from memory
    100m  408 MB: about 12x; a batch-1 step reads 0.4 GB, yet batch 128 stays a few tenths of a second
          on one core, so a full sweep takes minutes, not hours

The larger ones keep the shipped model's head size ratio (4 query heads per key/value head) and its
MLP ratio (11/4 of the width), and its byte vocabulary: only width and depth grow.
"""

from __future__ import annotations

import torch

from minillm.card.modelspec import ModelSpec
from minillm.config import ModelConfig
from minillm.errors import ConfigError
from minillm.model.transformer import Transformer

SIZES: dict[str, ModelConfig] = {
    "3m": ModelConfig(),
    "25m": ModelConfig(dim=512, n_layers=9, n_heads=8, n_kv_heads=2, ffn_dim=1408),
    "100m": ModelConfig(dim=1024, n_layers=9, n_heads=16, n_kv_heads=4, ffn_dim=2816),
}


def size_config(name: str) -> ModelConfig:
    try:
        return SIZES[name]
    except KeyError:
        raise ConfigError(f"unknown model size {name!r}; choose from {', '.join(SIZES)}") from None


def spec_of(cfg: ModelConfig, name: str) -> ModelSpec:
    """The cost model's view of a minillm shape (the same fields a config.json would give)."""
    return ModelSpec(name=name, hidden=cfg.dim, intermediate=cfg.ffn_dim, layers=cfg.n_layers, heads=cfg.n_heads,
                     kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim, vocab=cfg.vocab_size,
                     max_context=cfg.max_seq_len)  # fmt: skip


def size_spec(name: str) -> ModelSpec:
    return spec_of(size_config(name), name)


def timing_model(name: str, device: str | torch.device = "cpu", seed: int = 0) -> Transformer:
    """A model of this size with random weights, ready to time (eval mode, on `device`)."""
    torch.manual_seed(seed)
    return Transformer(size_config(name)).to(device).eval()
