"""Constrained decoding: a request's reply must match a pattern, and each pick its automaton says
which tokens may come next. Used by the pick seam's Sampler (sampling.py) and by the drafters.

A request may carry a constraint (Sampling.constraint; grammar/automaton.py: a DFA over bytes,
compiled from a regex or a JSON schema by whoever built the request, e.g. the server). Before a row
picks, its logits outside its state's allowed tokens are set to -inf, so greedy decoding and
sampling alike can only pick a token the pattern allows (EOS only where the pattern may end). vLLM
and SGLang do the same with a bitmask per row built on the CPU each step; here a state's mask is
built once and kept by the automaton.

The scheduler never sees a constraint: it changes which token a row picks, not how many tokens a row
runs. A verify row (speculate.py) picks at each of its positions: position j is after the row's
state walked the first j guesses (a guess the pattern does not allow there leads nowhere; the pick
at its position is then an allowed token, unequal to the guess, so the guess is rejected and later
positions do not count). The state is a function of the reply alone, so it is walked from the
tokens accepted so far and kept by request: a preempted request (its reply kept) or a copy handed to
another engine (its reply so far) stands where its reply says.
"""

from __future__ import annotations

import torch

from minillm.engine.packing import Batch
from minillm.engine.request import Request
from minillm.grammar.automaton import DEAD


class Constraints:
    """Each constrained request's automaton state, walked on from the reply's new tokens."""

    def __init__(self):
        self.walked: dict[int, tuple[Request, int, int]] = {}  # id(r) -> (r, tokens walked, state)

    def state(self, r: Request) -> int:
        """The automaton's state after the reply so far."""
        kept = self.walked.get(id(r))
        request, done, state = kept if kept is not None and kept[0] is r else (r, 0, 0)
        for token in r.output_ids[done:]:
            state = r.sampling.constraint.step(state, token)
        self.walked[id(r)] = (r, len(r.output_ids), state)
        return state

    def forget_finished(self) -> None:
        self.walked = {key: kept for key, kept in self.walked.items() if not kept[0].is_finished}

    def position_states(self, r: Request, guesses: list[int]) -> list[int]:
        """The state at each pick of a row: after the reply so far, then after each guess."""
        states = [self.state(r)]
        for token in guesses:
            states.append(r.sampling.constraint.step(states[-1], token))
        return states

    def masks(self, batch: Batch, vocab: int, device) -> torch.Tensor | None:
        """(R, vocab) bool: the tokens each logit position may pick (True: allowed); None when no
        row is constrained."""
        if not any(r.sampling.constraint is not None for r in batch.sampled):
            return None
        anything = torch.ones(vocab, dtype=torch.bool, device=device)
        masks, states = [], {}
        for row in batch.logit_rows:
            r = batch.requests[row]
            constraint = r.sampling.constraint
            if constraint is not None and row not in states:
                guesses = r.lookahead[: batch.lookahead[row]]
                states[row] = iter(self.position_states(r, guesses))
            state = next(states[row]) if constraint is not None else DEAD
            masks.append(anything if state == DEAD else constraint.mask(state, device))  # (refused: any)
        return torch.stack(masks)

    def draft_masks(self, requests: list[Request], drafts: list[list[int]], vocab: int, device):
        """(R, vocab) bool: what each request's next guess may be, after its reply and its guesses so
        far (a drafter guesses inside the pattern too, or its guesses would only be rejected); None
        when none is constrained."""
        if all(r.sampling.constraint is None for r in requests):
            return None
        anything = torch.ones(vocab, dtype=torch.bool, device=device)
        out = []
        for r, d in zip(requests, drafts):
            s = self.position_states(r, d)[-1] if r.sampling.constraint is not None else DEAD
            out.append(anything if s == DEAD else r.sampling.constraint.mask(s, device))
        return torch.stack(out)

    def allowed_counts(self, batch: Batch) -> dict[str, int]:
        """For the trace: how many tokens each constrained row that picks this step could pick first."""
        counts = {}
        for r in batch.sampled:
            if r.sampling.constraint is not None and (state := self.state(r)) != DEAD:
                counts[r.id] = r.sampling.constraint.allowed_count(state)
        return counts

    def cut_at_first_refusal(self, r: Request, draft: list[int]) -> list[int]:
        """A drafter's guesses up to the first one the pattern does not allow (never kept)."""
        if r.sampling.constraint is None:
            return draft
        states = self.position_states(r, draft)
        return next((draft[:i] for i, s in enumerate(states[1:]) if s == DEAD), draft)
