"""What each user sees at a given step: their reply so far, and where their request stands.

Each step's seat entries say how many tokens a request produced in it: one for a decode row and
for the last chunk of a prompt (a prefill after a preemption recomputes the old tokens and
produces one new one), none for an earlier chunk, a held seat or a stalled one; with speculative
decoding a decode row that checked guesses produces up to one more than it checked.
The last one may be the EOS, which is not in output_ids (slicing past the end is harmless).
"""

from __future__ import annotations

import numpy as np

from minillm.engine.trace import Trace
from minillm.model.tokenizer import decode
from viz.seats import SeatTable, seat_table


def tokens_produced(trace: Trace, request_id: str, step: int) -> int:
    return sum(made for record in trace.steps[: step + 1] for _, rid, _, _, made in record.seats if rid == request_id)


def produced_counts(trace: Trace) -> dict[str, np.ndarray]:
    """Request id -> tokens produced by each step (cumulative); one pass, for replaying every request at once."""
    index = {r.id: i for i, r in enumerate(trace.requests)}
    working = np.zeros((len(trace.requests), len(trace.steps)), dtype=np.int32)
    for t, record in enumerate(trace.steps):
        for _, rid, _, _, made in record.seats:
            working[index[rid], t] = made
    counts = np.cumsum(working, axis=1)
    return {rid: counts[i] for rid, i in index.items()}


def text_at_step(trace: Trace, request_id: str, step: int) -> str:
    """The reply text the user has received by the end of `step`."""
    return decode(trace.request(request_id).output_ids[: tokens_produced(trace, request_id, step)])


def status_at_step(trace: Trace, request_id: str, step: int) -> str:
    """Where a request stands at `step`: 'not arrived', 'waiting', 'running', 'preempted' (back in the
    queue), 'held' (done, but keeping its seat idle), 'finished (eos|length)' or its rejection reason."""
    r = trace.request(request_id)
    step = min(step, len(trace.steps) - 1)
    if step < r.arrival_step:
        return "not arrived"
    if (r.finish_reason or "").startswith("rejected"):
        return r.finish_reason
    record = trace.steps[step]
    seat = next((s for s in record.seats if s[1] == request_id), None)
    if seat is not None and seat[2] == "held":
        return "held"
    if r.finish_step is not None and step >= r.finish_step:
        return f"finished ({r.finish_reason})"
    if seat is not None:
        return "running"
    if any(request_id in s.preempted for s in trace.steps[: step + 1]):
        return "preempted"
    return "waiting"


class RequestStatuses:
    """status_at_step and tokens_produced for every request at once, precomputed so a frame costs
    O(requests), not O(steps): the first preemption of each request, and who produced a token when."""

    def __init__(self, trace: Trace, table: SeatTable | None = None):
        table = table or seat_table(trace)
        self.trace = trace
        self.first_preempted: dict[str, int] = {}
        for t, record in enumerate(trace.steps):
            for rid in record.preempted:
                self.first_preempted.setdefault(rid, t)
        made = table.produced > 0
        self.made_step, self.made_request, self.made = table.step[made], table.request[made], table.produced[made]

    def produced(self, step: int) -> np.ndarray:
        """(requests,) tokens each request has produced by the end of `step`."""
        upto = self.made_step <= step
        return np.bincount(self.made_request[upto], self.made[upto], len(self.trace.requests)).astype(int)

    def status(self, r, step: int, seat_state: dict[str, str]) -> str:
        """What status_at_step(trace, r.id, step) says; seat_state: request id -> its seat's state at `step`."""
        if step < r.arrival_step:
            return "not arrived"
        if (r.finish_reason or "").startswith("rejected"):
            return r.finish_reason
        state = seat_state.get(r.id)
        if state == "held":
            return "held"
        if r.finish_step is not None and step >= r.finish_step:
            return f"finished ({r.finish_reason})"
        if state is not None:
            return "running"
        if self.first_preempted.get(r.id, step + 1) <= step:
            return "preempted"
        return "waiting"
