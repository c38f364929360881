"""Picking each row's next token: greedy by default (one argmax for a batch of greedy rows), or drawn.

A request with temperature > 0 draws from its logits divided by the temperature (higher: flatter), cut to the
top_k most likely tokens and to the fewest whose probabilities reach top_p. Every draw comes from a generator of the
request's own, seeded by (its seed, the reply position, what the draw is for): the same reply whatever shares its
batch, in any seat, preempted or not (batch invariance), never a stream shared with other requests. A request
without a seed gets one when the engine takes it (Request.rng_seed), so it too draws only from its own streams.

A constrained row (constrain.py) picks only among the tokens its mask allows: the mask is applied to the logits
first, so greedy and sampled rows alike obey it. At a position where a speculating row guessed a token (speculate.py),
a sampled row keeps the guess with probability min(1, p / q) and otherwise draws from the residual max(0, p - q),
normalised: p the model's distribution there, q the drafter's (Leviathan et al. 2023, Chen et al. 2023). The kept
tokens are then distributed exactly as if the model had drawn them one by one.
"""

from __future__ import annotations

import torch

from minillm.config import Sampling
from minillm.model.tokenizer import EOS

DRAW, ACCEPT, RESIDUAL, DRAFT = 0, 1, 2, 3  # what a random number is for (its generator's seed includes it)


def sample(logits: torch.Tensor, requests: list, masks: torch.Tensor | None = None, guesses: list | None = None,
           ) -> list[int]:  # fmt: skip
    """logits (R, V), a row per pick -> each pick's token. requests (R,): whose pick (a verify row's request appears
    once per position, in order); masks (R, V) bool: allowed tokens (constrain.py); guesses (R,): at a guessed
    position of a sampled row, (the guessed token, the drafter's probabilities (V,) or None for a sure guess).
    A request that ignores EOS never picks it; one that asks for logprobs gets (chosen token's logprob, top ids,
    their logprobs) added to its output_logprobs."""
    picked = allowed_logits(logits, requests, masks)
    tokens = picked.argmax(dim=-1).tolist()  # the greedy rows' tokens (usually every row's)
    offsets: dict[int, int] = {}  # a request's picks so far in this call: a verify row picks at several positions
    for i, r in enumerate(requests):
        offset = offsets[id(r)] = offsets.get(id(r), -1) + 1
        if r.sampling.temperature > 0:
            position, guess = len(r.output_ids) + offset, guesses[i] if guesses else None
            if guess is None:
                tokens[i] = draw(picked[i], r.sampling, position, seed_of(r))
            else:
                tokens[i] = keep_or_resample(probabilities(picked[i], r.sampling), *guess, seed_of(r), position)
        if r.sampling.logprobs is not None:
            logprobs = logits[i].float().log_softmax(dim=-1)  # (V,) the model's own, before any cut
            top = logprobs.topk(r.sampling.logprobs)
            r.output_logprobs.append((logprobs[tokens[i]].item(), top.indices.tolist(), top.values.tolist()))
    return tokens


def allowed_logits(logits: torch.Tensor, requests: list, masks: torch.Tensor | None) -> torch.Tensor:
    """logits (R, V) with what a row may not pick at -inf: EOS for a row that ignores it, tokens outside its mask."""
    if masks is None and not any(r.ignore_eos for r in requests):
        return logits
    picked = logits.clone()
    if masks is not None:
        picked.masked_fill_(~masks, float("-inf"))
    ignoring = [i for i, r in enumerate(requests) if r.ignore_eos]
    if ignoring:
        picked[ignoring, EOS] = float("-inf")
    return picked


def give_own_seed(r) -> None:
    """A sampled request without a seed gets one (from torch's generator: torch.manual_seed still replays a run)."""
    if r.sampling.temperature > 0 and r.sampling.seed is None and r.rng_seed is None:
        r.rng_seed = int(torch.randint(2**62, ()).item())


def seed_of(r) -> int | None:
    return r.sampling.seed if r.sampling.seed is not None else getattr(r, "rng_seed", None)


def generator(seed: int | None, position: int, purpose: int = DRAW) -> torch.Generator | None:
    """The generator for one draw: seeded by (seed, reply position, purpose); None (torch's global one) without a
    seed. (A tuple of ints hashes the same in every process, unlike one holding text.)"""
    if seed is None:
        return None
    key = (seed, position) if purpose == DRAW else (seed, position, purpose)  # (a plain draw keeps its old seeds)
    return torch.Generator().manual_seed(hash(key) % 2**63)


def probabilities(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """logits (V,) -> the distribution a draw takes (V,) float64: temperature-scaled, cut by top_k and top_p."""
    # (the largest logit first brought to 0: a tiny temperature then sends the others to -inf, never inf - inf = nan)
    scaled = (logits.double() - logits.max()) / s.temperature
    if s.top_k:
        scaled[scaled < scaled.topk(min(s.top_k, scaled.numel())).values[-1]] = float("-inf")
    probs = scaled.softmax(dim=-1)  # (V,)
    if s.top_p < 1:
        ranked, order = probs.sort(descending=True)
        probs[order[ranked.cumsum(0) - ranked >= s.top_p]] = 0.0  # those after the set already reached top_p
    return probs


def draw(logits: torch.Tensor, s: Sampling, position: int, seed: int | None = None, purpose: int = DRAW) -> int:
    """logits (V,) -> a token drawn from the temperature-scaled distribution, cut by top_k and top_p."""
    seed = s.seed if seed is None else seed
    return torch.multinomial(probabilities(logits, s).cpu(), 1, generator=generator(seed, position, purpose)).item()


def keep_or_resample(p: torch.Tensor, guess: int, q: torch.Tensor | None, seed: int | None, position: int) -> int:
    """The rejection rule at one guessed position, with this position's random numbers (its own generators)."""
    u = torch.rand((), dtype=torch.float64, generator=generator(seed, position, ACCEPT)).item()
    draw = lambda dist: torch.multinomial(dist, 1, generator=generator(seed, position, RESIDUAL)).item()
    return rejection_rule(p.cpu(), None if q is None else q.cpu().to(p.dtype), guess, u, draw)


def rejection_rule(p: torch.Tensor, q: torch.Tensor | None, guess: int, u: float, draw) -> int:
    """p (V,): the model's distribution; q (V,): the drafter's, the guess drawn from it (None: the guess was certain,
    as prompt lookup's is: q is all on it); u uniform in [0, 1); draw(dist): a token drawn from dist (V,). Keep the
    guess with probability min(1, p[guess] / q[guess]); else draw from max(0, p - q), normalised (never the guess: a
    guess is only rejected where q gives it more than p does). Lesson 14's exercise is this function."""
    q_guess = 1.0 if q is None else float(q[guess])
    if u * q_guess < float(p[guess]):
        return guess
    if q is None:
        residual = p.clone()
        residual[guess] = 0.0
    else:
        residual = (p - q).clamp(min=0.0)
    if not residual.sum() > 0:  # (p equals q up to rounding: nothing is left to draw from but p)
        residual = p.clone()
    return draw(residual / residual.sum())


def draft_picks(logits: torch.Tensor, requests: list, positions: list[int], masks: torch.Tensor | None,
                ) -> list[tuple[int, torch.Tensor | None]]:  # fmt: skip
    """A drafter's guesses: logits (R, V) of its model, a row per request, each guessing reply position `positions[i]`
    -> (guess, q): a greedy request's argmax (q None), a sampled one's draw from q (V,), its distribution there, kept
    for the rejection rule. Drawn from generators of their own (DRAFT): the model's draws never depend on them."""
    picked = allowed_logits(logits, requests, masks)
    greedy = picked.argmax(dim=-1).tolist()
    out = []
    for i, (r, position) in enumerate(zip(requests, positions)):
        if r.sampling.temperature > 0:
            q = probabilities(picked[i], r.sampling).cpu()
            out.append((torch.multinomial(q, 1, generator=generator(seed_of(r), position, DRAFT)).item(), q))
        else:
            out.append((greedy[i], None))
    return out
