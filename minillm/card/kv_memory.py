"""KV memory arithmetic for the lessons: the share of reserved slots that hold nothing, and how many
sequences a memory fits under each layout (lesson 05 works both out by hand).
"""

from __future__ import annotations

from minillm.config import ModelConfig
from minillm.engine.kv_cache import kv_bytes_per_token


def kv_waste(cache) -> float:
    """Share of reserved token slots that hold no token: (reserved - stored) / reserved."""
    reserved = cache.reserved_tokens
    return (reserved - cache.stored_tokens) / reserved if reserved else 0.0


def sequences_that_fit(
    cfg: ModelConfig, memory_bytes: int, seq_len: int, layout: str, block_size=16, max_len=None
) -> int:
    """How many sequences of `seq_len` tokens fit in `memory_bytes` of KV memory under a layout."""
    per_token = kv_bytes_per_token(cfg)
    if layout == "contiguous":  # every seat pays for a whole max_len row
        return memory_bytes // (per_token * (max_len or cfg.max_seq_len))
    if layout == "paged":  # every sequence pays for the blocks it fills
        blocks = memory_bytes // (per_token * block_size)
        return blocks // -(-seq_len // block_size)
    raise ValueError(f"unknown layout {layout!r}; choose contiguous or paged")
