"""The roofline: what one engine step costs on a real card, from its bytes and FLOPs alone.

A step runs every row in the batch through every weight once. The card can stream
`bandwidth` bytes per second and multiply at `peak` FLOP/s, so the step takes at least

    time = max(bytes / bandwidth, flops / peak) / efficiency  +  kernels x launch cost

Which side of the max wins is the whole story of serving:
- Decode (one new token per row) reads all the weights for very little maths: about 2 FLOPs
  per weight per row, and a bf16 weight is 2 bytes, so its arithmetic intensity (FLOPs per
  byte) is about the batch size. The card's ridge point is peak / bandwidth (165 FLOP/byte on
  an RTX 4090): below that batch the step is memory-bound, and adding a row is nearly free.
- Every row also reads its own KV cache, which grows with its context. At long contexts the KV,
  not the weights, fills both the memory and the step time: that is the KV ceiling below.

The same formula prices a prefill chunk (many new tokens, one row): it multiplies the weights
by every token at once, so it is compute-bound from a few hundred tokens on.

The models people run now bend three of those terms (modelspec.py reads them): a mixture of experts streams only
the experts its tokens picked, more as the batch grows (experts.py); latent attention caches a small latent per
token instead of every kv head's keys and values; a sliding-window layer reads and keeps only its window (kv_layout.py).
Plain Python arithmetic, no torch: a simulated engine calls `step_cost` once per step.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

from minillm.card import kv_layout
from minillm.card.experts import expected_experts, expert_slot_bytes
from minillm.card.hardware import Device
from minillm.card.model_bytes import (  # what the weights and the KV weigh (re-exported: callers import them here)
    EXPERT_BYTES,
    KV_BYTES,
    check_dtypes,
    expert_weight_bytes,
    kv_bytes_per_token,
    kv_bytes_per_user,
    streamed_weight_bytes,
    weight_bytes,
)
from minillm.card.modelspec import ModelSpec
from minillm.errors import ConfigError

LOGIT_BYTES = 4  # logits come out in fp32 for sampling

# The KV ceiling's activation reserve: room for the live activations of one step of this many
# tokens (a usual chunked-prefill token budget) and the fp32 logits of this many rows (vLLM's
# default cap on sequences per step, max_num_seqs).
RESERVE_TOKENS = 2048
RESERVE_ROWS = 256


@dataclass(frozen=True)
class Kernels:
    """What the clock needs to know about an implementation (not the card, not the model):
    how many kernels one forward launches, and how many times the cached KV crosses memory."""

    per_layer: int
    per_step: int  # outside the layers: embedding, final norm, lm_head, sampling
    kv_passes: int = 1  # 1: attention reads the KV in place; a gather-then-attend reads it, writes a copy, reads that


# A serving engine (vLLM, TensorRT-LLM, llama.cpp): fused kernels, paged attention reading KV in place.
# Per layer: norm, qkv matmul, rotary, KV write, attention, o matmul, add + norm, gate/up matmul,
# SiLU x up, down matmul = 10. Per step: embedding, final norm, lm_head, sampling = 4.
SERVING_ENGINE = Kernels(per_layer=10, per_step=4)


@dataclass(frozen=True, slots=True)
class StepCost:
    """One step's bill: FLOPs, bytes by what they carry, and the time the roofline gives."""

    rows: int
    tokens: int
    flops: float
    weight_bytes: float  # every weight once per step, whatever the batch: the reason batching pays (MoE: touched)
    kv_read_bytes: float  # each row's cached keys and values
    kv_write_bytes: float  # the new tokens' keys and values
    activation_bytes: float  # matmul inputs and outputs, and the logits
    memory_s: float  # bytes / bandwidth
    compute_s: float  # flops / peak
    overhead_s: float  # kernels x launch cost
    time_s: float

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_read_bytes + self.kv_write_bytes + self.activation_bytes

    @property
    def bound(self) -> str:
        return "memory" if self.memory_s >= self.compute_s else "compute"

    @property
    def intensity(self) -> float:
        """Arithmetic intensity: FLOPs per byte moved."""
        return self.flops / self.bytes


def compute_dtype(dtype: str, device: Device) -> str:
    """The dtype the matmuls run in: fp8 needs fp8 tensor cores (Ada, Hopper), else the weights are
    widened to bf16 in the kernel; int4 and q8_0 are always weight-only (dequantized to fp16 on the fly), and so are
    the mxfp4 layouts (their experts dequantized to bf16, as gpt-oss's activations are)."""
    if dtype == "fp8":
        return "fp8" if device.has("fp8") else "bf16"
    return "fp16" if dtype in ("int4", "q8_0") else "bf16" if dtype in EXPERT_BYTES else dtype


class PerModel(NamedTuple):
    """Everything in a step's cost that depends on the model, card and dtypes only (computed once)."""

    streamed: float  # weights every step reads (all but the routed experts: those are per expert touched)
    expert_slot: float  # bytes of one routed expert over all MoE layers (0: dense)
    embedding_row: float  # one token's row of the embedding table
    flops_token: float  # matmul FLOPs per token (the experts it picked only)
    flops_row: float  # lm_head at each row's last token
    flops_key: float  # attention FLOPs per (query, key) pair in the full-attention layers
    flops_key_window: float  # the same in the sliding-window layers
    act_token: float  # matmul inputs and outputs per token
    act_row: float  # logits per row
    kv: float  # one token's KV in the full-attention layers
    kv_window: float  # in the sliding-window layers
    peak: float
    overhead: float
    spec: ModelSpec

    def moved(self, rows, passes: int = 1) -> tuple:
        """A step's (rows, tokens, weight bytes, KV read, KV written, attention FLOPs): the part that depends on which
        experts the tokens touch and how far back each layer looks."""
        n_rows, tokens, cached, keys = tally(rows)
        weights, spec = self.streamed, self.spec  # (the embedding rows looked up: the callers add them)
        if spec.experts:
            weights += self.expert_slot * expected_experts(spec.experts, spec.experts_per_token, tokens)
        kv_read, attention = passes * self.kv * cached, self.flops_key * keys
        if spec.window_layers:
            cached_w, keys_w = kv_layout.window_tally(rows, spec.sliding_window)
            kv_read += passes * self.kv_window * cached_w
            attention += self.flops_key_window * keys_w
        return n_rows, tokens, weights, kv_read, (self.kv + self.kv_window) * tokens, attention


@lru_cache(maxsize=256)
def _per_model(spec: ModelSpec, device: Device, dtype: str, kv_dtype: str, kernels: Kernels) -> PerModel:
    check_dtypes(dtype, kv_dtype)
    act = 4 if dtype == "fp32" else 2
    slot = expert_slot_bytes(spec, expert_weight_bytes(dtype), act)
    streamed = streamed_weight_bytes(spec, dtype) - spec.experts * slot  # the embedding table is looked up
    per_key = kv_layout.attention_flops_per_key(spec)  # q.k and p.v, per query head
    full_layers = spec.layers - spec.window_layers
    # Every matmul reads its input and writes its output (norms, RoPE, SiLU are fused in a serving engine); an MoE
    # layer's MLP is as wide as the experts a token runs.
    mlp = spec.dense_layers * spec.intermediate + spec.moe_layers * (
        (spec.experts_per_token + spec.shared_experts) * spec.expert_intermediate)  # fmt: skip
    per_token_act = act * (spec.layers * (4 * spec.hidden + 2 * spec.q_dim + 2 * spec.kv_dim) + 3 * mlp)
    kv_layer = kv_layout.kv_values_per_layer(spec) * KV_BYTES[kv_dtype]
    peak = device.peak_flops(compute_dtype(dtype, device))
    overhead = (kernels.per_layer * spec.layers + kernels.per_step) * device.launch_s
    return PerModel(streamed, slot, spec.hidden * act, 2 * spec.active_matmul_params, 2 * spec.vocab * spec.hidden,
                    full_layers * per_key, spec.window_layers * per_key, per_token_act, spec.vocab * LOGIT_BYTES,
                    full_layers * kv_layer, spec.window_layers * kv_layer, peak, overhead, spec)  # fmt: skip


def tally(rows) -> tuple[int, int, int, int]:
    """A step's rows, one (new_tokens, cached_tokens_before) each -> (rows, new tokens, cached tokens, keys read),
    where keys counts every (query, key) pair attention computes: token i of a chunk sees before + i + 1 keys."""
    n_rows = tokens = cached = keys = 0
    for new, before in rows:
        if new < 1 or before < 0:
            raise ConfigError(f"a row is (new_tokens >= 1, cached_tokens >= 0), got ({new}, {before})")
        n_rows, tokens, cached = n_rows + 1, tokens + new, cached + before
        keys += new * before + new * (new + 1) // 2
    if not n_rows:
        raise ConfigError("a step needs at least one row")
    return n_rows, tokens, cached, keys


def step_cost(
    spec: ModelSpec,
    device: Device,
    rows,
    dtype: str = "bf16",
    kv_dtype: str = "bf16",
    kernels: Kernels = SERVING_ENGINE,
) -> StepCost:
    """Cost of ONE engine step. `rows`: one (new_tokens, cached_tokens_before) per row: a decode row is
    (1, context), a prefill chunk (chunk_len, tokens already cached). Logits only at each row's last token."""
    pm = _per_model(spec, device, dtype, kv_dtype, kernels)
    n_rows, tokens, streamed, kv_read, kv_write, attention = pm.moved(rows, kernels.kv_passes)
    weights = streamed + pm.embedding_row * tokens
    flops = pm.flops_token * tokens + pm.flops_row * n_rows + attention
    activations = pm.act_token * tokens + pm.act_row * n_rows
    memory_s = (weights + kv_read + kv_write + activations) / device.bandwidth
    compute_s = flops / pm.peak
    time_s = max(memory_s, compute_s) / device.efficiency + pm.overhead
    return StepCost(n_rows, tokens, flops, weights, kv_read, kv_write, activations, memory_s, compute_s, pm.overhead,
                    time_s)  # fmt: skip


def decode_cost(spec, device, batch: int, context: int, dtype="bf16", kv_dtype="bf16", kernels=SERVING_ENGINE):
    """One decode step: `batch` rows, each adding one token after `context` cached ones."""
    if batch < 1 or context < 0:
        raise ConfigError(f"decode needs batch >= 1 and context >= 0, got batch {batch}, context {context}")
    return step_cost(spec, device, [(1, context)] * batch, dtype, kv_dtype, kernels)


def ridge_intensity(device: Device, dtype: str = "bf16") -> float:
    """FLOPs per byte at which the card turns compute-bound: peak / bandwidth."""
    check_dtypes(dtype, "bf16")
    return device.peak_flops(compute_dtype(dtype, device)) / device.bandwidth


def ridge_batch(spec: ModelSpec, device: Device, context: int = 0, dtype="bf16", kv_dtype="bf16") -> float | None:
    """The decode batch at which memory time and compute time meet (the step turns compute-bound).

    Both grow linearly with the batch: memory = weights + batch x (KV and activations per row),
    compute = batch x FLOPs per row. None when a row's KV costs more time than its maths: then
    decode stays memory-bound at any batch (long contexts). A mixture of experts' memory is not linear (each new row
    brings in experts nobody had picked): there, the smallest whole batch that is compute-bound, found by halving."""
    if spec.experts:
        return _first_compute_bound(spec, device, context, dtype, kv_dtype)
    one, two = (decode_cost(spec, device, batch, context, dtype, kv_dtype) for batch in (1, 2))
    memory_per_row, compute_per_row = two.memory_s - one.memory_s, two.compute_s - one.compute_s
    fixed_memory = one.memory_s - memory_per_row  # the weights: paid once per step
    if compute_per_row <= memory_per_row:
        return None
    return fixed_memory / (compute_per_row - memory_per_row)


def _first_compute_bound(spec, device, context, dtype, kv_dtype, most: int = 2**14) -> float | None:
    bound = lambda batch: (lambda c: c.compute_s >= c.memory_s)(decode_cost(spec, device, batch, context, dtype,
                                                                            kv_dtype))  # fmt: skip
    high = 1
    while not bound(high):
        if high >= most:
            return None
        high *= 2
    low = high // 2  # memory-bound (or 0)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if bound(middle) else (middle, high)
    return float(high)


# --- the KV ceiling ------------------------------------------------------------------------------------
def activation_reserve_bytes(spec: ModelSpec, dtype: str = "bf16") -> float:
    """Memory kept free for a step's transient tensors: the biggest live set of one layer over
    RESERVE_TOKENS tokens (in the MLP: residual, normed input, gate and up, SiLU x up), plus fp32
    logits for RESERVE_ROWS rows. vLLM measures this by running a dummy step; we count it."""
    act = 4 if dtype == "fp32" else 2
    width = spec.intermediate if spec.dense_layers else 0  # an MoE layer's: the experts each token runs
    width = max(width, (spec.experts_per_token + spec.shared_experts) * spec.expert_intermediate)
    mlp = 2 * spec.hidden + 3 * width
    attention = 2 * spec.hidden + 2 * spec.q_dim + 2 * spec.kv_dim
    return RESERVE_TOKENS * act * max(mlp, attention) + RESERVE_ROWS * spec.vocab * LOGIT_BYTES


def free_kv_bytes(spec: ModelSpec, device: Device, dtype="bf16", utilization: float = 0.9) -> float:
    """Memory left for the KV cache: device memory x utilization (vLLM's gpu_memory_utilization,
    default 0.9; the rest is the CUDA context and the allocator's slack) - weights - activation reserve.
    Negative: the weights alone do not fit."""
    if not 0 < utilization <= 1:
        raise ConfigError(f"utilization must be in (0, 1], got {utilization}")
    budget = device.memory_bytes * utilization
    return budget - weight_bytes(spec, dtype) - activation_reserve_bytes(spec, dtype)


def kv_blocks(spec, device, dtype="bf16", kv_dtype="bf16", block_size: int = 16, utilization: float = 0.9) -> int:
    """Blocks of `block_size` tokens that fit in the free KV memory (how a paged engine sizes its pool). A block holds
    its tokens in every layer: a sliding-window layer's past its window too (the simulated pool keeps them, as an
    engine without a hybrid allocator does; max_users counts only the window)."""
    if block_size < 1:
        raise ConfigError(f"block_size must be at least 1, got {block_size}")
    free = free_kv_bytes(spec, device, dtype, utilization)
    return max(0, int(free // (block_size * kv_bytes_per_token(spec, kv_dtype))))


def max_users(spec, device, context: int, dtype="bf16", kv_dtype="bf16", block_size=16, utilization=0.9) -> int:
    """Users that fit when each holds `context` tokens of KV (in whole blocks)."""
    if context < 1:
        raise ConfigError(f"context must be at least 1 token, got {context}")
    if spec.window_layers:  # sliding-window layers stop growing at their window
        free = free_kv_bytes(spec, device, dtype, utilization)
        return max(0, int(free // kv_bytes_per_user(spec, context, kv_dtype, block_size)))
    blocks_each = -(-context // block_size)
    return kv_blocks(spec, device, dtype, kv_dtype, block_size, utilization) // blocks_each


def max_context(spec, device, users: int, dtype="bf16", kv_dtype="bf16", block_size=16, utilization=0.9) -> int:
    """The context each of `users` users can hold when they share the KV memory evenly."""
    if users < 1:
        raise ConfigError(f"users must be at least 1, got {users}")
    if spec.window_layers:
        free = max(0.0, free_kv_bytes(spec, device, dtype, utilization))
        per_layer = kv_layout.kv_values_per_layer(spec) * KV_BYTES[kv_dtype]
        return kv_layout.context_that_fits(spec, free / users, per_layer, block_size)
    return kv_blocks(spec, device, dtype, kv_dtype, block_size, utilization) // users * block_size
