"""Sampling beyond greedy: temperature, top-k, top-p, seeds, logprobs. Plugs into the pick seam.

A request with temperature > 0 draws from its logits divided by the temperature (higher: flatter),
cut to the top_k most likely tokens and to the fewest whose probabilities reach top_p. Every draw
comes from a generator of the request's own, seeded by (its seed, the reply position, what the draw
is for): the same reply whatever shares its batch, in any seat, preempted or not (batch invariance),
never a stream shared with other requests. A request without a seed is given one when it is
submitted, so it too draws only from its own streams (and a copy handed to another engine with it).

A constrained row (constrain.py) picks only among the tokens its mask allows: the mask is applied to
the logits first, so greedy and sampled rows alike obey it. At a position where a speculating row
guessed a token (speculate.py), a sampled row keeps the guess with probability min(1, p / q) and
otherwise draws from the residual max(0, p - q), normalised: p the model's distribution there, q the
drafter's (Leviathan et al. 2023, Chen et al. 2023). The kept tokens are then distributed exactly as
if the model had drawn them one by one.

Seams: pick (Sampler.pick), after the step (Sampler.after_step; the trace records `allowed`: the
tokens each constrained row could pick). Its state per request: logprobs and the drafter's q.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from minillm.config import Sampling
from minillm.engine.packing import Batch
from minillm.engine.request import Request
from minillm.engine.runner import without_eos
from minillm.layers.constrain import Constraints

DRAW, ACCEPT, RESIDUAL, DRAFT = 0, 1, 2, 3  # what a random number is for (part of its generator's seed)


class Sampler:
    """The pick seam for every request: greedy, drawn, masked by a pattern, or settling a guess."""

    def __init__(self):
        self.constraints = Constraints()
        self.logprobs: dict[str, list[tuple]] = {}  # request id -> (chosen logprob, top ids, top logprobs)
        self.q: dict[str, list[torch.Tensor]] = {}  # request id -> the drafter's distribution per guess
        self.allowed: dict[str, int] = {}  # this step: constrained request id -> tokens it could pick

    def on_submit(self, r: Request) -> str | None:
        if r.sampling.constraint is not None and r.ignore_eos:
            return "a constrained reply ends where its pattern does: it cannot ignore EOS"
        if r.sampling.temperature > 0 and r.sampling.seed is None:  # streams of its own (from torch's
            r.sampling = replace(r.sampling, seed=int(torch.randint(2**62, ()).item()))  # generator)
        if r.sampling.logprobs is not None:
            self.logprobs[r.id] = self.logprobs.get(r.id, []) if r.output_ids else []
        return None

    def pick(self, logits: torch.Tensor, batch: Batch) -> list[int]:
        """logits (R, V), a row per logit position -> each position's token. A request that ignores
        EOS never picks it; one that asks for logprobs gets (chosen token's logprob, top ids, their
        logprobs) added to self.logprobs[its id]."""
        requests = batch.pickers  # (R,) a row with a lookahead appears once per position
        masks = self.constraints.masks(batch, logits.shape[-1], logits.device)  # (R, V) or None
        self.allowed = self.constraints.allowed_counts(batch)
        picked = allowed_logits(logits, requests, masks)
        tokens = picked.argmax(dim=-1).tolist()  # the greedy rows' tokens (usually every row's)
        offsets: dict[int, int] = {}  # a request's picks so far in this call
        for i, r in enumerate(requests):
            j = offsets[id(r)] = offsets.get(id(r), -1) + 1
            if r.sampling.temperature > 0:
                position = len(r.output_ids) + j
                if j < batch.lookahead[batch.logit_rows[i]]:  # a guess: the rejection rule settles it
                    q = self.q.get(r.id)
                    p = probabilities(picked[i], r.sampling)
                    guess = r.lookahead[j]
                    tokens[i] = keep_or_resample(p, guess, q[j] if q else None, r.sampling.seed, position)
                else:
                    tokens[i] = draw(picked[i], r.sampling, position)
            if r.sampling.logprobs is not None:
                logprobs = logits[i].float().log_softmax(dim=-1)  # (V,) the model's own, before any cut
                top = logprobs.topk(r.sampling.logprobs)
                entry = (logprobs[tokens[i]].item(), top.indices.tolist(), top.values.tolist())
                self.logprobs.setdefault(r.id, []).append(entry)
        return tokens

    def after_step(self, engine, step) -> None:
        """After the step (and its record, trace.py): forget this step's counts and finished rows."""
        self.allowed = {}
        self.constraints.forget_finished()


def allowed_logits(logits: torch.Tensor, requests: list, masks: torch.Tensor | None) -> torch.Tensor:
    """logits (R, V) with what a row may not pick at -inf: tokens outside a row's mask, and EOS where it
    is ignored (as the core's greedy pick does: runner.without_eos)."""
    if masks is not None:
        logits = logits.masked_fill(~masks, float("-inf"))
    return without_eos(logits, requests)


def generator(seed: int | None, position: int, purpose: int = DRAW) -> torch.Generator | None:
    """The generator for one draw: seeded by (seed, reply position, purpose); None (torch's global
    one) without a seed. (A tuple of ints hashes the same in every process, unlike one with text.)"""
    if seed is None:
        return None
    key = (seed, position) if purpose == DRAW else (seed, position, purpose)  # (draws keep old seeds)
    return torch.Generator().manual_seed(hash(key) % 2**63)


def probabilities(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """logits (V,) -> the distribution a draw takes (V,) float64: temperature-scaled, cut by top_k
    and top_p."""
    # (the largest logit first brought to 0: a tiny temperature then sends the others to -inf, never
    # inf - inf = nan)
    scaled = (logits.double() - logits.max()) / s.temperature
    if s.top_k:
        scaled[scaled < scaled.topk(min(s.top_k, scaled.numel())).values[-1]] = float("-inf")
    probs = scaled.softmax(dim=-1)  # (V,)
    if s.top_p < 1:
        ranked, order = probs.sort(descending=True)
        probs[order[ranked.cumsum(0) - ranked >= s.top_p]] = 0.0  # after the set reached top_p
    return probs


def draw(logits: torch.Tensor, s: Sampling, position: int, seed: int | None = None, purpose=DRAW) -> int:
    """logits (V,) -> a token drawn from the temperature-scaled distribution, cut by top_k, top_p."""
    seed = s.seed if seed is None else seed
    dist = probabilities(logits, s).cpu()
    return torch.multinomial(dist, 1, generator=generator(seed, position, purpose)).item()


def keep_or_resample(p: torch.Tensor, guess: int, q: torch.Tensor | None, seed, position: int) -> int:
    """The rejection rule at one guessed position, with this position's random numbers."""
    u = torch.rand((), dtype=torch.float64, generator=generator(seed, position, ACCEPT)).item()
    draw = lambda dist: torch.multinomial(dist, 1, generator=generator(seed, position, RESIDUAL)).item()
    return rejection_rule(p.cpu(), None if q is None else q.cpu().to(p.dtype), guess, u, draw)


def rejection_rule(p: torch.Tensor, q: torch.Tensor | None, guess: int, u: float, draw) -> int:
    """p (V,): the model's distribution; q (V,): the drafter's, the guess drawn from it (None: the
    guess was certain, as prompt lookup's is: q is all on it); u uniform in [0, 1); draw(dist): a
    token drawn from dist (V,). Keep the guess with probability min(1, p[guess] / q[guess]); else
    draw from max(0, p - q), normalised (never the guess: a guess is only rejected where q gives it
    more than p does). Lesson 14's exercise is this function."""
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


def draft_picks(logits: torch.Tensor, requests: list, positions: list[int], masks) -> list[tuple]:
    """A drafter's guesses: logits (R, V) of its model, a row per request, each guessing reply
    position `positions[i]` -> (guess, q): a greedy request's argmax (q None), a sampled one's draw
    from q (V,), its distribution there, kept for the rejection rule. Drawn from generators of their
    own (DRAFT): the model's draws never depend on them."""
    picked = allowed_logits(logits, requests, masks)
    greedy = picked.argmax(dim=-1).tolist()
    out = []
    for i, (r, position) in enumerate(zip(requests, positions)):
        if r.sampling.temperature > 0:
            q = probabilities(picked[i], r.sampling).cpu()
            g = generator(r.sampling.seed, position, DRAFT)
            out.append((torch.multinomial(q, 1, generator=g).item(), q))
        else:
            out.append((greedy[i], None))
    return out
