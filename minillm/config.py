"""Settings for the model, the serving engine and a request's sampling, as validated dataclasses.

Bad values fail here, at construction, with a message that names the field and
the fix, instead of deep inside torch later. The device setting (--device) is resolved here too.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from minillm.errors import ConfigError, DeviceError, InputError


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the tiny Llama-style decoder (defaults: about 3 M parameters)."""

    vocab_size: int = 260  # 256 bytes + PAD, BOS, EOS, SEP (see tokenizer.py)
    dim: int = 256  # width of the residual stream
    n_layers: int = 4
    n_heads: int = 8  # query heads
    n_kv_heads: int = 2  # key/value heads; grouped-query attention when < n_heads
    ffn_dim: int = 704  # hidden width of the SwiGLU MLP (about 8/3 * dim)
    max_seq_len: int = 1024  # longest prompt + reply the model (and RoPE) is built for
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"ModelConfig.{name} must be a positive integer, got {value!r}")
        if self.dim % self.n_heads:
            raise ConfigError(f"dim ({self.dim}) must be divisible by n_heads ({self.n_heads})")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"n_kv_heads ({self.n_kv_heads}) must divide n_heads ({self.n_heads}): "
                "each key/value head serves a whole group of query heads"
            )
        if self.head_dim % 2:
            raise ConfigError(f"head_dim ({self.head_dim}) must be even for rotary embeddings")
        if self.rope_theta <= 0 or self.norm_eps <= 0:
            raise ConfigError("rope_theta and norm_eps must be positive")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ModelConfig:
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"unknown ModelConfig fields {sorted(unknown)}; known: {sorted(known)}")
        return cls(**data)


def check_split(name: str, heads: int, kv_heads: int, columns: int, tp: int, part: str = "rank") -> None:
    """Tensor parallelism gives each of `tp` ranks (or cards) whole heads and an equal share of the MLP's columns:
    `tp` must divide every count (parallel/shard.py splits the tiny model so; card/tensor_parallel.py prices it)."""
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise ConfigError(f"--tp must be a whole number of {part}s, at least 1; got {tp!r}")
    counts = {"query heads": heads, "key/value heads": kv_heads, "MLP columns": columns}
    if any(n % tp for n in counts.values()):
        fits = [d for d in range(1, kv_heads + 1) if all(n % d == 0 for n in counts.values())]
        have = ", ".join(f"{n} {what}" for what, n in counts.items())
        raise ConfigError(f"--tp {tp} cannot split {name} ({have}): each {part} takes whole heads, so tp must "
                          f"divide every count; choose one of {', '.join(map(str, fits))}")  # fmt: skip


MAX_SPECULATE = 16  # draft tokens per step: past a handful, a guess that far ahead is almost never right


@dataclass(frozen=True)
class EngineConfig:
    """How the engine serves: how many seats, which KV layout, how much KV memory."""

    slots: int = 4  # seats: sequences that can be in the batch at once
    kv: str = "paged"  # "paged" or "contiguous"
    block_size: int = 16  # tokens per KV block (paged); also the unit the app draws memory in
    num_blocks: int | None = None  # paged pool size; default: the same memory the contiguous layout reserves
    max_len: int = 1024  # longest prompt + reply one sequence may reach (the contiguous row length)
    prefix_caching: bool = False  # share full KV blocks between requests whose prompts start alike (paged only)
    record_blocks: bool = True  # record every request's block table at every step (the app's KV map; big on long runs)
    speculate: int = 0  # draft tokens each greedy decoding request guesses per step, for the model to check; 0: off
    drafter: str = "model"  # who guesses: "model" (a small draft model) or "ngram" (prompt lookup, no model)
    host_blocks: int = 0  # a second KV tier: blocks kept in host memory under the prefix cache (layers/tier.py)
    swap_above: int = 0  # a preempted request with this many tokens or more comes back from that tier, by copy
    # check the KV books every step (slow: for tests and debugging); MINILLM_DEBUG=1 turns it on everywhere
    debug: bool = field(default_factory=lambda: os.environ.get("MINILLM_DEBUG", "0") not in ("", "0"))

    def __post_init__(self) -> None:
        if self.kv not in ("paged", "contiguous"):
            raise ConfigError(f"kv must be 'paged' or 'contiguous', got {self.kv!r}")
        if self.prefix_caching and self.kv != "paged":
            raise ConfigError("prefix caching shares KV blocks, so it needs kv='paged'")
        for name in ("slots", "block_size", "max_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"EngineConfig.{name} must be a positive integer, got {value!r}")
        if self.num_blocks is not None and (not isinstance(self.num_blocks, int) or self.num_blocks < 1):
            raise ConfigError(f"num_blocks must be a positive integer, got {self.num_blocks!r}")
        if not isinstance(self.speculate, int) or not 0 <= self.speculate <= MAX_SPECULATE:
            raise ConfigError(f"speculate must be a whole number of draft tokens from 0 (off) to {MAX_SPECULATE}, "
                              f"got {self.speculate!r}")  # fmt: skip
        for name in ("host_blocks", "swap_above"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"{name} must be a whole number >= 0, got {value!r}")
        if self.host_blocks and not self.prefix_caching:
            raise ConfigError(
                "host_blocks (a second KV tier) keeps prefix-cached blocks: turn on prefix caching too "
                "(--prefix-caching)"
            )
        if self.drafter not in ("model", "ngram"):
            raise ConfigError(f"drafter must be 'model' (a draft model) or 'ngram' (no model), got {self.drafter!r}")

    @property
    def total_blocks(self) -> int:
        """Blocks of KV memory: the paged pool, or the contiguous rows cut into blocks for display."""
        if self.kv == "paged" and self.num_blocks is not None:
            return self.num_blocks
        return self.slots * -(-self.max_len // self.block_size)


# A request's sampling settings: (a whole number?, lowest, highest, what it must be). The server checks each field
# a client sends against the same table (serving/openai_protocol.py).
SAMPLING_LIMITS = {
    "temperature": (False, 0, math.inf, ">= 0 (0: greedy)"),
    "top_p": (False, math.ulp(0), 1, "in (0, 1] (1: no cut)"),
    "top_k": (True, 0, math.inf, ">= 0 (0: no cut)"),
    "seed": (True, 0, 2**64 - 1, ">= 0"),
    "logprobs": (True, 0, 20, "from 0 to 20 (the likely tokens listed beside the chosen one; OpenAI's range)"),
}


def check_sampling(name: str, value) -> None:
    whole, low, high, what = SAMPLING_LIMITS[name]
    number = isinstance(value, int if whole else (int, float)) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or not low <= value <= high:
        raise InputError(f"{name} must be {'a whole number' if whole else 'a number'} {what}, got {value!r}")


@dataclass(frozen=True)
class Sampling:
    """How a request's next tokens are picked (minillm/layers/sampling.py): greedy unless asked otherwise."""

    temperature: float = 0.0  # logits / temperature: higher is flatter; 0: the most likely token (greedy)
    top_p: float = 1.0  # draw from the fewest most likely tokens whose probabilities reach top_p
    top_k: int = 0  # draw from the k most likely tokens (0: no cut)
    seed: int | None = None  # the same seed, the same reply (None: the engine gives it one of its own)
    logprobs: int | None = None  # record the chosen token's log-probability and this many top alternatives
    # a pattern the reply must match: an automaton over bytes (grammar/, minillm/layers/constrain.py), as vLLM's
    # SamplingParams carries its structured-output request
    constraint: Any = None

    def __post_init__(self) -> None:
        for name in SAMPLING_LIMITS:
            value = getattr(self, name)
            if value is not None:
                check_sampling(name, value)

    @property
    def plain(self) -> bool:
        """True when the core's greedy pick serves it: no temperature, no logprobs, no pattern."""
        return self.temperature == 0 and self.logprobs is None and self.constraint is None


def resolve_device(name: str = "auto") -> torch.device:
    """'auto' -> cuda when torch sees a GPU, else cpu. Asking for cuda without one is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        fix = "use --device cpu (or auto)"
        raise DeviceError(f"--device cuda was asked for, but torch sees no CUDA GPU here; {fix}")
    if name not in ("cpu", "cuda"):
        raise DeviceError(f"unknown device {name!r}; choose cpu, cuda or auto")
    return torch.device(name)
