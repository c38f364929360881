"""n replies to one prompt (OpenAI's `n`, parallel sampling), the prompt's KV computed once and shared.

Paged attention was built for this as much as for ragged rows: several replies to one prompt need the prompt's keys
and values once, not n times. Here:

  1. the first reply is submitted as any request; the other n - 1 wait in this layer
  2. once the first has run its prompt (its first token is picked), the others are submitted, each with a
     SharedPrompt: when one is seated, its block table takes the first reply's full prompt blocks by reference
     count (blocks.py's fork) and a copy of the partly filled last one, so each writes its own next token
  3. each then runs only the prompt's last token (its own pick needs its own logits) and decodes on alone

Each reply i draws from its own stream: seed + i (as vLLM's), so reply i is the same request sent alone with that
seed, token for token; greedy replies are all the same reply. If the first reply has let its blocks go by the time a
sibling is seated (it finished, was preempted or aborted), the sibling computes its prompt itself: slower, the same
tokens. A sibling preempted later recomputes, as anyone does.

Seams: after the step (the siblings go in once the first reply's prompt is done), admit with KV (SharedPrompt).
Its state: the siblings of each first reply not yet submitted; the blocks copied this step (the trace reads them).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from minillm.engine.engine import Engine
from minillm.engine.paged_books import PagedKVBooks
from minillm.engine.request import Request, State
from minillm.errors import InputError
from minillm.layers.handover import inputs_of

MAX_REPLIES = 16  # more choices than a person reads; a crowd of n = 128 would take every seat (OpenAI caps n at 128)


@dataclass
class SharedPrompt:
    """A sibling's prompt KV, all but the last token, taken from the first reply's seat when the sibling is seated."""

    first: Request  # the reply whose prompt ran
    tokens: int  # how many of the prompt's tokens to share: all but the last
    copied: list[int] = field(default_factory=list)  # blocks filled by a copy, for the trace (Replies.moves)

    def store(self, cache, seat: int, start: int) -> int:
        """Share the first reply's blocks into `seat` (which holds `start` tokens); returns the tokens stored (0: the
        first reply's KV is gone, so the sibling computes its prompt itself)."""
        first = self.first
        if first.seat is None or first.is_finished or first.num_computed < self.tokens or start >= self.tokens:
            return 0
        if isinstance(cache, PagedKVBooks):
            source = cache.allocator.fork(seat, first.seat, self.tokens)
            if source is not None:  # (the partly filled last block, copied into the sibling's fresh one)
                copy = cache.allocator.tables[seat][-1]
                self.copied.append(copy)  # (a simulated card's books copy it too: it is drawn the same)
                if hasattr(cache, "k"):  # (a simulated card keeps books, no tensors)
                    cache.k[:, copy], cache.v[:, copy] = cache.k[:, source], cache.v[:, source]  # (L, size, Hkv, D)
        else:  # a contiguous cache shares nothing: the row is copied
            k, v = cache.read_tokens(first.seat, self.tokens)  # (L, n, Hkv, D) each
            cache.write_tokens(seat, k[:, start:], v[:, start:])
        return self.tokens - start


def sibling(request: Request, i: int) -> Request:
    """Reply i (1..n-1) of `request`: the same inputs under its own id (its seed is set when it goes in)."""
    return Request(**(inputs_of(request) | {"id": f"{request.id}#{i}"}))


class Replies:
    """Holds each first reply's siblings until its prompt has run, then submits them with its blocks to share."""

    def __init__(self, engine: Engine):
        self.engine = engine
        # tensor-parallel ranks each keep a cache of their own, which only the block tables reach: there a sibling
        # shares the full blocks alone (paged) and computes the rest of its prompt itself
        self.copies = getattr(engine.runner, "tp", 1) == 1
        self.waiting: dict[str, tuple[Request, list[tuple[Request, int, object]]]] = {}  # first id -> siblings
        self.moves: dict[str, list[int]] = {"copied": []}  # blocks copied this step (the trace's Recorder clears it)
        engine.observers.append(self.after_step)

    def submit(self, request: Request, n: int, service=None) -> list[Request]:
        """Queue `request` for n replies; returns them, `request` first (reply i: `request.id#i`)."""
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_REPLIES:
            raise InputError(f"n must be a whole number of replies from 1 to {MAX_REPLIES}, got {n!r}")
        self.engine.submit(request, service=service)
        siblings = [sibling(request, i) for i in range(1, n)]
        for i, s in enumerate(siblings, 1):
            self.follow(request, s, i, service)
        return [request, *siblings]

    def follow(self, first: Request, reply: Request, index: int, service=None) -> bool:
        """Queue `reply`, reply `index` to `first`'s prompt (the same inputs, `first` submitted): it goes in once
        `first`'s prompt has run (now, if it has; alone, if `first` was refused or has ended). True: taken."""
        if reply.id in self.engine.live or self.holds(reply.id):
            raise InputError(f"request id {reply.id!r} is already queued or running: give each request its own id")
        if first.id in self.waiting:
            self.waiting[first.id][1].append((reply, index, service))
        else:
            self.waiting[first.id] = (first, [(reply, index, service)])
        self.after_step(self.engine, None)
        return reply.state is not State.REJECTED

    def after_step(self, engine: Engine, step) -> None:
        """A first reply whose prompt has run (or that has ended without) lets its siblings in."""
        for first_id, (first, siblings) in list(self.waiting.items()):
            if first.first_token_step is None and not first.is_finished:
                continue
            del self.waiting[first_id]
            shared = len(first.prompt_ids) - 1
            if not self.copies:
                shared = shared - shared % engine.cfg.block_size if engine.cfg.kv == "paged" else 0
            shares = not first.is_finished and shared > 0
            for reply, index, service in reversed(siblings):  # (each to the queue's head: reply 1 ends up first)
                seed = first.sampling.seed  # (the sampler may have given the first one of its own)
                reply.sampling = replace(first.sampling, seed=None if seed is None else seed + index)
                reply.arrival_s, reply.arrival_step = first.arrival_s, first.arrival_step  # (the user asked then)
                kv = SharedPrompt(first, shared, self.moves["copied"]) if shares else None
                if engine.submit(reply, kv=kv, service=service):  # (queued: it waits in pending)
                    # it arrived with the first reply, which has a seat: to the head of the queue, as a preempted
                    # request goes, so it is seated while the first still holds the blocks it shares
                    engine.pending.remove(reply)
                    engine.waiting.appendleft(reply)

    def holds(self, request_id: str) -> bool:  # a sibling waiting here
        return any(request_id == r.id for _, siblings in self.waiting.values() for r, *_ in siblings)

    def abort(self, request_id: str, reason: str = "aborted") -> bool:
        """A sibling not yet submitted ends here (the engine never saw it)."""
        for _, siblings in self.waiting.values():
            for entry in siblings:
                if entry[0].id == request_id:
                    siblings.remove(entry)
                    entry[0].state, entry[0].finish_reason = State.FINISHED, reason
                    return True
        return False
