"""Replay: a run's every step without the model's forward, because a reply does not depend on how it is served.

Which seat a request holds at each step, and which KV blocks, depends on each request's reply, not on the model's
numbers; and a greedy reply is the same under every policy, KV layout, block size, token budget, prefix cache and
speculation (the tests prove it token for token). So the step player computes each prompt's reply once with the
model (ReplyBook: kept on disk, and shipped beside the weights for the app's default crowds) and then serves the
crowd with ReplayRunner: the ModelRunner without the forward. The KV cache still plans every step (blocks, prefix
hits, rollbacks), and each logit row holds the recorded token, so the scheduler, the allocator, the sampler's masks
and speculation's accept rule all run exactly as in a real run. A setting change then costs bookkeeping only: the
app answers one in about half a second on a 2-core laptop, both policies drawn, where running the model took 5-9 s
(docs/measure_settings.py).

A replayed step costs no measured time: its seconds are priced (ReplayClock) by a line fitted to the real steps
that computed the replies (seconds = per_step + per_token x tokens), and the trace says so (config "clock":
"replayed"). Speculation's draft model still guesses, through DraftBook: each guess from a given context is
computed once and kept.

    python -m viz.app.replays      recompute the shipped book of the app's default crowds (after retraining)
"""

from __future__ import annotations

import hashlib
import json
import os
from functools import cache
from pathlib import Path

import torch

from minillm.card.simulate import VirtualClock
from minillm.config import EngineConfig
from minillm.engine.packing import Batch
from minillm.engine.request import Request
from minillm.engine.runner import ModelRunner
from minillm.errors import ConfigError
from minillm.model.checkpoint import DEFAULT_CHECKPOINT
from minillm.model.tokenizer import EOS

SHIPPED_BOOK = Path(__file__).parent.parent / "weights" / "replies.json"


@cache  # (a 6 MB read: the app asks for it whenever it opens or saves a book)
def weights_fingerprint(path: Path = DEFAULT_CHECKPOINT) -> str:
    """The checkpoint's identity: a book is valid only for the weights that wrote it."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def reply_key(request: Request) -> str:
    """A greedy reply depends on the prompt, the pattern it is held to and whether it may end at EOS, nothing else."""
    constraint = request.sampling.constraint
    pattern = getattr(constraint, "pattern", "") if constraint is not None else ""
    text = f"{pattern}\0{request.ignore_eos}\0{request.prompt_ids}"
    return hashlib.sha1(text.encode()).hexdigest()[:20]


class ReplyBook:
    """prompt -> its greedy reply, and how a real step of the model cost on the machine that computed them.

    A reply is stored with `ended`: it stopped by itself (at EOS, not at its cap), so it serves any cap;
    otherwise only requests whose max_new_tokens is at most its length."""

    def __init__(self, fingerprint: str, replies: dict | None = None, price: dict | None = None):
        self.fingerprint = fingerprint
        self.replies: dict[str, dict] = replies or {}  # key -> {"tokens": [...], "ended": bool} or {"rejected_cap"}
        self.price = price or {"per_step_s": 0.0, "per_token_s": 0.0}

    def reply(self, request: Request) -> list[int] | None:
        entry = self.replies.get(reply_key(request), {})
        if "tokens" not in entry or not (entry["ended"] or len(entry["tokens"]) >= request.max_new_tokens):
            return None
        return entry["tokens"]

    def turned_away(self, request: Request) -> bool:
        """The engine refused this prompt with this cap or a smaller one (too long for the context): no reply."""
        return request.max_new_tokens >= self.replies.get(reply_key(request), {}).get("rejected_cap", 2**62)

    def missing(self, requests: list[Request]) -> list[Request]:
        return [r for r in requests if self.reply(r) is None and not self.turned_away(r)]

    def add(self, request: Request) -> None:
        """Keep a finished request's reply, or that the engine turned it away."""
        if request.finish_reason is None:
            return
        if request.finish_reason.startswith("rejected"):
            self.replies[reply_key(request)] = {"rejected_cap": request.max_new_tokens}
            return
        ended = request.finish_reason != "length"  # (EOS or a pattern's end: it serves any cap)
        self.replies[reply_key(request)] = {"tokens": list(request.output_ids), "ended": ended}

    def to_dict(self) -> dict:
        return {"fingerprint": self.fingerprint, "price": self.price, "replies": self.replies}

    @classmethod
    def load(cls, path: Path, fingerprint: str) -> ReplyBook:
        """The book at `path` if it was written for these weights, else an empty one."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            return cls(fingerprint)
        if data.get("fingerprint") != fingerprint:
            return cls(fingerprint)
        return cls(fingerprint, data["replies"], data.get("price"))

    def save(self, path: Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_suffix(f".{os.getpid()}.part")
        part.write_text(json.dumps(self.to_dict(), separators=(",", ":")))
        os.replace(part, path)  # atomic: another app session reads the whole file or the old one


def compute_replies(book: ReplyBook, requests: list[Request], model, progress: bool = False) -> int:
    """Run the model on the requests whose replies the book lacks (all at once, one seat each: the fastest way on
    this engine) and add them, with the price of a real step fitted to this run. Returns how many it computed."""
    from minillm.engine.scheduler import ContinuousScheduler
    from minillm.layers import LayeredEngine

    longest: dict[str, Request] = {}  # one run per reply: the same prompt asked with the longest cap
    for r in book.missing(requests):
        if reply_key(r) not in longest or r.max_new_tokens > longest[reply_key(r)].max_new_tokens:
            longest[reply_key(r)] = r
    missing = [Request(r.id, list(r.prompt_ids), r.max_new_tokens, ignore_eos=r.ignore_eos, sampling=r.sampling)
               for r in longest.values()]  # fmt: skip
    if not missing:
        return 0
    engine = LayeredEngine(model, ContinuousScheduler(token_budget=0), EngineConfig(slots=min(len(missing), 64)))
    for r in missing:
        engine.submit(r)
    trace = engine.run(progress=progress)
    for r in missing:
        book.add(r)
    if not any(book.price.values()):  # (priced once: a book's replayed seconds do not move as it grows)
        book.price = fit_price([(s.tokens, s.wall_s) for s in trace.steps]) or book.price
    return len(missing)


def fit_price(steps: list[tuple[int, float]]) -> dict | None:
    """Least squares: seconds = per_step + per_token x tokens, over (tokens, seconds) of real steps."""
    if len({tokens for tokens, _ in steps}) < 2:
        return None
    x = torch.tensor([[1.0, tokens] for tokens, _ in steps], dtype=torch.float64)
    y = torch.tensor([[seconds] for _, seconds in steps], dtype=torch.float64)
    per_step, per_token = torch.linalg.lstsq(x, y).solution.flatten().tolist()
    return {"per_step_s": max(per_step, 0.0), "per_token_s": max(per_token, 0.0)}


class ReplayClock(VirtualClock):
    """Seconds priced, not measured: each step costs what the book's fitted line says."""

    name = "replayed"


class ReplayRunner(ModelRunner):
    """ModelRunner with the book's replies in place of the forward. Greedy requests only (a sampled reply depends
    on its draws, and the book keeps greedy ones)."""

    def __init__(self, model, book: ReplyBook):
        super().__init__(model)
        self.book, self.clock = book, ReplayClock()

    def make_cache(self, cfg: EngineConfig, max_len: int):
        """The real cache, whose books (blocks, prefix keys, lengths) move exactly as in a real run; a replay writes
        no keys or values, so its steps skip the attention plan (a third of a replayed step's time)."""
        cache = super().make_cache(cfg, max_len)
        cache.plan_rows = lambda *args: None
        return cache

    @torch.no_grad()
    def run(self, batch: Batch, cache, picker) -> list[int]:
        self.prepare(batch, cache)  # the cache's books plan the step exactly as a real one
        logits = torch.zeros(len(batch.logit_index), self.vocab_size)  # (R, V): one-hot at each recorded token
        position_in_row: dict[int, int] = {}
        for i, row in enumerate(batch.logit_rows):
            request = batch.requests[row]
            j = position_in_row[row] = position_in_row.get(row, -1) + 1  # (a lookahead row: one pick per guess)
            logits[i, self.recorded(request, len(request.output_ids) + j)] = 1.0
        price = self.book.price
        self.clock.advance(price["per_step_s"] + price["per_token_s"] * batch.num_tokens)
        return picker.pick(logits, batch)

    def recorded(self, request: Request, index: int) -> int:
        if request.sampling.temperature:
            raise ConfigError("a replay serves greedy requests only: run the model itself for sampled ones")
        reply = self.book.reply(request)
        if reply is None:
            raise ConfigError(f"no recorded reply for request {request.id}: compute_replies() first")
        return reply[index] if index < len(reply) else EOS


class DraftBook:
    """A drafter that remembers: the guesses from a given context are the same whenever they are asked for, so
    the draft model runs only for a context it has not seen (its own cache catches up then)."""

    def __init__(self, drafter, guesses: dict | None = None):
        self.drafter, self.name = drafter, drafter.name
        self.guesses: dict[str, list[int]] = guesses if guesses is not None else {}

    @staticmethod
    def key(request: Request, k: int) -> str:
        return f"{reply_key(request)}:{request.num_tokens}:{k}"

    def propose(self, requests: list[Request], ks: list[int], sampler) -> tuple[list, list]:
        keys = [self.key(r, k) for r, k in zip(requests, ks)]
        new = [i for i, key in enumerate(keys) if key not in self.guesses]
        if new:
            drafts, _ = self.drafter.propose([requests[i] for i in new], [ks[i] for i in new], sampler)
            self.guesses.update({keys[i]: draft for i, draft in zip(new, drafts)})
        return [list(self.guesses[key]) for key in keys], [[] for _ in requests]

    def rollback(self, request: Request, keep: int) -> None:
        self.drafter.rollback(request, keep)
