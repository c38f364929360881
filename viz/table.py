"""One table per trace: what every picture of a run shares, built in one pass over its steps.

Every chart of a run asks the trace the same questions: who sits in which seat doing what, each request's colour,
how a step's tokens split against the budget, where each request stands (waiting, running, finished...), the KV
pool's figures, what a constrained row's mask allowed, a speculating row's guesses. A TraceTable holds the answers
as columns: numpy arrays by step, seat or request, and the few per-step lists a frame shows as they are (the
queue's head, the block tables). Every chart is a function of the table and a step; nothing reads the raw trace
again. `table_of` keeps the last few tables, so a notebook that hands the same trace to one function after another
builds its table once.

Memory: two (seats, steps) grids of 5 bytes a cell and one (requests, steps) grid of statuses of 1 byte: a
simulated run of 20,000 steps on 256 seats with 2,000 requests holds about 65 MB.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from minillm.layers.trace import RequestRecord, Trace
from minillm.runs.metrics import per_request, summarize
from viz.colors import DECODE, HELD, PREFILL, request_colors
from viz.seats import SeatTable, seat_grids, seat_table_of

# A request's status at a step, and its words (replies.status_at_step's); finished and rejected: its own reason
NOT_ARRIVED, WAITING, RUNNING, PREEMPTED, HELD_SEAT, FINISHED, REJECTED = range(7)
STATUS_NAMES = ("not arrived", "waiting", "running", "preempted", "held")  # (by code)
NEVER = np.iinfo(np.int32).max  # the step of something that does not happen
STEP_FIELDS = ("seats", "tokens", "time_s", "wall_s", "num_waiting", "padding_rows", "kv_blocks_used",
               "kv_blocks_total", "kv_cached_blocks", "kv_tokens_stored", "waiting", "admitted", "finished",
               "preempted", "kv_tables", "kv_tokens", "kv_cached_free", "drafts", "accepted", "allowed")  # fmt: skip


@dataclass(frozen=True, eq=False)
class TraceTable:
    config: dict
    requests: list[RequestRecord]  # in workload order: a request's index is its place here
    colors: dict[str, str]  # request id -> its colour in every view (colors.request_colors)
    entries: SeatTable  # one row per occupied seat per step (seats.py)
    states: np.ndarray  # (seats, steps) int8: colors' state codes, 0 for an empty seat
    occupant: np.ndarray  # (seats, steps) int32: the seated request's index, -1 for an empty seat
    splits: np.ndarray  # (steps, 3) int64: decode, prefill and padding tokens (budget.py)
    budget: int | None  # the run's tokens per step (None: no budget; a version 1 trace may not say)
    status: np.ndarray  # (requests, steps) int8: NOT_ARRIVED ... REJECTED
    tokens: np.ndarray  # (steps,) output tokens made
    time_s: np.ndarray  # (steps,) seconds at the end of each step
    wall_s: np.ndarray  # (steps,) each step's duration
    num_waiting: np.ndarray  # (steps,) the queue's length
    kv: dict[str, np.ndarray]  # (steps,) each: kv_blocks.kv_memory's figures (the pool in blocks, tokens stored)
    waiting: list[list[str]]  # per step: the queue's head, as recorded
    admitted: list[list[str]]
    finished: list[list[str]]
    preempted: list[list[str]]
    kv_tables: list[dict[str, list[int]]]  # per step: the block map (empty where the run recorded none)
    kv_tokens: list[dict[str, int]]
    kv_cached_free: list[list[int]]
    guesses: dict[int, dict[str, tuple[list[int], int]]]  # step -> request id -> (its draft tokens, how many kept)
    allowed: list[dict[str, int]]  # per step: constrained request id -> tokens its mask allowed (rows that picked)
    constrained: frozenset[str]  # the requests a constraint held (each appears in `allowed` when it picks)
    summary: dict  # the whole run's figures (metrics.summarize)
    final: dict[str, dict]  # each request's figures over the whole run (metrics.per_request)

    @property
    def num_steps(self) -> int:
        return self.states.shape[1]

    @property
    def num_seats(self) -> int:
        return self.states.shape[0]

    @property
    def ids(self) -> list[str]:
        return [r.id for r in self.requests]

    @property
    def has_block_map(self) -> bool:
        return any(self.kv_tables)

    def status_name(self, i: int, step: int) -> str:
        """Request i's status at `step` in words: 'waiting', 'finished (eos)', its rejection reason..."""
        code = int(self.status[i, step])
        if code in (FINISHED, REJECTED):
            reason = self.requests[i].finish_reason
            return f"finished ({reason})" if code == FINISHED else reason
        return STATUS_NAMES[code]

    def produced(self, step: int) -> np.ndarray:
        """(requests,) tokens each request has produced by the end of `step` (entries are in step order)."""
        upto = np.searchsorted(self.entries.step, step, side="right")
        made = np.bincount(self.entries.request[:upto], self.entries.produced[:upto], len(self.requests))
        return made.astype(int)

    def made_at(self, step: int) -> dict[str, int]:
        """Request id -> tokens it produced in `step` (the seated ones)."""
        first, end = np.searchsorted(self.entries.step, [step, step + 1])
        rows = zip(self.entries.request[first:end].tolist(), self.entries.produced[first:end].tolist())
        return {self.requests[i].id: made for i, made in rows}

    def kv_memory(self, step: int) -> dict[str, int]:
        return {name: int(values[step]) for name, values in self.kv.items()}


def build_table(trace: Trace) -> TraceTable:
    """The table of `trace`: its steps' fields read in one pass, then array arithmetic."""
    steps, config = trace.steps, trace.config
    columns = dict(zip(STEP_FIELDS, zip(*map(attrgetter(*STEP_FIELDS), steps)))) if steps else {}
    column = lambda name: list(columns.get(name, ()))
    number = lambda name, dtype=np.int64: np.array(column(name), dtype=dtype)
    index = {r.id: i for i, r in enumerate(trace.requests)}
    entries = seat_table_of(column("seats"), index, config["slots"])
    states, occupant = seat_grids(entries)
    decode = entries.per_step(entries.tokens, entries.state == DECODE)
    prefill = entries.per_step(entries.tokens, entries.state == PREFILL)
    splits = np.stack([decode, prefill, number("padding_rows")], axis=1).astype(np.int64)
    used, total, stored_tokens = number("kv_blocks_used"), number("kv_blocks_total"), number("kv_tokens_stored")
    stored = np.where(used > 0, np.minimum(used, -(-stored_tokens // config["block_size"])), 0)
    cached = np.minimum(number("kv_cached_blocks"), total - used)  # (a shared block counted once: whole blocks)
    kv = {"stored": stored, "reserved": used - stored, "cached": cached, "free": total - used - cached,
          "total": total, "tokens": stored_tokens}  # fmt: skip
    drafts, accepted, allowed = column("drafts"), column("accepted"), column("allowed")
    guesses = {t: {rid: (draft, accepted[t][rid]) for rid, draft in d.items()} for t, d in enumerate(drafts) if d}
    return TraceTable(
        config=config,
        requests=list(trace.requests),
        colors=request_colors(trace),
        entries=entries,
        states=states,
        occupant=occupant,
        splits=splits,
        budget=config.get("token_budget") or None,
        status=status_grid(trace.requests, entries, column("preempted")),
        tokens=number("tokens"),
        time_s=number("time_s", float),
        wall_s=number("wall_s", float),
        num_waiting=number("num_waiting", np.int32),
        kv=kv,
        waiting=column("waiting"),
        admitted=column("admitted"),
        finished=column("finished"),
        preempted=column("preempted"),
        kv_tables=column("kv_tables"),
        kv_tokens=column("kv_tokens"),
        kv_cached_free=column("kv_cached_free"),
        guesses=guesses,
        allowed=allowed,
        constrained=frozenset(rid for step in allowed for rid in step),
        summary=summarize(trace),
        final=per_request(trace),
    )


def status_grid(requests: list[RequestRecord], entries: SeatTable, preempted: list[list[str]]) -> np.ndarray:
    """(requests, steps) status codes. Set from the weakest rule to the strongest: waiting; preempted once sent back
    (and not seated again); running while seated; finished from its last token; held while it keeps a seat idle;
    rejected; not arrived before its arrival step."""
    index = {r.id: i for i, r in enumerate(requests)}
    step = np.arange(entries.num_steps)
    seated = np.zeros((len(requests), entries.num_steps), dtype=np.int8)  # the state of its seat, 0: none
    seated[entries.request, entries.step] = entries.state
    first_preempted = np.full(len(requests), NEVER, dtype=np.int64)
    for t, ids in reversed(list(enumerate(preempted))):  # (the earliest wins)
        first_preempted[[index[rid] for rid in ids]] = t
    per_request = lambda values: np.array(values, dtype=np.int64).reshape(-1, 1)  # (requests, 1): broadcasts
    finish = per_request([NEVER if r.finish_step is None else r.finish_step for r in requests])
    arrival = per_request([r.arrival_step for r in requests])
    rejected = np.array([(r.finish_reason or "").startswith("rejected") for r in requests], dtype=bool)
    status = np.full(seated.shape, WAITING, dtype=np.int8)
    status[step >= first_preempted[:, None]] = PREEMPTED
    status[seated > 0] = RUNNING
    status[step >= finish] = FINISHED
    status[seated == HELD] = HELD_SEAT
    status[rejected] = REJECTED
    status[step < arrival] = NOT_ARRIVED
    return status


KEPT = 8  # tables kept by table_of (a player keeps its own as long as it lives)
_kept: dict[int, tuple[weakref.ref, tuple[int, int], TraceTable]] = {}


def table_of(source: Trace | TraceTable) -> TraceTable:
    """The table of a trace, built once and kept while the trace lives (a table is returned as it is). A trace that
    has grown since (more steps or requests) gets a new one."""
    if isinstance(source, TraceTable):
        return source
    size = (len(source.steps), len(source.requests))
    kept = _kept.pop(id(source), None)
    if kept is None or kept[0]() is not source or kept[1] != size:
        kept = (weakref.ref(source), size, build_table(source))
    _kept[id(source)] = kept  # (the newest last)
    while len(_kept) > KEPT:
        _kept.pop(next(iter(_kept)))
    return kept[2]
