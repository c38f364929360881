"""Generation for one prompt: the decode loop, with and without a KV cache.

Decoding is a loop: run the model, pick the next token, append it, repeat until EOS
or the token budget runs out. `generate(..., use_cache=False)` is the plain loop that
re-reads the whole sequence every step: slow, obviously right, and the reference that
every faster path (cached, batched, paged, preempted) must match token for token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minillm.engine.kv_cache import ContiguousKVCache
from minillm.errors import InputError
from minillm.model.tokenizer import EOS, VOCAB_SIZE
from minillm.model.transformer import Transformer


@dataclass
class Generation:
    tokens: list[int]  # the reply, without EOS
    finish_reason: str  # "eos" or "length"


def check_request(prompt_ids: list[int], max_new_tokens: int | None, context: int) -> int:
    """Validate a request against the model's context; returns the effective max_new_tokens."""
    if len(prompt_ids) == 0:
        raise InputError("the prompt is empty; give at least one token (e.g. --prompt 'count down from 12')")
    if any(not 0 <= t < VOCAB_SIZE for t in prompt_ids):
        raise InputError(f"prompt ids must lie in [0, {VOCAB_SIZE}); got {min(prompt_ids)}..{max(prompt_ids)}")
    if len(prompt_ids) >= context:
        raise InputError(
            f"the prompt is {len(prompt_ids)} tokens but the model's context is {context}: "
            f"shorten the prompt to at most {context - 1} tokens"
        )
    room = context - len(prompt_ids)
    if max_new_tokens is None:
        return room
    if max_new_tokens < 1:
        raise InputError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if max_new_tokens > room:
        raise InputError(
            f"the prompt ({len(prompt_ids)} tokens) plus max_new_tokens ({max_new_tokens}) exceeds the "
            f"context of {context} tokens; use max_new_tokens <= {room}"
        )
    return max_new_tokens


def sample_next(
    logits: torch.Tensor, temperature: float = 0.0, top_k: int | None = None, generator: torch.Generator | None = None
) -> torch.Tensor:
    """logits (B, V) -> next token ids (B,). temperature 0 means greedy (argmax)."""
    if temperature < 0:
        raise InputError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None:
        if top_k < 1:
            raise InputError(f"top_k must be at least 1, got {top_k}")
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(-1).to(logits.device)


@torch.no_grad()
def generate(
    model: Transformer,
    prompt_ids: list[int],
    max_new_tokens: int | None = None,
    temperature: float = 0.0,
    top_k: int | None = None,
    seed: int | None = None,
    use_cache: bool = True,
    ignore_eos: bool = False,
) -> Generation:
    """Generate a reply to one prompt until EOS or max_new_tokens (default: until the context is full).

    ignore_eos: never pick EOS, so the reply runs to exactly max_new_tokens (fixed-length workloads)."""
    budget = check_request(prompt_ids, max_new_tokens, model.cfg.max_seq_len)
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    cache = ContiguousKVCache(model.cfg, num_seats=1, device=device) if use_cache else None
    sequence = torch.tensor([prompt_ids], device=device)  # (1, T)
    new_input = sequence  # what the model must read this step
    reply: list[int] = []
    for _ in range(budget):
        if cache is None:
            logits = model(sequence, last_only=True)  # re-read everything
        else:
            positions = cache.prepare([0], new_input.shape[1])
            logits = model(new_input, positions, cache, last_only=True)  # read only what is new
        if ignore_eos:
            logits[..., EOS] = float("-inf")
        token = sample_next(logits[:, -1], temperature, top_k, generator)  # (1,)
        if token.item() == EOS:
            return Generation(reply, "eos")
        reply.append(token.item())
        new_input = token[:, None]  # (1, 1)
        sequence = torch.cat([sequence, new_input], dim=1)
    return Generation(reply, "length")
