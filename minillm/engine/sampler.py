"""Picking each row's next token: greedy by default (one argmax for a batch of greedy rows), or drawn.

A request with temperature > 0 draws from its logits divided by the temperature (higher: flatter), cut to the
top_k most likely tokens and to the fewest whose probabilities reach top_p. A seeded request draws with a
generator seeded by (seed, its position in the reply): the same reply whatever shares its batch, preempted or not.
"""

from __future__ import annotations

import torch

from minillm.config import Sampling
from minillm.model.tokenizer import EOS


def sample(logits: torch.Tensor, requests: list) -> list[int]:
    """logits (R, V), a row per request -> each one's next token. A request that ignores EOS never picks it; one
    that asks for logprobs gets (chosen token's logprob, top ids, their logprobs) added to its output_logprobs."""
    picked = logits
    if any(r.ignore_eos for r in requests):
        picked = logits.clone()
        picked[[i for i, r in enumerate(requests) if r.ignore_eos], EOS] = float("-inf")
    tokens = picked.argmax(dim=-1).tolist()  # the greedy rows' tokens (usually every row's)
    for i, r in enumerate(requests):
        if r.sampling.temperature > 0:
            tokens[i] = draw(picked[i], r.sampling, len(r.output_ids))
        if r.sampling.logprobs is not None:
            logprobs = logits[i].float().log_softmax(dim=-1)  # (V,) the model's own, before any cut
            top = logprobs.topk(r.sampling.logprobs)
            r.output_logprobs.append((logprobs[tokens[i]].item(), top.indices.tolist(), top.values.tolist()))
    return tokens


def draw(logits: torch.Tensor, s: Sampling, position: int) -> int:
    """logits (V,) -> a token drawn from the temperature-scaled distribution, cut by top_k and top_p."""
    # (the largest logit first brought to 0: a tiny temperature then sends the others to -inf, never inf - inf = nan)
    scaled = (logits.double() - logits.max()) / s.temperature
    if s.top_k:
        scaled[scaled < scaled.topk(min(s.top_k, scaled.numel())).values[-1]] = float("-inf")
    probs = scaled.softmax(dim=-1)  # (V,)
    if s.top_p < 1:
        ranked, order = probs.sort(descending=True)
        probs[order[ranked.cumsum(0) - ranked >= s.top_p]] = 0.0  # those after the set already reached top_p
    generator = None if s.seed is None else torch.Generator().manual_seed(hash((s.seed, position)) % 2**63)
    return torch.multinomial(probs.cpu(), 1, generator=generator).item()
