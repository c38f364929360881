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

# Bytes per weight of the layers' matrices. int4: 4 bits plus one fp16 scale per group of 128 weights (AWQ / GPTQ's
# layout). The mxfp4 layouts store the routed experts in a format of their own (EXPERT_BYTES): their entry here is
# everything else's, the embedding table and lm_head included.
# q8_0: llama.cpp's Q8_0 (32 8-bit values and one fp16 scale: 8.5 bits a weight), every matrix and table in it, as
# llama.cpp's converter writes a Q8_0 file (llama-bench lists Qwen2.5-Coder-7B's at 7.54 GiB; this gives 7.54).
WEIGHT_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int4": 0.5 + 2 / 128, "mxfp4": 2.0,
                "mxfp4-q8": 1 + 2 / 32, "q8_0": 1 + 2 / 32}  # fmt: skip
# The layouts of llama.cpp's files, whose embedding table and lm_head are in their matrices' format too.
GGUF_TABLES = ("mxfp4-q8", "q8_0")
# Bytes per routed-expert weight where the experts have a format of their own. MXFP4 (OCP Microscaling Formats v1.0):
# 32 4-bit values share one 8-bit scale, 4.25 bits a weight.
# - mxfp4: OpenAI's gpt-oss checkpoints (config.json quantization_config: quant_method mxfp4; modules_to_not_convert:
#   attention, router, embedding and lm_head, which stay bf16), as vLLM and TensorRT-LLM load them.
# - mxfp4-q8: ggml-org's gpt-oss GGUF, as llama.cpp runs it: the same experts, every other matrix and table in
#   llama.cpp's Q8_0 (32 8-bit values and one fp16 scale: 8.5 bits a weight). llama-bench lists gpt-oss-20b's file at
#   11.27 GiB; this layout gives 11.24 (with the rest in bf16, 12.82: the 12.83 GiB of its F16 file).
EXPERT_BYTES = {"mxfp4": 0.5 + 1 / 32, "mxfp4-q8": 0.5 + 1 / 32}
KV_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4}  # fp32: minillm's own cache (kv_cache.py)


def check_dtypes(dtype: str, kv_dtype: str) -> None:
    if dtype not in WEIGHT_BYTES:
        raise ConfigError(f"unknown weight dtype {dtype!r}; choose from {', '.join(WEIGHT_BYTES)}")
    if kv_dtype not in KV_BYTES:
        raise ConfigError(f"unknown KV cache dtype {kv_dtype!r}; choose from {', '.join(KV_BYTES)}")


def expert_weight_bytes(dtype: str) -> float:
    """Bytes per routed-expert weight: the experts' own format where the layout has one, else the matrices'."""
    return EXPERT_BYTES.get(dtype, WEIGHT_BYTES[dtype])


def table_bytes(dtype: str) -> float:
    """Bytes per weight of the embedding table and lm_head: 16-bit (fp32 in fp32) unless a llama.cpp layout stores
    them in its matrices' format."""
    return WEIGHT_BYTES[dtype] if dtype in GGUF_TABLES else 4 if dtype == "fp32" else 2


def weight_bytes(spec: ModelSpec, dtype: str = "bf16") -> float:
    """Bytes of all weights. fp8 and int4 quantize the layers' matrices (every expert's too); embeddings, lm_head,
    norms and biases stay in bf16, as quantized checkpoints usually keep them. The mxfp4 layouts store the routed
    experts in MXFP4 and the other matrices and tables in one format of their own (EXPERT_BYTES)."""
    check_dtypes(dtype, "bf16")
    other = 4 if dtype == "fp32" else 2
    routed = spec.moe_layers * spec.experts * spec.expert_params
    tables = spec.embedding_params + spec.lm_head_params
    rest = spec.num_parameters - spec.matmul_params - tables  # norms, biases (and learned position embeddings)
    return (routed * expert_weight_bytes(dtype) + (spec.matmul_params - routed) * WEIGHT_BYTES[dtype]
            + tables * table_bytes(dtype) + rest * other)  # fmt: skip


def streamed_weight_bytes(spec: ModelSpec, dtype: str = "bf16") -> float:
    """Bytes of weights a decode step streams: all of them but the embedding table, which is looked up (one row
    per token, counted with the tokens) unless it is tied to lm_head, which multiplies through all of it.
    Memory holds weight_bytes; bandwidth / this is one user's speed ceiling. (A mixture of experts streams this only
    once its batch touches every expert: touched_weight_bytes.)"""
    return weight_bytes(spec, dtype) - (0 if spec.tied_embeddings else spec.embedding_params * table_bytes(dtype))


def touched_weight_bytes(spec: ModelSpec, dtype: str = "bf16", tokens: int = 1) -> float:
    """Bytes of weights a step of `tokens` tokens streams: streamed_weight_bytes, less the routed experts none of
    its tokens picked (experts.py: E (1 - (1 - k/E)^tokens) of the E, on average, in each MoE layer)."""
    streamed = streamed_weight_bytes(spec, dtype)
    if not spec.experts:
        return streamed
    slot = expert_slot_bytes(spec, expert_weight_bytes(dtype), 4 if dtype == "fp32" else 2)
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
