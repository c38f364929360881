"""What happened in one step, in a line: who was admitted, who finished, who was preempted, which seats were freed.

The occupancy chart shows it as colour changes a room can miss; the step player says it in words under the chart
("seat 2 freed, E admitted"). Everything comes from two consecutive columns of the trace's table (table.py): the
step's own admitted / finished / preempted lists, and its seats beside the previous step's (a seat is freed when
the request that sat in it is gone; static batching's finished users stay seated, held, until the batch is done).
On a prefill engine a request that made its first token is handed over, not finished: its prompt's KV goes to the
decode engine (layers/handover.py), and the line says how much.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from minillm.layers.trace import Trace
from viz.colors import HELD
from viz.table import TraceTable, table_of

NAMES_SHOWN = 4  # ids or seats named in a list; the rest are counted ("E, F, G, H and 3 more")


@dataclass(frozen=True)
class StepEvents:
    step: int
    freed: list[int]  # seats whose request left since the previous step (finished, preempted, or its batch ended)
    admitted: list[tuple[str, int]]  # (request, the seat it got)
    finished: list[str]  # made their last token this step
    preempted: list[str]  # sent back to the queue, their KV blocks freed
    held: list[tuple[str, int]]  # (request, seat): done, its seat now held idle until the batch ends (static)
    handed: list[tuple[str, int]] = field(default_factory=list)  # (request, its prompt's tokens): made its first
    # token on a prefill engine; its KV goes to the decode engine

    @property
    def quiet(self) -> bool:
        return not (self.freed or self.admitted or self.finished or self.handed or self.preempted or self.held)


def step_events(source: Trace | TraceTable, step: int) -> StepEvents:
    """The changes of `step` against the step before it (step 0: against empty seats)."""
    table = table_of(source)
    who, state = table.occupant[:, step], table.states[:, step]
    before = table.occupant[:, step - 1] if step > 0 else np.full_like(who, -1)
    was_held = table.states[:, step - 1] == HELD if step > 0 else np.zeros(len(who), dtype=bool)
    freed = np.flatnonzero((before >= 0) & (who != before)).tolist()
    newly_held = np.flatnonzero((state == HELD) & (before >= 0) & ~was_held).tolist()  # (seat order)
    ids = table.ids
    seat_of = {ids[i]: seat for seat, i in enumerate(who.tolist()) if i >= 0}
    admitted = [(rid, seat_of[rid]) for rid in table.admitted[step] if rid in seat_of]
    held = [(ids[who[seat]], seat) for seat in newly_held]
    finished, handed = [], []
    for rid in table.finished[step]:
        request = table.requests[ids.index(rid)]  # (a few a step)
        if request.finish_reason == "handed-over":
            handed.append((rid, len(request.prompt_ids)))
        else:
            finished.append(rid)
    return StepEvents(step, freed, admitted, finished, list(table.preempted[step]), held, handed)


def in_words(items: list) -> str:
    """A list in words: E; E and F; E, F and G; E, F, G, H and 3 more."""
    words = [str(i) for i in items]
    if len(words) > NAMES_SHOWN:
        return f"{', '.join(words[:NAMES_SHOWN])} and {len(words) - NAMES_SHOWN} more"
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def _seats(seats: list[int]) -> str:
    """Seats in words: seat 2; seats 0–3; seats 1, 4 and 6."""
    if len(seats) == 1:
        return f"seat {seats[0]}"
    if seats == list(range(seats[0], seats[-1] + 1)):
        return f"seats {seats[0]}–{seats[-1]}"
    return f"seats {in_words(seats)}"


def describe(events: StepEvents, running: int = 0) -> str:
    """The step in one line, in the order things happen to a seat: freed, taken, finished, held, preempted.
    running: seats at work, for a step where nothing changed."""
    parts = []
    if events.freed:
        parts.append(f"{_seats(events.freed)} freed")
    handed = {rid for rid, _ in events.handed}  # (seated and handed over in one step: the hand-over says it)
    admitted = [(rid, seat) for rid, seat in events.admitted if rid not in handed]
    if admitted:
        rids, seats = [r for r, _ in admitted], sorted(s for _, s in admitted)
        parts.append(f"{in_words(rids)} admitted" + ("" if events.freed == seats else f" ({_seats(seats)})"))
    if events.finished:
        parts.append(f"{in_words(events.finished)} finished")
    if events.handed:
        tokens = sum(n for _, n in events.handed)
        who = in_words([rid for rid, _ in events.handed])
        parts.append(f"{who} handed over: {tokens} prompt tokens' KV to the decode engine")
    if len(events.held) == 1:
        parts.append(f"{events.held[0][0]}'s seat {events.held[0][1]} held idle until the batch is done")
    elif events.held:
        parts.append(f"{_seats([s for _, s in events.held])} held idle until the batch is done")
    if events.preempted:
        parts.append(f"{in_words(events.preempted)} preempted (back to the queue)")
    if not parts:
        return f"no change: {running} seat{'s' if running != 1 else ''} at work" if running else "no change"
    return ", ".join(parts)
