"""Lesson 06 exercise: latency from a trace, then a scheduling decision. Check your work: pytest -m lesson06"""

from __future__ import annotations

from minillm.engine.request import Request
from minillm.engine.scheduler import KVSpace, Plan  # only these two: the policy is yours to write
from minillm.layers.trace import Trace


def ttft_tpot(trace: Trace) -> dict[str, dict[str, float | None]]:
    """Part 1. Per finished request id: {"ttft_steps": ..., "tpot_steps": ...}, counted in engine steps.

    TTFT (time to first token): the steps from the request's arrival to the step that produced its first
    token, both counted (a request admitted in the step it arrives waits 1 step): a whole number of steps.
    TPOT (time per output token): the average number of steps between two consecutive tokens after the
    first, (finish step - first token step) / (tokens produced - 1). An EOS counts as a token (producing it
    took a step; output_ids does not hold it). None when there is only one token (a reply that is only an EOS
    included). Any real number will do (float, Fraction, numpy); it need not be whole: a preempted request
    waits between two of its tokens, and speculative decoding can produce several tokens in ONE step (TPOT
    below 1).
    Skip requests that did not finish (finish_reason not "eos" or "length": rejected, aborted, still running);
    every finished one gets an entry, a reply that is only an EOS too. A trace may be empty ({}).
    Everything you need is in trace.requests (see minillm/layers/trace.py: RequestRecord). Leave the trace as
    it is, and build a new dict on every call.
    """
    raise NotImplementedError("lesson 06: compute TTFT and TPOT per request from the trace")


class MyFairScheduler:
    """Part 2. Continuous batching that beats first come, first served on TTFT p90, without starving anyone.

    The engine calls schedule(waiting, seats, kv) once per step, from step 0 (count your calls to know the
    step), exactly as in lesson 04. In every crowd your policy serves here memory is plentiful (whoever waits
    fits): you may leave preemption out. You may use r.max_new_tokens (in the judged crowds, exactly the length
    of the reply), r.arrival_step, your step count, and the order of `waiting` (arrival order, the head first).

    Judged against first come, first served on the crowds of lessons/fairness.py (four seats):
      - TTFT p90 (nearest rank) at least 15% lower;
      - nobody starves: no user waits longer for a first token than the longest wait under FCFS.
    Then drawn crowds (1 to 12 users on 1 to 4 seats; some replies end on EOS before max_new_tokens) check what
    every right policy does: the engine carries out each plan, and everybody is served in full.
    Return Plan(admit=[...]): requests from `waiting`, at most one per free seat, and one for EVERY free seat
    while anybody waits (your policy decides who boards first, never whether a seat stays empty).
    """

    name = "my-fair"
    holds_finished_seats = False

    def schedule(self, waiting: list[Request], seats: list[Request | None], kv: KVSpace) -> Plan:
        raise NotImplementedError("lesson 06: choose who boards first, so the queue's tail waits less")
