"""What one user's KV cache weighs: per layer, per token, and over a whole conversation.

Three layouts, per layer and per cached token (x the KV dtype's bytes):

    keys and values per kv head     2 x kv_heads x head_dim           (Llama, Mistral, Qwen, Mixtral, gpt-oss, Gemma)
    latent attention (MLA)          kv_lora_rank + qk_rope_head_dim   (DeepSeek-V2/V3: one latent that every head
                                    decompresses, plus each key's rotary part; 576 values against the 40,960 that
                                    128 heads' keys (192 wide) and values (128) would take: 71x less)
    a sliding-window layer          as its kind, but only for the last `sliding_window` tokens: past the window its
                                    KV stops growing (Gemma 3: 52 of 62 layers keep 1,024 tokens; gpt-oss: half
                                    keep 128)

The attention compute is counted in the absorbed form serving engines decode MLA in (DeepSeek's FlashMLA, vLLM's and
SGLang's MLA backends): each head's query is multiplied into the latent's space once per token (the same FLOPs as
multiplying through kv_b_proj), then scores the cached latent directly: per cached token and head, kv_lora_rank +
rope multiply-adds for the score and kv_lora_rank for the value; the cache is read once, not decompressed per step.
A prompt chunk is often run decompressed instead (fewer FLOPs per key at long prompts: (192 + 128) against
(576 + 512) per head); pricing it absorbed overcounts a long prompt's attention FLOPs by up to 3.4x (decode, which the
published checks test, is what the absorbed form is for).
"""

from __future__ import annotations

from minillm.card.modelspec import ModelSpec


def kv_values_per_layer(spec: ModelSpec) -> int:
    """Values one token caches in one layer: the latent and the rope key (MLA), else a key and a value per kv head."""
    return spec.kv_lora_rank + spec.qk_rope_head_dim if spec.latent else 2 * spec.kv_heads * spec.head_dim


def full_heads_values_per_layer(spec: ModelSpec) -> int:
    """What the same layer would cache with a key (q.k wide) and a value per head: MLA's 'instead of'."""
    return spec.heads * (spec.head_dim + (spec.v_head_dim or spec.head_dim))


def attention_flops_per_key(spec: ModelSpec) -> int:
    """FLOPs of one (query, cached key) pair in one layer, all heads: scores and the weighted sum of values."""
    if spec.latent:  # absorbed: the score over latent + rope, the value over the latent
        return 2 * spec.heads * (2 * spec.kv_lora_rank + spec.qk_rope_head_dim)
    return 4 * spec.heads * spec.head_dim


def window_tally(rows, window: int) -> tuple[int, int]:
    """A step's rows (new_tokens, cached_before) as a sliding-window layer sees them: (cached tokens it reads, at most
    `window` a row; (query, key) pairs, where token i of a chunk sees min(before + i + 1, window) keys)."""
    cached = keys = 0
    for new, before in rows:
        cached += min(before, window)
        first, last = before + 1, before + new  # each new token's count of visible keys, unwindowed
        if last <= window:
            keys += (first + last) * new // 2
        elif first >= window:
            keys += window * new
        else:
            keys += (first + window) * (window - first + 1) // 2 + window * (last - window)
    return cached, keys


def blocks_of(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def user_kv_bytes(spec: ModelSpec, context: int, per_layer_bytes: float, block_size: int = 16) -> float:
    """One user's KV at `context` tokens, in whole blocks: full layers hold every token, window layers the last
    `sliding_window` (a block's worth more at most)."""
    full = (spec.layers - spec.window_layers) * per_layer_bytes * blocks_of(context, block_size) * block_size
    if not spec.window_layers:
        return full
    kept = blocks_of(min(context, spec.sliding_window), block_size) * block_size
    return full + spec.window_layers * per_layer_bytes * kept


def context_that_fits(spec: ModelSpec, budget: float, per_layer_bytes: float, block_size: int = 16) -> int:
    """The longest context (whole blocks) whose KV fits in `budget` bytes, when some layers keep only a window."""
    per_block_all = spec.layers * per_layer_bytes * block_size
    window_blocks = blocks_of(spec.sliding_window, block_size)
    if budget < window_blocks * per_block_all:  # the window is not full yet: every layer grows
        return max(0, int(budget // per_block_all)) * block_size
    full_layers = spec.layers - spec.window_layers
    if not full_layers:  # every layer windowed: any context fits once the window does
        return spec.max_context or 2**31
    rest = budget - window_blocks * per_block_all
    return (window_blocks + int(rest // (full_layers * per_layer_bytes * block_size))) * block_size


def kv_lines(spec: ModelSpec, context: int, per_token_bytes: float, user_bytes: float, kv_bytes: float) -> list[str]:
    """The lines that say why this model's KV is what it is (none for plain grouped-query attention)."""
    lines = []
    if spec.latent:
        instead = spec.layers * full_heads_values_per_layer(spec) * kv_bytes
        ratio, values, full = instead / per_token_bytes, kv_values_per_layer(spec), full_heads_values_per_layer(spec)
        lines.append(f"latent attention: {per_token_bytes / 1024:.1f} KiB per token instead of "
                     f"{instead / 2**20:.1f} MiB with every head's keys and values ({ratio:.0f}x less: {values} "
                     f"values a layer, not {full:,})")  # fmt: skip
    if spec.window_layers:
        every = per_token_bytes * blocks_of(context, 16) * 16
        lines.append(f"sliding window: {spec.window_layers} of {spec.layers} layers keep only the last "
                     f"{spec.sliding_window:,} tokens: {user_bytes / 2**20:,.0f} MiB per user at {context:,} tokens "
                     f"instead of {every / 2**20:,.0f} MiB")  # fmt: skip
    return lines
