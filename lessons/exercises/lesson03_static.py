"""Lesson 03 exercise: the static batching policy. Check your work: pytest -m lesson03"""

from __future__ import annotations

from minillm.engine.request import Request
from minillm.engine.scheduler import KVSpace, Plan  # only these two: the policy is yours to write


class MyStaticScheduler:
    """Static batching: a batch runs until its longest member finishes; only then is the next formed.

    The engine calls schedule() once per step with:
      waiting: arrived requests, in queue order (the head first)
      seats:   one entry per seat: a running Request, a finished Request still holding its
               seat (r.is_finished is True), or None
      kv:      the KV cache; kv.free_blocks and kv.blocks_to_admit(r.tokens_in_cache_after_prefill)
               say whether a request's prompt fits (the contiguous layout always says it does)
    Return Plan(admit=[...]): the requests to seat this step, in order.

    Rules: while any seat holds an unfinished request, admit nobody. When none does, admit
    requests from the head of the queue, in order, until the seats run out or the next one's
    prompt does not fit in the blocks still free (kv.free_blocks, less the blocks of the requests
    you already admitted this step). A request that does not fit stops the admissions: nobody
    behind it may board ahead of it. Count only the prompt's blocks (kv.blocks_to_admit as above), not
    blocks for the reply it has yet to write (max_new_tokens is a cap: many replies end sooner, on EOS).
    (Preemption: you may leave it out; the checks only judge crowds whose batches never need it.)
    """

    name = "my-static"
    holds_finished_seats = True  # finished members keep their seat, idle, until the batch is done

    def schedule(self, waiting: list[Request], seats: list[Request | None], kv: KVSpace) -> Plan:
        raise NotImplementedError("lesson 03: admit a new batch only when every seat's request has finished")
