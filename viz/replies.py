"""What each user sees at a given step: their reply so far, and where their request stands.

Each step's seat entries say how many tokens a request produced in it: one for a decode row and
for the last chunk of a prompt (a prefill after a preemption recomputes the old tokens and
produces one new one), none for an earlier chunk, a held seat or a stalled one; with speculative
decoding a decode row that checked guesses produces up to one more than it checked.
The last one may be the EOS, which is not in output_ids (slicing past the end is harmless).
The statuses are the table's (table.py: status_grid); these functions answer for one request.
"""

from __future__ import annotations

from minillm.layers.trace import Trace
from minillm.model.tokenizer import decode
from viz.table import TraceTable, table_of


def _place(table: TraceTable, request_id: str) -> int:
    return table.ids.index(request_id)


def tokens_produced(source: Trace | TraceTable, request_id: str, step: int) -> int:
    table = table_of(source)
    return int(table.produced(step)[_place(table, request_id)])


def text_at_step(source: Trace | TraceTable, request_id: str, step: int) -> str:
    """The reply text the user has received by the end of `step`."""
    table = table_of(source)
    i = _place(table, request_id)
    return decode(table.requests[i].output_ids[: table.produced(step)[i]])


def status_at_step(source: Trace | TraceTable, request_id: str, step: int) -> str:
    """Where a request stands at `step`: 'not arrived', 'waiting', 'running', 'preempted' (back in the
    queue), 'held' (done, but keeping its seat idle), 'finished (eos|length)' or its rejection reason."""
    table = table_of(source)
    return table.status_name(_place(table, request_id), min(step, table.num_steps - 1))
