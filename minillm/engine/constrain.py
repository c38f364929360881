"""Constrained decoding: a request's reply must match a pattern, and each step its automaton says which tokens may
come next.

A request may carry a constraint (grammar/automaton.py: a DFA over bytes, compiled from a regex or a JSON schema by
whoever built the request, e.g. the server). The engine keeps the automaton's state as tokens are accepted; before a
row picks, its logits outside the state's allowed tokens are set to -inf, so greedy decoding and sampling alike can
only pick a token the pattern allows (EOS only where the pattern may end). vLLM and SGLang do the same with a
bitmask per row built on the CPU each step; here a state's mask is built once and kept by the automaton.

The scheduler never sees a constraint: it changes which token a row picks, not how many tokens a row runs. A verify
row (speculate.py) picks at each of its positions: position j is after the row's state walked the first j guesses
(a guess the pattern does not allow there leads nowhere; the pick at its position is then an allowed token, unequal
to the guess, so the guess is rejected and later positions do not count).
A preempted request keeps its reply and so its state: the state depends only on the tokens accepted, which
preemption keeps (only their keys and values are computed again).
"""

from __future__ import annotations

import torch

from minillm.engine.packing import Batch
from minillm.engine.request import Request
from minillm.grammar.automaton import DEAD


def position_states(r: Request, draft: list[int]) -> list[int]:
    """The automaton's state at each pick of a row: after the reply so far, then after each guess of `draft`."""
    states = [r.constraint_state]
    for token in draft:
        states.append(r.constraint.step(states[-1], token))
    return states


def logit_masks(batch: Batch, vocab: int, device) -> torch.Tensor | None:
    """(R, vocab) bool: the tokens each logit position may pick (True: allowed); None when no row is constrained."""
    if not any(r.constraint is not None for r in batch.sampled):
        return None
    anything = torch.ones(vocab, dtype=torch.bool, device=device)
    masks, states = [], {}
    for row in batch.logit_rows:
        r = batch.requests[row]
        if r.constraint is not None and row not in states:
            states[row] = iter(position_states(r, r.draft[: batch.drafts[row]]))
        state = next(states[row]) if r.constraint is not None else DEAD
        masks.append(anything if state == DEAD else r.constraint.mask(state, device))  # (after a refused guess: any)
    return torch.stack(masks)


def draft_masks(requests: list[Request], drafts: list[list[int]], vocab: int, device) -> torch.Tensor | None:
    """(R, vocab) bool: what each request's next guess may be, after its reply and its guesses so far (a drafter
    guesses inside the pattern too, or its guesses would only be rejected); None when none is constrained."""
    if all(r.constraint is None for r in requests):
        return None
    anything = torch.ones(vocab, dtype=torch.bool, device=device)
    states = [position_states(r, d)[-1] if r.constraint is not None else DEAD for r, d in zip(requests, drafts)]
    return torch.stack([anything if s == DEAD else r.constraint.mask(s, device) for r, s in zip(requests, states)])


def allowed_counts(batch: Batch) -> dict[str, int]:
    """For the trace: how many tokens each constrained row that picks this step could pick first."""
    return {
        r.id: r.constraint.allowed_count(r.constraint_state)
        for r in batch.sampled
        if r.constraint is not None and r.constraint_state != DEAD
    }


def advance(r: Request, token: int) -> None:
    """The reply gained `token`: move the automaton on (EOS ends the reply and leaves the state)."""
    if r.constraint is not None:
        r.constraint_state = r.constraint.step(r.constraint_state, token)


def cut_at_first_refusal(r: Request, draft: list[int]) -> list[int]:
    """A drafter's guesses up to the first one the pattern does not allow (it could never be kept)."""
    if r.constraint is None:
        return draft
    states = position_states(r, draft)
    return next((draft[:i] for i, s in enumerate(states[1:]) if s == DEAD), draft)
