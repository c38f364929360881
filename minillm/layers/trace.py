"""The trace: every step the engine took, and what became of every request.

It is the single source of truth: the app replays it, the notebooks plot it, metrics
are computed from it and tests check invariants on it. Saved as JSON (documented in
README); a file from elsewhere is read back through runs/trace_file.py, which checks it first.

Per step it records only the seats that are occupied, each as [seat, request id, state, tokens it
ran, tokens it produced], so a long run on a card with 256 seats stays small; `StepRecord.slots` gives
the familiar one-entry-per-seat view. Version 3 adds speculative decoding: a row that checked draft
tokens may produce several tokens in a step, and the step records the guesses and how many were kept.
(Versions 1 and 2 are upgraded by runs/trace_file.py.)

Seam: after the step. Recorder is the observer that keeps a StepRecord of every step the engine
takes (engine.Step says what it did; the other layers' additions are read from them: the tokens a
pattern allowed, the guesses checked, the KV blocks copied or moved between tiers), before the step's
finished requests free their KV.
"""

from __future__ import annotations

import json
from copy import copy
from dataclasses import MISSING, asdict, dataclass, field
from pathlib import Path

from minillm.engine.engine import Step
from minillm.engine.paged_books import PagedKVBooks
from minillm.engine.request import Request

FORMAT, VERSION = "minillm-trace", 3
# prefill: ran (a chunk of) its prompt; decode: ran its last token; held: finished, keeping its seat (static);
# stalled: seated, but the step's token budget ran out before its turn
SLOT_STATES = ("prefill", "decode", "held", "stalled")
KV_FULL = "the KV cache was full: newest"  # why the core's policies preempt (layers/policies.py: other rules)
# device blocks a step filled by a copy (a reply's copy of its prompt's partly filled last block: replies.py), wrote
# through to host memory, or loaded from it (tier.py)
KV_MOVES = ("copied", "to_host", "from_host")


@dataclass
class RequestRecord:
    id: str
    prompt_ids: list[int]
    output_ids: list[int]
    arrival_step: int
    admit_step: int | None
    first_token_step: int | None
    finish_step: int | None
    finish_reason: str | None  # "eos", "length", "aborted", or "rejected: <why>"
    preemptions: int
    prompt: str = ""
    max_new_tokens: int = 0
    arrival_s: float | None = None  # seconds on the run's clock (None: arrived by step; see the step's start)
    first_token_s: float | None = None  # seconds since the run began
    finish_s: float | None = None
    prefill_tokens: int = 0  # prompt tokens run through the model (recomputation after preemption included)
    prompt_tokens_from_cache: int = 0  # prompt tokens its first admission took from the prefix cache
    drafts_verified: int = 0  # draft tokens the model checked (speculative decoding)
    drafts_accepted: int = 0  # ... and kept
    service: dict = field(default_factory=dict)  # its class, priority and targets (layers/service.py), if given


@dataclass
class StepRecord:
    step: int
    seats: list[list]  # occupied seats only: [seat, request id, state, tokens run, tokens produced]
    tokens: int  # output tokens produced this step
    kv_blocks_used: int
    kv_blocks_total: int
    wall_s: float  # duration of this step
    waiting: list[str] = field(default_factory=list)  # the head of the queue (at most engine.WAITING_RECORDED ids)
    admitted: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    num_seats: int = 0
    num_waiting: int = 0  # the queue's length
    padding_rows: int = 0  # rows computed for nothing (static batching's held seats)
    kv_cached_blocks: int = 0  # free blocks still holding a cached prefix
    kv_tokens_stored: int = 0  # tokens in the KV cache (a shared block counted once)
    kv_tables: dict[str, list[int]] = field(default_factory=dict)  # request id -> its KV blocks (if recorded)
    kv_tokens: dict[str, int] = field(default_factory=dict)  # request id -> tokens stored in the cache (if recorded)
    kv_cached_free: list[int] = field(default_factory=list)  # free blocks still holding a cached prefix (if recorded)
    drafts: dict[str, list[int]] = field(default_factory=dict)  # request id -> the draft tokens its row checked
    accepted: dict[str, int] = field(default_factory=dict)  # request id -> how many of them the model kept
    allowed: dict[str, int] = field(default_factory=dict)  # constrained request id -> tokens its mask allowed
    preempted_why: dict[str, str] = field(default_factory=dict)  # preempted id -> why the policy chose it
    kv_moves: dict[str, list[int]] = field(default_factory=dict)  # KV_MOVES name -> device blocks (if recorded)
    time_s: float = 0.0  # seconds since the run began, at the end of this step

    @property
    def slots(self) -> list[dict | None]:
        """One entry per seat: None, or {"id", "state", "tokens", "produced"}."""
        slots: list[dict | None] = [None] * self.num_seats
        for seat, rid, state, tokens, produced in self.seats:
            slots[seat] = {"id": rid, "state": state, "tokens": tokens, "produced": produced}
        return slots

    @property
    def computed_tokens(self) -> int:
        """Tokens run through the model this step (prompt chunks and decode rows, padding not included)."""
        return sum(entry[3] for entry in self.seats)

    @property
    def prefill_tokens(self) -> int:
        return sum(entry[3] for entry in self.seats if entry[2] == "prefill")


@dataclass
class Trace:
    config: dict
    requests: list[RequestRecord]
    steps: list[StepRecord]

    def to_dict(self) -> dict:
        return {
            "format": FORMAT,
            "version": VERSION,
            "config": self.config,
            "requests": [asdict(r) for r in self.requests],
            "steps": [step_to_dict(s, self.config) for s in self.steps],
        }

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), separators=(",", ":")))

    def request(self, request_id: str) -> RequestRecord:
        return next(r for r in self.requests if r.id == request_id)

    @classmethod
    def from_dict(cls, data: dict) -> Trace:
        """A trace from its JSON form (version 3, already checked: see runs/trace_file.py for files from elsewhere)."""
        requests = [RequestRecord(**_known(RequestRecord, r)) for r in data["requests"]]
        per_run = {"num_seats": data["config"]["slots"], "kv_blocks_total": data["config"]["num_blocks"]}
        steps = [StepRecord(**(per_run | _known(StepRecord, s))) for s in data["steps"]]
        return cls(config=data["config"], requests=requests, steps=steps)


def request_record(r: Request, service=None) -> RequestRecord:
    """The request's fields of the same names (lists copied: a live request's reply keeps growing), and its
    service (layers/service.py) if it has one."""
    record = RequestRecord(**{name: copy(getattr(r, name)) for name in SHARED_FIELDS})
    record.service = service.to_dict() if service is not None else {}
    return record


SHARED_FIELDS = [name for name in RequestRecord.__dataclass_fields__ if name in Request.__dataclass_fields__]


STEP_DEFAULTS = {name: f.default for name, f in StepRecord.__dataclass_fields__.items() if f.default is not MISSING}


def step_to_dict(step: StepRecord, config: dict) -> dict:
    """A step as JSON: fields at their default (no padding, no recorded tables...) or equal to the run's
    config (seats, pool size) are left out, so a long simulated run
    (tens of thousands of steps) stays small."""
    out = {}
    for name, value in vars(step).items():
        if (name, value) in (("num_seats", config.get("slots")), ("kv_blocks_total", config.get("num_blocks"))):
            continue
        empty = isinstance(value, dict | list) and not value and name != "seats"
        if empty or name in STEP_DEFAULTS and value == STEP_DEFAULTS[name]:
            continue
        out[name] = value
    return out


def _known(kind, data: dict) -> dict:
    return {k: v for k, v in data.items() if k in kind.__dataclass_fields__}  # extra fields are welcome


# --- what an engine records ----------------------------------------------------------------------------------------
WAITING_RECORDED = 100  # ids of the queue's head recorded per step (the length is always recorded)


class Recorder:
    """The observer that keeps the trace: a StepRecord per step, then the run's Trace on demand."""

    def __init__(self, engine, sampler=None, speculation=None):
        self.records: list[StepRecord] = []
        self.sampler, self.speculation = sampler, speculation
        engine.observers.append(self.observe)

    def observe(self, engine, step: Step) -> None:
        record = step_record(engine, step)
        if self.sampler is not None:
            record.allowed = self.sampler.allowed  # (constrained rows: how many tokens they could pick)
        if self.speculation is not None:
            record.drafts = {rid: draft for rid, (draft, _) in self.speculation.verified.items()}
            record.accepted = {rid: n for rid, (_, n) in self.speculation.verified.items()}
        record.kv_moves = kv_moves(engine)
        self.records.append(record)


def kv_moves(engine) -> dict[str, list[int]]:
    """The step's block moves, which the layers that make them keep until read here (and cleared, recorded or not).
    Fork copies and loads happen as requests are seated, in the step; the Tier writes through in its after_step,
    which runs before this one (LayeredEngine creates the Tier before the Recorder), so a step's record holds its own
    writes, not the step before's (tests/test_viz_moves.py checks the totals against the tier's events)."""
    moves = {}
    for layer in (getattr(engine, "replies", None), getattr(engine, "tier", None)):
        for name, blocks in getattr(layer, "moves", {}).items():
            if blocks and engine.cfg.record_blocks:  # (block ids mean something beside the block tables only)
                moves[name] = list(blocks)
            blocks.clear()
    return moves


def step_record(engine, step: Step) -> StepRecord:
    """The step the engine just took: who sat where doing what, the queue, the KV memory as the forward used it."""
    ran = {r.id: n for r, n in step.rows}
    seats = []
    for seat, r in enumerate(engine.seats):
        if r is None:
            continue
        if r.id in ran:
            seats.append([seat, r.id, step.kinds[r.id], ran[r.id], step.made.get(r.id, 0)])
        else:
            seats.append([seat, r.id, "held" if r.is_finished else "stalled", 0, 0])
    live = {r.seat: r for r in engine.running() + step.finished}  # (finished this step: their KV is not freed yet)
    cache, now, caching = engine.cache, engine.clock.now(), engine.cfg.prefix_caching
    alloc = cache.allocator if caching else None
    record = StepRecord(
        step=step.number,
        num_seats=engine.cfg.slots,
        seats=seats,
        waiting=[r.id for _, r in zip(range(WAITING_RECORDED), engine.waiting)],
        num_waiting=len(engine.waiting),
        admitted=[r.id for r in step.plan.admit],
        finished=[r.id for r in step.finished],
        preempted=[r.id for r in step.plan.preempt],
        preempted_why=getattr(step.plan, "why", None) or {r.id: KV_FULL for r in step.plan.preempt},
        tokens=step.tokens,
        padding_rows=step.batch.padding_rows,
        kv_blocks_used=cache.blocks_in_use(list(live)),
        kv_blocks_total=cache.num_blocks,
        kv_cached_blocks=cached_free(alloc) if caching else 0,
        kv_tokens_stored=cache.stored_tokens,
        wall_s=round(now - step.begin, 9),  # nanoseconds are plenty, and keep a long trace's JSON short
        time_s=round(now, 9),
    )
    if engine.cfg.record_blocks:
        tables = block_map(cache, sorted(live))
        record.kv_tables = {live[s].id: t for s, t in tables.items()}
        record.kv_tokens = {r.id: cache.seat_tokens(s) for s, r in live.items()}
        # free blocks that still hold a keyed prefix, least recently freed first (the next reused)
        record.kv_cached_free = [b for b in alloc.free_blocks if b in alloc.key_of] if caching else []
    return record


def cached_free(alloc) -> int:
    """Free blocks still holding a keyed prefix, counted over the smaller of the two books (in C, by map: a simulated
    card's pool has tens of thousands of blocks, and this runs every step)."""
    keyed, free = alloc.key_of, alloc.free_blocks
    return sum(map(free.__contains__, keyed)) if len(keyed) < len(free) else sum(map(keyed.__contains__, free))


def block_map(cache, seats: list[int]) -> dict[int, list[int]]:
    """Blocks of memory each seat holds: a paged seat's block table; a contiguous seat's whole row
    (cut into blocks for drawing), however few tokens it stores."""
    if isinstance(cache, PagedKVBooks):
        return {s: list(cache.allocator.tables.get(s, [])) for s in seats}
    per = cache.blocks_per_seat
    return {s: list(range(s * per, (s + 1) * per)) for s in seats}


def run_trace(engine, records: list[StepRecord]) -> Trace:
    """The whole run so far: the engine's settings, every request's fate, every step."""
    cfg, scheduler = engine.cfg, engine.scheduler
    config = {
        "scheduler": scheduler.name,
        "kv": cfg.kv,
        "slots": cfg.slots,
        "block_size": cfg.block_size,
        "num_blocks": engine.cache.num_blocks,
        "max_len": engine.max_len,
        "token_budget": getattr(scheduler, "token_budget", None),
        "prefix_caching": cfg.prefix_caching,
        "prefix_cache_events": dict(engine.cache.allocator.events) if cfg.prefix_caching else None,
        "speculate": cfg.speculate,
        "drafter": engine.meta.get("drafter"),
        "device": str(engine.device),
        "clock": getattr(engine.clock, "name", "wall"),
        "model": engine.meta.get("model", "minillm"),
        "workload": engine.meta.get("workload", "custom"),
        "seed": engine.meta.get("seed"),
    } | {k: v for k, v in engine.meta.items() if k not in ("model", "workload", "seed")}
    services = getattr(engine, "services", {})
    requests = [request_record(r, services.get(r.id)) for r in engine.requests]
    by_id = {r.id: r for r in requests}
    for step in records:  # each request's checked guesses, summed from its steps
        for rid, draft in step.drafts.items():
            if (record := by_id.get(rid)) is not None:
                record.drafts_verified += len(draft)
                record.drafts_accepted += step.accepted[rid]
    return Trace(config=config, requests=requests, steps=list(records))
