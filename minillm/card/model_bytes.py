"""What a model weighs: its weights in memory, the weights a step streams, and the KV cache per token and per user.

roofline.py turns these bytes into time; they live here so that each file holds one idea. A mixture of experts
streams only the experts its step's tokens picked (experts.py); latent attention and sliding windows change what a
token's KV weighs and how it grows with the context (kv_layout.py).
"""

from __future__ import annotations

from minillm.card import kv_layout
from minillm.card.experts import expected_experts, expert_slot_bytes
from minillm.card.modelspec import ModelSpec
from minillm.errors import ConfigError

# Bytes per weight. int4: 4 bits plus one fp16 scale per group of 128 weights (AWQ / GPTQ's layout).
WEIGHT_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int4": 0.5 + 2 / 128}
KV_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4}  # fp32: minillm's own cache (kv_cache.py)


def check_dtypes(dtype: str, kv_dtype: str) -> None:
    if dtype not in WEIGHT_BYTES:
        raise ConfigError(f"unknown weight dtype {dtype!r}; choose from {', '.join(WEIGHT_BYTES)}")
    if kv_dtype not in KV_BYTES:
        raise ConfigError(f"unknown KV cache dtype {kv_dtype!r}; choose from {', '.join(KV_BYTES)}")


def weight_bytes(spec: ModelSpec, dtype: str = "bf16") -> float:
    """Bytes of all weights. fp8 and int4 quantize the layers' matrices (every expert's too); embeddings, lm_head,
    norms and biases stay in bf16, as quantized checkpoints usually keep them."""
    check_dtypes(dtype, "bf16")
    other = 4 if dtype == "fp32" else 2
    matrices = spec.matmul_params
    rest = spec.num_parameters - matrices
    return matrices * WEIGHT_BYTES[dtype] + rest * other


def streamed_weight_bytes(spec: ModelSpec, dtype: str = "bf16") -> float:
    """Bytes of weights a decode step streams: all of them but the embedding table, which is looked up (one row
    per token, counted with the tokens) unless it is tied to lm_head, which multiplies through all of it.
    Memory holds weight_bytes; bandwidth / this is one user's speed ceiling. (A mixture of experts streams this only
    once its batch touches every expert: touched_weight_bytes.)"""
    act = 4 if dtype == "fp32" else 2
    return weight_bytes(spec, dtype) - (0 if spec.tied_embeddings else spec.embedding_params * act)


def touched_weight_bytes(spec: ModelSpec, dtype: str = "bf16", tokens: int = 1) -> float:
    """Bytes of weights a step of `tokens` tokens streams: streamed_weight_bytes, less the routed experts none of
    its tokens picked (experts.py: E (1 - (1 - k/E)^tokens) of the E, on average, in each MoE layer)."""
    streamed = streamed_weight_bytes(spec, dtype)
    if not spec.experts:
        return streamed
    slot = expert_slot_bytes(spec, WEIGHT_BYTES[dtype], 4 if dtype == "fp32" else 2)
    untouched = spec.experts - expected_experts(spec.experts, spec.experts_per_token, tokens)
    return streamed - untouched * slot


def kv_bytes_per_token(spec: ModelSpec, kv_dtype: str = "bf16") -> int:
    """One token's KV in every layer: a key and a value (the 2) per kv head (GQA: not per query head); with latent
    attention, the latent and the rope key (kv_layout.py). A sliding-window layer's counts until its window is full."""
    check_dtypes("bf16", kv_dtype)
    return spec.layers * kv_layout.kv_values_per_layer(spec) * KV_BYTES[kv_dtype]


def kv_bytes_per_user(spec: ModelSpec, context: int, kv_dtype: str = "bf16", block_size: int = 16) -> float:
    """One user's KV at `context` tokens, in whole blocks; sliding-window layers keep only their window."""
    per_layer = kv_layout.kv_values_per_layer(spec) * KV_BYTES[kv_dtype]
    return kv_layout.user_kv_bytes(spec, context, per_layer, block_size)
