"""Lesson 10 exercise: the abort path, what a server does when a client hangs up. Check your work: pytest -m lesson10"""

from __future__ import annotations

from minillm.engine.engine import Engine


def abort(engine: Engine, request_id: str, reason: str = "aborted") -> bool:
    """Stop request `request_id` wherever it is, and give back everything it holds, at once.

    A request that has not finished is in exactly one of three places:
      - engine.pending   submitted, its arrival still to come (a list sorted by arrival)
      - engine.waiting   arrived, queued (a deque)
      - a seat           engine.seats[r.seat] is r, and the KV cache holds its blocks; that may be in the
                         middle of its prompt (a long prompt is prefilled in chunks) or of its reply
    Take it out of that place; if it had a seat, free its KV blocks (engine.cache.free(seat)) and the
    seat (engine.seats[seat] = None), so the next step can give both to somebody else.
    Then mark it finished: r.state = State.FINISHED (from minillm.engine.request), r.finish_reason = reason,
    r.finish_step = engine.step_no, r.finish_s = engine.clock.now().

    Find the request in engine.requests (everything submitted; an id may be used again once its first
    request finished: abort the one that has not). Return True if you aborted it; False if no such request
    is there or it has already finished, a request the engine rejected included (a finished request may still
    name the seat it once had: somebody else may sit there now, so touch nothing).
    A request back in the queue after a preemption has output and once had a seat, but no seat now: it is
    queued. Touch nothing else: the other requests, the number of seats, engine.requests; engine.waiting stays
    a deque (remove in place). Whether you also clear r.seat is yours to choose.
    """
    raise NotImplementedError("lesson 10: take the request out of wherever it is and free its seat and KV blocks")
