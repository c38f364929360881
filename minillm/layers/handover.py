"""Prefill here, decode there: a request's keys and values handed from one engine to another.

A prompt's step and a decode step want different things of a card (lesson 08): the prompt is many
tokens at once, bound by FLOPs; decode is one token per user, bound by reading the weights.
Disaggregated serving (DistServe, Mooncake; vLLM's KV connectors, SGLang's PD mode) gives each its
own engine, and sends the prompt's KV between them:

  1. prefill   on the first engine, a request marked for hand-over (HandOver.mark) runs its prompt
               (in chunks under the token budget, from the prefix cache, as any prompt) and picks
               its first token there
  2. hand over it then finishes there with finish_reason "handed-over" and keeps its seat and KV
               blocks (engine.held) until the caller has copied its keys and values out (export)
               and sent them: engine.release(request)
  3. admit     on the second engine, a copy of the request (handed_copy: its first token, its
               sampling and seed) is submitted with those keys and values (engine.submit(copy, kv));
               admitted, it takes blocks as any newcomer does, the keys and values are written into
               them as if this engine had computed them, and it decodes on

Every token is the one a single engine picks: the KV is the same numbers, only stored in another
engine's pool, so the replies are token-exact against one engine serving alone.

Seams: each token (a marked request ends after its first), the held reason, after the step (the
marks of requests that ended otherwise are forgotten), admit with KV.
Its state per request: the ids marked for hand-over.
"""

from __future__ import annotations

import itertools
from dataclasses import fields

import torch

from minillm.engine.engine import Engine
from minillm.engine.request import Request

HANDED_OVER = "handed-over"


class HandOver:
    """Marks requests to leave this engine after their first token, keeping their KV until sent."""

    def __init__(self, engine: Engine):
        self.marked: set[str] = set()
        engine.token_hooks.append(self.after_token)
        engine.held_reasons.add(HANDED_OVER)
        engine.observers.append(self.after_step)

    def mark(self, request: Request) -> None:
        """Hand `request` over after its first token (mark it before or after submitting it)."""
        self.marked.add(request.id)

    def after_token(self, request: Request, token: int) -> str | None:
        if request.id in self.marked:
            self.marked.discard(request.id)
            return HANDED_OVER
        return None

    def after_step(self, engine: Engine, step) -> None:
        """A marked request that ended at its first pick (EOS) is never handed over: forget its mark, or
        a later request with its id would be, and a server's marks would pile up."""
        for request in step.finished:
            self.marked.discard(request.id)


def export(engine: Engine, request: Request) -> tuple[torch.Tensor, torch.Tensor]:
    """A handed-over request's prompt keys and values, (L, n, Hkv, D) each, copied out of its cache."""
    return engine.cache.read_tokens(request.seat, request.num_computed)


def handed_copy(request: Request) -> Request:
    """What the decode engine is given: a new request with the same inputs and the reply so far (its first token);
    its life (seat, steps, counts) starts over there, as any newcomer's does."""
    inputs = inputs_of(request)
    return Request(**inputs, output_ids=list(request.output_ids))


INPUTS = [f.name for f in itertools.takewhile(lambda f: f.name != "state", fields(Request))]  # (what a client sets)


def inputs_of(request: Request) -> dict:
    """What its client set (INPUTS), by name: a new request's arguments (its life starts over)."""
    return {name: getattr(request, name) for name in INPUTS}


def hand_over(prefill, decode) -> list[Request]:
    """Two LayeredEngines in this process: every request the prefill engine handed over goes to the decode
    engine, its KV copied from one pool to the other, its logprobs so far from one sampler to the other (a
    server's engines, in processes of their own, send them: serving/)."""
    moved = []
    for request in [r for r in prefill.held if r.finish_reason == HANDED_OVER]:
        copy = handed_copy(request)
        kv = export(prefill, request)
        logprobs = prefill.sampler.logprobs.pop(request.id, None)
        if logprobs is not None:  # the reply's logprobs so far go with it
            decode.sampler.logprobs[copy.id] = logprobs
        prefill.release(request)
        decode.submit(copy, kv=kv)
        moved.append(copy)
    return moved
