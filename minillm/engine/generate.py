"""Generation for one prompt: the decode loop, with and without a KV cache.

Decoding is a loop: run the model, pick the next token, append it, repeat until EOS or the token
budget runs out. `generate(..., use_cache=False)` re-reads the whole sequence every step: slow,
obviously right, and the reference every faster path (cached, batched, paged, preempted) must
match token for token. It picks as the engine does (runner.Greedy, or a layer's picker).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minillm.config import Sampling
from minillm.engine.kv_cache import ContiguousKVCache
from minillm.engine.packing import pack
from minillm.engine.request import Request, problem
from minillm.engine.runner import Greedy, Picker
from minillm.errors import InputError
from minillm.model.tokenizer import EOS
from minillm.model.transformer import Transformer


@dataclass
class Generation:
    tokens: list[int]  # the reply, without EOS
    finish_reason: str  # "eos" or "length"


@torch.no_grad()
def generate(
    model: Transformer,
    prompt_ids: list[int],
    max_new_tokens: int | None = None,
    use_cache: bool = True,
    ignore_eos: bool = False,
    sampling: Sampling | None = None,
    picker: Picker | None = None,
) -> Generation:
    """Generate a reply to one prompt until EOS or max_new_tokens (default: until the context is
    full). ignore_eos: never pick EOS, so the reply runs to exactly max_new_tokens."""
    context, picker = model.cfg.max_seq_len, picker or Greedy()
    budget = max_new_tokens if max_new_tokens is not None else max(1, context - len(prompt_ids))
    request = Request("generate", list(prompt_ids), budget, ignore_eos=ignore_eos)
    request.sampling = sampling or Sampling()
    refused = problem(request, model.cfg.vocab_size, context) or picker.on_submit(request)
    if refused:
        raise InputError(refused)
    device = next(model.parameters()).device
    cache = ContiguousKVCache(model.cfg, num_seats=1, device=device) if use_cache else None
    reply = request.output_ids
    for _ in range(budget):
        batch = pack([(request, request.num_pending)])  # new tokens (all, without a cache)
        tokens = torch.tensor([batch.token_ids], device=device)  # (1, T)
        positions = None if cache is None else cache.prepare([0], tokens.shape[1])
        logits = model(tokens, positions, cache, last_only=True)  # (1, 1, V)
        token = picker.pick(logits[:, -1], batch)[0]
        if token == EOS:
            return Generation(reply, "eos")
        reply.append(token)
        request.num_computed = request.num_tokens - 1 if cache is not None else 0
    return Generation(reply, "length")
