"""Prefill here, decode there: a request's keys and values handed from one engine to another.

A prompt's step and a decode step want different things of a card (lesson 08): the prompt is many tokens at once,
bound by FLOPs; decode is one token per user, bound by reading the weights. Disaggregated serving (DistServe,
Mooncake; vLLM's KV connectors, SGLang's PD mode) gives each its own engine, and sends the prompt's KV between them:

  1. prefill   on the first engine, a request submitted with handoff=True runs its prompt (in chunks under the
               token budget, from the prefix cache, as any prompt) and picks its first token there
  2. hand over it then finishes there with finish_reason "handed-over" and keeps its seat and KV blocks until the
               caller has copied its keys and values out (export) and sent them: engine.release(request)
  3. adopt     on the second engine, a copy of the request (handed_copy: its first token, its sampling, seeds and
               constraint state) arrives with those keys and values; admitted, it takes blocks as any newcomer does,
               the keys and values are written into them as if this engine had computed them, and it decodes on

Every token is the one a single engine picks: the KV is the same numbers, only stored in another engine's pool, so
the replies are token-exact against one engine serving alone (tests/test_handover.py).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from minillm.engine.request import Request, State


def export(engine, request: Request) -> tuple[torch.Tensor, torch.Tensor]:
    """A handed-over request's prompt keys and values, (L, n, Hkv, D) each, copied out of the engine's cache."""
    return engine.cache.read_tokens(request.seat, request.num_computed)


def handed_copy(request: Request, k: torch.Tensor, v: torch.Tensor) -> Request:
    """What the decode engine is given: the request as it stands after its first token, with its prompt's KV."""
    return replace(request, state=State.WAITING, seat=None, num_computed=0, finish_reason=None, finish_step=None,
                   finish_s=None, admit_step=None, admit_order=-1, first_token_step=None, first_token_s=None,
                   preemptions=0, prefill_tokens=0, prompt_tokens_from_cache=0, handoff=False, kv_import=(k, v),
                   output_ids=list(request.output_ids), output_logprobs=list(request.output_logprobs),
                   draft=[], draft_q=[])  # fmt: skip


def adopt(cache, request: Request) -> None:
    """At admission: store the imported keys and values past what the prefix cache gave (claimed blocks hold the same
    numbers), key its full blocks for later requests, and count them computed."""
    k, v = request.kv_import
    start = request.num_computed
    cache.write_tokens(request.seat, k[:, start:], v[:, start:])
    request.num_computed, request.kv_import = k.shape[1], None
    cache.commit(request.seat, request.tokens[: request.num_computed])


def hand_over(prefill, decode) -> list[Request]:
    """Both engines in this process: every request the prefill engine handed over goes to the decode engine, its KV
    copied from one pool to the other (a server's engines, in processes of their own, send it: serving/)."""
    moved = []
    for request in list(prefill.handed):
        moved.append(handed_copy(request, *export(prefill, request)))
        prefill.release(request)
        decode.submit(moved[-1])
    return moved
