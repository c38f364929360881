"""Who guesses for speculative decoding (speculate.py): prompt lookup, or a small draft model.

Both give each asking request up to k guesses past its last token, and for a sampled request the
drafter's distribution q at each guess (the rejection rule needs it: sampling.py). A drafter keeps
its own state per seat (the draft model's KV cache) and rolls it back to what the big model kept.

Seam: lookahead, through Speculation (speculate.py), which calls `propose` and `rollback`.
"""

from __future__ import annotations

import itertools

import torch

from minillm.config import EngineConfig
from minillm.engine.kv_cache import ContiguousKVCache
from minillm.engine.request import Request
from minillm.engine.runner import ModelRunner
from minillm.errors import ConfigError
from minillm.layers.sampling import draft_picks
from minillm.model.checkpoint import DEFAULT_CHECKPOINT, load_model

DRAFT_CHECKPOINT = DEFAULT_CHECKPOINT.with_name("draft.safetensors")  # `train --draft` writes it
DRAFT_RETRAIN_HINT = "rebuild it with `python -m minillm train --draft` (about 5 minutes on 2 CPU cores)"


def lookup(tokens: list[int], k: int, longest: int = 3) -> list[int]:
    """Prompt lookup: the (up to) k tokens that followed the latest earlier occurrence of the
    sequence's last n tokens, for the largest n <= `longest` that occurs earlier; [] when even the
    last token never did."""
    for n in range(min(longest, len(tokens) - 1), 0, -1):
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
    return []


class NgramDrafter:
    """No model, no cache: it guesses that the sequence goes on as it did after its last few tokens
    before. Its guesses are certain (q is all on them)."""

    name = "ngram"

    def propose(self, requests: list[Request], ks: list[int], sampler) -> tuple[list, list]:
        return [lookup(r.tokens, k) for r, k in zip(requests, ks)], [[] for _ in requests]

    def rollback(self, request: Request, keep: int) -> None:
        pass


class ModelDrafter:
    """A small model of the same family (same tokenizer, trained on the same tasks: `train
    --draft`), with a KV cache of its own: contiguous, a row per seat. Its tokens are a quarter of
    the big model's size here, nothing else reads them, and a rollback is then just a shorter
    length: no second pool of blocks to share out, leak or preempt. A row belongs to one admission
    of one request: a newcomer in the seat (or the same request back after a preemption) starts it
    over, so the draft's KV goes with the request's."""

    name = "model"

    def __init__(self, model, slots: int, max_len: int):
        self.model = model.eval()
        self.device = next(model.parameters()).device
        self.cache = ContiguousKVCache(model.cfg, slots, max_len, self.device)
        self.holder: list[int | None] = [None] * slots  # the admission (admit_order) each row is for

    @torch.no_grad()
    def propose(self, requests: list[Request], ks: list[int], sampler) -> tuple[list, list]:
        """k forwards of all rows together: the first catches up on every token the draft has not
        run (the last one included: after it comes the first guess), each next one runs the guess
        just made. Returns each request's guesses and, for a sampled one, q at each."""
        feed = []
        for r in requests:
            if self.holder[r.seat] != r.admit_order:
                self.cache.free(r.seat)
                self.holder[r.seat] = r.admit_order
            feed.append(r.tokens[self.cache.lengths[r.seat] :])
        drafts: list[list[int]] = [[] for _ in requests]
        qs: list[list[torch.Tensor]] = [[] for _ in requests]
        for step in range(max(ks)):
            rows = [i for i, k in enumerate(ks) if k > step]
            counts = [len(feed[i]) for i in rows]
            same = len(set(counts)) == 1
            seats = [requests[i].seat for i in rows]
            positions = self.cache.prepare(seats, counts[0] if same else counts)
            flat = [t for i in rows for t in feed[i]]
            tokens = torch.tensor(flat, device=self.device).view(positions.shape)
            last = torch.tensor(list(itertools.accumulate(counts)), device=self.device) - 1  # (rows,)
            logits = self.model(tokens, positions, self.cache, logits_at=last)  # (rows, V)
            asking = [requests[i] for i in rows]
            vocab = logits.shape[-1]
            masks = sampler.constraints.draft_masks(asking, [drafts[i] for i in rows], vocab, self.device)
            guessed_at = [len(requests[i].output_ids) + step for i in rows]  # the reply position
            for i, (token, q) in zip(rows, draft_picks(logits, asking, guessed_at, masks)):
                drafts[i].append(token)
                if q is not None:  # a sampled request's guess: q, for the rejection rule
                    qs[i].append(q)
                feed[i] = [token]
        return drafts, qs

    def rollback(self, request: Request, keep: int) -> None:
        """The draft's cache holds the sequence and all its guesses but the last: keep only `keep`
        tokens (the ones the big model kept, less the last, whose logits give the next guess)."""
        self.cache.truncate(request.seat, min(keep, self.cache.lengths[request.seat]))


def drafter_for(cfg: EngineConfig, runner, max_len: int, draft=None) -> NgramDrafter | ModelDrafter:
    """The drafter cfg.drafter names. draft: the draft model (default: the shipped one)."""
    if not isinstance(runner, ModelRunner):
        raise ConfigError(
            "speculative decoding needs a model to check the guesses; a simulated card has none "
            "(minillm/card/speculation.py prices it instead)"
        )
    if cfg.drafter == "ngram":
        return NgramDrafter()
    if draft is None:
        draft = load_model(DRAFT_CHECKPOINT, runner.device, hint=DRAFT_RETRAIN_HINT)
    if draft.cfg.vocab_size != runner.vocab_size or draft.cfg.max_seq_len < max_len:
        shape = f"{draft.cfg.vocab_size} tokens, context {draft.cfg.max_seq_len}"
        raise ConfigError(
            f"a draft model must share the model's tokenizer ({runner.vocab_size} tokens) and cover "
            f"its context ({max_len}); this one has {shape}"
        )
    return ModelDrafter(draft, cfg.slots, max_len)
