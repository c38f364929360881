"""Lesson 07 exercise: the roofline and the KV ceiling, on plain numbers. Check your work: pytest -m lesson07

No minillm here: the physics is yours. A Model is what a config.json says, a Card what a datasheet prints.
Units as the datasheets use them: memory in GiB (a "24 GB" card has 24 x 2**30 bytes), bandwidth in GB/s
(10**9 bytes per second), tensor TFLOP/s (10**12 FLOP per second). Times in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

GiB = 2**30
GB = 1e9
TERA = 1e12


@dataclass(frozen=True)
class Model:
    """A Llama-style decoder, from its config.json. (Given: nothing to write here.)"""

    params: int  # all its weights: what the card's memory holds
    # The input embedding table (vocab_size x hidden_size), when it is a matrix of its own: a decode step looks up
    # one row of it per user, it does not stream it or multiply through it. 0 when the table is tied to lm_head
    # (tie_word_embeddings: true), which multiplies through all of it at every step.
    embedding_params: int
    layers: int  # num_hidden_layers
    heads: int  # num_attention_heads: query heads
    kv_heads: int  # num_key_value_heads: key/value heads, each shared by heads // kv_heads query heads (GQA)
    head_dim: int  # numbers per head


@dataclass(frozen=True)
class Card:
    """A GPU, as its datasheet prints it. (Given: nothing to write here.)"""

    memory_gib: float
    bandwidth_gb_s: float
    tensor_tflops: float  # the bf16 tensor TFLOP/s figure as printed
    with_sparsity: bool  # True when that figure is "with sparsity" (2:4 structured): twice what a dense model gets


def kv_bytes_per_token(model: Model, kv_bits: float = 16) -> float:
    """Bytes of KV cache one token takes: its key and its value, in every layer, for every key/value head.

    kv_bits: bits per cached number (16 for bf16 or fp16, 8 for fp8, 4 for int4: any positive number, not
    always whole bytes).
    """
    raise NotImplementedError("lesson 07: the bytes one token's keys and values take in the KV cache")


def decode_step_time(
    model: Model, card: Card, batch: int, context: int, weight_bits: float = 16, kv_bits: float = 16
) -> float:
    """Seconds for one decode step of `batch` users, each with `context` tokens already cached: the ideal
    roofline, at 100% of the datasheet and with no fixed cost per kernel.

    The step multiplies every user's new token through every weight but the embedding table (looked up, a row
    per user: count nothing for it).
    Bytes: each of those weights once per step, whatever the batch, plus every user's `context` cached tokens
    of KV (the new token's own key and value: count nothing for them).
    FLOPs: 2 per weight multiplied through, per user (a multiply and an add).
    time = the larger of bytes / bandwidth and FLOPs / the card's DENSE FLOP/s.
    weight_bits: bits per weight (16: bf16, 8: fp8, 4.125: int4 with a 16-bit scale per 128 weights), kv_bits as
    in kv_bytes_per_token: bits, not always whole bytes. batch >= 1, context >= 0.
    """
    raise NotImplementedError("lesson 07: the roofline's time for one decode step")


def max_users(
    model: Model,
    card: Card,
    context: int,
    weight_bits: float = 16,
    kv_bits: float = 16,
    utilization: float = 0.9,
    reserve_gib: float = 0.5,
) -> int:
    """How many users with `context` tokens each fit. Usable memory is utilization x the card's memory; all the
    weights sit in it (the embedding table too), and reserve_gib GiB stay free for one step's activations;
    the KV cache gets the rest. A user fits whole or not at all: return an int, rounded down (where the users
    that fit come out a whole number, to the byte, either that number or one less is accepted: float rounding);
    0 when nobody fits, or when the weights and the reserve already fill the usable memory. context >= 1;
    0 < utilization <= 1; reserve_gib >= 0."""
    raise NotImplementedError("lesson 07: how many users' KV caches fit next to the weights")
