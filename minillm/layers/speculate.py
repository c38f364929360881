"""Speculative decoding: guess a few tokens ahead cheaply, and let the big model check every guess in one step.

A decode step runs one token per user through every weight, and on a GPU that step is bound by reading the
weights, not by the maths: the same step could run several tokens of one row for nearly the same time.
Speculative decoding (Leviathan et al., 2023; Chen et al., 2023) spends that room on ONE stream:

  1. draft     a cheap drafter guesses the next k tokens (before the scheduler plans the step): a small model
               of the same family with a KV cache of its own (ModelDrafter), or the tokens that followed the
               latest earlier occurrence of the last few tokens (NgramDrafter, "prompt lookup")
  2. verify    the row runs its last token AND the k guesses, like a prompt chunk of k + 1 tokens, in the same
               forward as every other row (so it counts k + 1 tokens against the token budget); its logits at
               every position say what the big model picks after each prefix
  3. accept    keep the guesses while they equal the big model's picks, then take the big model's own pick at
               the first disagreement (or after the last guess): 1 to k + 1 tokens a step, never a wrong one.
               A sampled row's pick at a guessed position is the guess itself when the rejection rule keeps it
               (probability min(1, p / q)), else a draw from what p has beyond q (sampling.py): one rule settles both
  4. rollback  the rejected guesses' keys and values sit in both caches: cut them (the paged cache gives the
               blocks past the new length back at once; the draft's cache trims its length)

Every token kept is the big model's own argmax after the same prefix, so under greedy decoding the reply is the
one the plain loop gives, token for token; under sampling, each token is distributed as the big model's own draw.
It costs k cheap draft forwards and a wider verify row per step; it pays while the step is memory-bound (small
batches). Batching fills the same idle maths with other users' rows instead, so a full batch leaves speculation
nothing to win: lesson 11 measures where it stops paying.

Seams: lookahead (Speculation.propose before the plan, Speculation.settle after the pick); the trace records each
step's `verified` (trace.py). Its state per request: the drafter's caches (drafters.py) and, for a sampled request,
the drafter's q (kept in the Sampler, whose rejection rule reads it).
"""

from __future__ import annotations

from minillm.engine.packing import Batch
from minillm.engine.request import Request
from minillm.layers.drafters import ModelDrafter, NgramDrafter
from minillm.layers.sampling import Sampler
from minillm.model.tokenizer import EOS


def accept(draft: list[int], picks: list[int]) -> list[int]:
    """Greedy acceptance. draft: the guesses after the row's last token; picks (len(draft) + 1,):
    the big model's choice after the last token and after each guess. Returns what the reply gains:
    the guesses up to the first one the big model disagrees with, then the big model's own pick
    there (after all of them: one more, free)."""
    n = 0
    while n < len(draft) and draft[n] == picks[n]:
        n += 1
    return draft[:n] + [picks[n]]


def settle_row(draft: list[int], picks: list[int], cache, seat: int, computed: int) -> list[int]:
    """One verify row after the forward: it ran its last token and `draft` from position `computed`
    on, so the cache holds computed + 1 + len(draft) tokens for `seat`. Returns what the reply gains,
    and cuts the rejected guesses' keys and values: the cache keeps the last token and the guesses
    kept, computed + len(gained) tokens."""
    gained = accept(draft, picks)
    if len(gained) <= len(draft):  # some guesses were rejected
        cache.truncate(seat, computed + len(gained))
    return gained


def speculates(r: Request) -> bool:
    """A decoding request, greedy or sampled (a sampled one's guesses are kept by the rejection
    rule, sampling.py). One that asks for logprobs does not: it records them as each token is
    picked, and a verify row picks after guesses it may reject."""
    return r.is_decoding and r.sampling.logprobs is None


class Speculation:
    """The engine's lookahead: `propose` before the scheduler plans a step, `settle` after the pick."""

    def __init__(self, k: int, drafter: NgramDrafter | ModelDrafter, sampler: Sampler):
        self.k, self.drafter, self.sampler = k, drafter, sampler
        self.settle_row = settle_row  # (lesson 11 puts yours here)
        self.proposed: list[Request] = []
        self.verified: dict[str, tuple[list[int], int]] = {}  # this step: id -> (checked, kept)

    def propose(self, running: list[Request]) -> None:
        """Each decoding request guesses up to k tokens (never past its max_new_tokens)."""
        asks = [(r, min(self.k, r.max_new_tokens - len(r.output_ids) - 1)) for r in running]
        asks = [(r, k) for r, k in asks if k > 0 and speculates(r)]
        self.proposed = [r for r, _ in asks]
        if not asks:
            return
        drafts, qs = self.drafter.propose(self.proposed, [k for _, k in asks], self.sampler)
        for r, draft, q in zip(self.proposed, drafts, qs):
            # (a constrained reply: a guess outside its pattern, and those after it, are never kept)
            r.lookahead = self.sampler.constraints.cut_at_first_refusal(r, draft)
            if q:
                self.sampler.q[r.id] = q[: len(r.lookahead)]

    def settle(self, batch: Batch, picks: list[int], cache) -> tuple[list[list[int]], list[int]]:
        """Accept each row's guesses and roll back the rest. picks: one per logit position. Returns
        the tokens each sampling row's reply gains (cut after an EOS) and, per row, its tokens whose
        keys and values stay in the cache."""
        replies, kept, at, self.verified, gained = [], [], 0, {}, {}
        rows = zip(batch.requests, batch.counts, batch.samples, batch.lookahead)
        for r, n, samples, checked in rows:
            if not samples:
                kept.append(n)
                continue
            draft = r.lookahead[:checked]
            computed = r.num_computed + n - 1 - checked
            new = self.settle_row(draft, picks[at : at + checked + 1], cache, r.seat, computed)
            gained[r.id] = len(new)
            at += checked + 1
            rejected = checked - (len(new) - 1)
            if draft:
                self.verified[r.id] = (draft, len(new) - 1)
            if EOS in new and not r.ignore_eos:
                new = new[: new.index(EOS) + 1]
            replies.append(new)
            kept.append(n - rejected)
        for r in self.proposed:  # checked, partly, or not run (stalled; preempted: no seat now)
            if r.seat is not None:  # the draft keeps all but the reply's last token: it runs it next
                self.drafter.rollback(r, r.num_tokens + gained.get(r.id, 0) - 1)
            r.lookahead = []
            self.sampler.q.pop(r.id, None)
        return replies, kept
