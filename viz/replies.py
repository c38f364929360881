"""What each user sees at a given step: their reply so far, and where their request stands.

Every step in which a request is prefilled or decoded produces exactly one new token for it
(a prefill after a preemption recomputes the old tokens and produces one new one), so the
tokens produced by step s = the steps t <= s where its seat state was prefill or decode.
The last one may be the EOS, which is not in output_ids (slicing past the end is harmless).
"""

from __future__ import annotations

import numpy as np

from minillm.tokenizer import decode
from minillm.trace import Trace


def tokens_produced(trace: Trace, request_id: str, step: int) -> int:
    return sum(
        1
        for record in trace.steps[: step + 1]
        for slot in record.slots
        if slot and slot["id"] == request_id and slot["state"] != "held"
    )


def produced_counts(trace: Trace) -> dict[str, np.ndarray]:
    """Request id -> tokens produced by each step (cumulative); one pass, for replaying every request at once."""
    index = {r.id: i for i, r in enumerate(trace.requests)}
    working = np.zeros((len(trace.requests), len(trace.steps)), dtype=np.int32)
    for t, record in enumerate(trace.steps):
        for slot in record.slots:
            if slot and slot["state"] != "held":
                working[index[slot["id"]], t] = 1
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
    seat = next((s for s in record.slots if s and s["id"] == request_id), None)
    if seat is not None and seat["state"] == "held":
        return "held"
    if r.finish_step is not None and step >= r.finish_step:
        return f"finished ({r.finish_reason})"
    if seat is not None:
        return "running"
    if request_id in record.waiting and any(request_id in s.preempted for s in trace.steps[: step + 1]):
        return "preempted"
    return "waiting"
