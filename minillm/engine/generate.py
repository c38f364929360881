"""Generation for one prompt: the decode loop, with and without a KV cache.

Decoding is a loop: run the model, pick the next token, append it, repeat until EOS
or the token budget runs out. `generate(..., use_cache=False)` is the plain loop that
re-reads the whole sequence every step: slow, obviously right, and the reference that
every faster path (cached, batched, paged, preempted) must match token for token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minillm.config import Sampling
from minillm.engine.constrain import advance
from minillm.engine.kv_cache import ContiguousKVCache
from minillm.engine.request import Request
from minillm.engine.sampler import sample
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
        raise InputError(f"the prompt is {len(prompt_ids)} tokens but the model's context is {context}: "
                         f"shorten the prompt to at most {context - 1} tokens")  # fmt: skip
    room = context - len(prompt_ids)
    if max_new_tokens is None:
        return room
    if max_new_tokens < 1:
        raise InputError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if max_new_tokens > room:
        raise InputError(f"the prompt ({len(prompt_ids)} tokens) plus max_new_tokens ({max_new_tokens}) exceeds the "
                         f"context of {context} tokens; use max_new_tokens <= {room}")  # fmt: skip
    return max_new_tokens


@torch.no_grad()
def generate(model: Transformer, prompt_ids: list[int], max_new_tokens: int | None = None, temperature: float = 0.0,
             top_k: int = 0, seed: int | None = None, use_cache: bool = True, ignore_eos: bool = False,
             top_p: float = 1.0, constraint=None) -> Generation:  # fmt: skip
    """Generate a reply to one prompt until EOS or max_new_tokens (default: until the context is full).

    ignore_eos: never pick EOS, so the reply runs to exactly max_new_tokens (fixed-length workloads).
    temperature, top_k, top_p, seed: as the engine's requests sample (sampler.py); temperature 0 is greedy.
    constraint: an automaton the reply must follow (grammar/automaton.py): each pick among the tokens it allows."""
    budget = check_request(prompt_ids, max_new_tokens, model.cfg.max_seq_len)
    if constraint is not None and ignore_eos:
        raise InputError("a constrained reply ends where its pattern does: it cannot ignore EOS")
    device = next(model.parameters()).device
    request = Request("generate", prompt_ids, budget, ignore_eos=ignore_eos,
                      sampling=Sampling(temperature, top_p, top_k or 0, seed), constraint=constraint)  # fmt: skip
    cache = ContiguousKVCache(model.cfg, num_seats=1, device=device) if use_cache else None
    sequence = torch.tensor([prompt_ids], device=device)  # (1, T)
    new_input = sequence  # what the model must read this step
    reply = request.output_ids
    for _ in range(budget):
        if cache is None:
            logits = model(sequence, last_only=True)  # re-read everything
        else:
            positions = cache.prepare([0], new_input.shape[1])
            logits = model(new_input, positions, cache, last_only=True)  # read only what is new
        mask = None if constraint is None else constraint.mask(request.constraint_state, device)[None]  # (1, V)
        token = sample(logits[:, -1], [request], mask)[0]
        if token == EOS:
            return Generation(reply, "eos")
        reply.append(token)
        advance(request, token)
        new_input = torch.tensor([[token]], device=device)  # (1, 1)
        sequence = torch.cat([sequence, new_input], dim=1)
    return Generation(reply, "length")
