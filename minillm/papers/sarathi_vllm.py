"""vLLM's prefill-prioritizing scheduler, as Sarathi-Serve's paper ran it (its repository's
sarathi/core/scheduler/vllm_scheduler.py, the vLLM of early 2024; the paper's section 3.2 calls it "prefill
prioritizing" and says it never mixes prompts and decodes in one step).

Each step: admit waiting requests from the head of the queue while a seat is free, their blocks allocate and their
whole prompts keep within max_num_batched_tokens; if any was admitted, the step runs ONLY their prompts, and every
running request's next token waits (the generation stall). A step with nothing to admit decodes every running
request, preempting the newest when the blocks run out (as minillm's continuous scheduler does).

minillm's own continuous scheduler without a token budget differs in one thing: it runs the new prompts and the
running decodes in one step (Orca's hybrid batch), so decodes wait for the prompt but are not skipped.
"""

from __future__ import annotations

from minillm.engine.scheduler import Plan, computed_before, keep_running


class PrefillFirstScheduler:
    name = "prefill-first"
    holds_finished_seats = False

    def __init__(self, max_batched_tokens: int):
        self.max_batched_tokens = max_batched_tokens

    def schedule(self, waiting, seats, kv) -> Plan:
        running = [r for r in seats if r is not None and not r.is_finished]
        admitted, prompts, free_blocks = [], {}, kv.free_blocks
        tokens_left, free_seats = self.max_batched_tokens, seats.count(None)
        for request in waiting:
            todo = request.num_tokens - computed_before(request, kv)
            cost = kv.blocks_to_admit(request.num_tokens, request.tokens)
            if len(admitted) == free_seats or todo > tokens_left or cost > free_blocks:
                break  # (vLLM's order: the head of the queue waits, nobody passes it)
            admitted.append(request)
            prompts[request.id], tokens_left, free_blocks = todo, tokens_left - todo, free_blocks - cost
        if admitted:  # a prompt step: the running requests sit it out
            return Plan(admit=admitted, tokens=prompts | {r.id: 0 for r in running})
        victims, tokens, _ = keep_running(running, kv, None)
        return Plan(preempt=victims, tokens=tokens)
