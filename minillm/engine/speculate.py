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
               (probability min(1, p / q)), else a draw from what p has beyond q (sampler.py): one rule settles both
  4. rollback  the rejected guesses' keys and values sit in both caches: cut them (the paged cache gives the
               blocks past the new length back at once; the draft's cache trims its length)

Every token kept is the big model's own argmax after the same prefix, so under greedy decoding the reply is the
one the plain loop gives, token for token; under sampling, each token is distributed as the big model's own draw.
It costs k cheap draft forwards and a wider verify row per step; it pays while the step is memory-bound (small
batches). Batching fills the same idle maths with other users'
rows instead, so a full batch leaves speculation nothing to win: lesson 11 measures where it stops paying.
"""

from __future__ import annotations

import itertools

import torch

from minillm.config import EngineConfig
from minillm.engine.constrain import cut_at_first_refusal, draft_masks
from minillm.engine.kv_cache import ContiguousKVCache
from minillm.engine.packing import Batch
from minillm.engine.request import Request
from minillm.engine.runner import ModelRunner
from minillm.engine.sampler import draft_picks
from minillm.errors import ConfigError
from minillm.model.checkpoint import DRAFT_CHECKPOINT, load_model
from minillm.model.tokenizer import EOS


def accept(draft: list[int], picks: list[int]) -> list[int]:
    """Greedy acceptance. draft: the guesses after the row's last token; picks (len(draft) + 1,): the big model's
    choice after the last token and after each guess. Returns what the reply gains: the guesses up to the first
    one the big model disagrees with, then the big model's own pick there (after all of them: one more, free)."""
    n = 0
    while n < len(draft) and draft[n] == picks[n]:
        n += 1
    return draft[:n] + [picks[n]]


def settle_row(draft: list[int], picks: list[int], cache, seat: int, computed: int) -> list[int]:
    """One verify row after the forward: it ran its last token and `draft` from position `computed` on, so the cache
    holds computed + 1 + len(draft) tokens for `seat`. Returns what the reply gains, and cuts the rejected guesses'
    keys and values: the cache keeps the last token and the guesses kept, computed + len(gained) tokens."""
    gained = accept(draft, picks)
    if len(gained) <= len(draft):  # some guesses were rejected
        cache.truncate(seat, computed + len(gained))
    return gained


def lookup(tokens: list[int], k: int, longest: int = 3) -> list[int]:
    """Prompt lookup: the (up to) k tokens that followed the latest earlier occurrence of the sequence's last n
    tokens, for the largest n <= `longest` that occurs earlier; [] when even the last token never did."""
    for n in range(min(longest, len(tokens) - 1), 0, -1):
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
    return []


class NgramDrafter:
    """No model, no cache: it guesses that the sequence goes on as it did after its last few tokens before."""

    name = "ngram"

    def propose(self, requests: list[Request], ks: list[int]) -> list[list[int]]:
        return [lookup(r.tokens, k) for r, k in zip(requests, ks)]

    def rollback(self, request: Request, keep: int) -> None:
        pass


class ModelDrafter:
    """A small model of the same family (same tokenizer, trained on the same tasks: `train --draft`), with a KV
    cache of its own: contiguous, a row per seat. Its tokens are a quarter of the big model's size here, nothing
    else reads them, and a rollback is then just a shorter length: no second pool of blocks to share out, leak
    or preempt. A row belongs to one admission of one request: a newcomer in the seat (or the same request
    back after a preemption) starts it over, so the draft's KV goes with the request's."""

    name = "model"

    def __init__(self, model, slots: int, max_len: int):
        self.model = model.eval()
        self.device = next(model.parameters()).device
        self.cache = ContiguousKVCache(model.cfg, slots, max_len, self.device)
        self.holder: list[int | None] = [None] * slots  # the admission (Request.admit_order) each row is for

    @torch.no_grad()
    def propose(self, requests: list[Request], ks: list[int]) -> list[list[int]]:
        """k forwards of all rows together: the first catches up on every token the draft has not run (the last
        one included: after it comes the first guess), each next one runs the guess just made."""
        feed = []
        for r in requests:
            if self.holder[r.seat] != r.admit_order:
                self.cache.free(r.seat)
                self.holder[r.seat] = r.admit_order
            feed.append(r.tokens[self.cache.lengths[r.seat] :])
        drafts: list[list[int]] = [[] for _ in requests]
        for step in range(max(ks)):
            rows = [i for i, k in enumerate(ks) if k > step]
            counts = [len(feed[i]) for i in rows]
            same = len(set(counts)) == 1
            positions = self.cache.prepare([requests[i].seat for i in rows], counts[0] if same else counts)
            tokens = torch.tensor([t for i in rows for t in feed[i]], device=self.device).view(positions.shape)
            last = torch.tensor(list(itertools.accumulate(counts)), device=self.device) - 1  # (rows,)
            logits = self.model(tokens, positions, self.cache, logits_at=last)  # (rows, V)
            asking = [requests[i] for i in rows]
            masks = draft_masks(asking, [drafts[i] for i in rows], logits.shape[-1], self.device)
            guessed_at = [len(requests[i].output_ids) + step for i in rows]  # the reply position each guess fills
            for i, (token, q) in zip(rows, draft_picks(logits, asking, guessed_at, masks)):
                drafts[i].append(token)
                if q is not None:  # a sampled request's guess: its distribution, for the rejection rule
                    requests[i].draft_q.append(q)
                feed[i] = [token]
        return drafts

    def rollback(self, request: Request, keep: int) -> None:
        """The draft's cache holds the sequence and all its guesses but the last: keep only `keep` tokens (the
        ones the big model kept, less the last, whose logits give the next first guess)."""
        self.cache.truncate(request.seat, min(keep, self.cache.lengths[request.seat]))


def speculates(r: Request) -> bool:
    """A decoding request, greedy or sampled (a sampled one's guesses are kept by the rejection rule, sampler.py).
    One that asks for logprobs does not: it records them as each token is picked, and a verify row picks after
    guesses it may reject."""
    return r.is_decoding and r.sampling.logprobs is None


class Speculator:
    """What the engine calls: `propose` before the scheduler plans a step, `settle` after the forward."""

    def __init__(self, k: int = 0, drafter: NgramDrafter | ModelDrafter | None = None):
        self.k, self.drafter = k, drafter
        self.settle_row = settle_row  # (lesson 11 puts yours here)
        self.proposed: list[Request] = []
        self.verified: dict[str, tuple[list[int], int]] = {}  # this step: id -> (guesses checked, how many kept)

    def propose(self, running: list[Request]) -> None:
        """Each greedy decoding request guesses up to k tokens (never past its max_new_tokens), as its draft."""
        asks = [(r, min(self.k, r.max_new_tokens - len(r.output_ids) - 1)) for r in running if speculates(r)]
        asks = [(r, k) for r, k in asks if k > 0]
        self.proposed = [r for r, _ in asks]
        if asks:
            for r, draft in zip(self.proposed, self.drafter.propose(self.proposed, [k for _, k in asks])):
                r.draft = cut_at_first_refusal(r, draft)  # (a constrained reply: a guess outside its pattern and
                del r.draft_q[len(r.draft) :]  # those after it could never be kept)

    def settle(self, batch: Batch, picks: list[int], cache) -> tuple[list[list[int]], list[int]]:
        """Accept each row's guesses and roll back the rest. picks: the runner's tokens, one per logit position.
        Returns the tokens each sampling row's reply gains (cut after an EOS) and, per row, its tokens whose
        keys and values stay in the cache."""
        if not self.k:  # speculation off: a token per sampling row, every token kept (the common case, made short)
            self.verified = {}
            return [[token] for token in picks], list(batch.counts)
        replies, kept, at, self.verified, gained = [], [], 0, {}, {}
        for r, n, samples, checked in zip(batch.requests, batch.counts, batch.samples, batch.drafts):
            if not samples:
                kept.append(n)
                continue
            draft = r.draft[:checked]
            new = self.settle_row(draft, picks[at : at + checked + 1], cache, r.seat, r.num_computed + n - 1 - checked)
            gained[r.id] = len(new)
            at += checked + 1
            rejected = checked - (len(new) - 1)
            if draft:
                self.verified[r.id] = (draft, len(new) - 1)
                r.drafts_verified, r.drafts_accepted = r.drafts_verified + checked, r.drafts_accepted + len(new) - 1
            if EOS in new and not r.ignore_eos:
                new = new[: new.index(EOS) + 1]
            replies.append(new)
            kept.append(n - rejected)
        for r in self.proposed:  # checked, partly checked, or not run at all (stalled; preempted: no seat now)
            if r.seat is not None:  # the draft keeps all but the last token the reply will have: it runs that next
                self.drafter.rollback(r, r.num_tokens + gained.get(r.id, 0) - 1)
            r.draft, r.draft_q = [], []
        return replies, kept


def speculator_for(cfg: EngineConfig, runner, max_len: int, draft=None) -> Speculator:
    """The engine's speculator: off (k = 0) unless cfg.speculate. draft: the draft model (default: the shipped one)."""
    if not cfg.speculate:
        return Speculator()
    if not isinstance(runner, ModelRunner):
        raise ConfigError("speculative decoding needs a model to check the guesses; a simulated card has none "
                          "(minillm/card/speculation.py prices it instead)")  # fmt: skip
    if cfg.drafter == "ngram":
        return Speculator(cfg.speculate, NgramDrafter())
    draft = draft if draft is not None else load_model(DRAFT_CHECKPOINT, runner.device)
    if draft.cfg.vocab_size != runner.vocab_size or draft.cfg.max_seq_len < max_len:
        shape = f"{draft.cfg.vocab_size} tokens, context {draft.cfg.max_seq_len}"
        raise ConfigError(f"a draft model must share the model's tokenizer ({runner.vocab_size} tokens) and cover "
                          f"its context ({max_len}); this one has {shape}")  # fmt: skip
    return Speculator(cfg.speculate, ModelDrafter(draft, cfg.slots, max_len))
