"""The trace: every step the engine took, and what became of every request.

It is the single source of truth: the app replays it, the notebooks plot it, metrics
are computed from it and tests check invariants on it. Saved as JSON (documented in
README), loaded back with validation: a malformed file is a clear TraceError, and
loading never runs code from the file (plain json, no pickle).

Version 2 records, per step, only the seats that are occupied, each as
[seat, request id, state, tokens it ran, tokens it produced], so a long run on a card
with 256 seats stays small; `StepRecord.slots` gives the familiar one-entry-per-seat view.
Version 1 files (one entry per seat, no token counts) still load.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, field
from pathlib import Path

from minillm.errors import MinillmError

FORMAT, VERSION = "minillm-trace", 2
READABLE_VERSIONS = (1, 2)
# prefill: ran (a chunk of) its prompt; decode: ran its last token; held: finished, keeping its seat (static);
# stalled: seated, but the step's token budget ran out before its turn
SLOT_STATES = ("prefill", "decode", "held", "stalled")


class TraceError(MinillmError):
    """A trace file that is not a valid minillm trace."""


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
    cached_prompt_tokens: int = 0  # prompt tokens served from the prefix cache


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
    def from_dict(cls, data: object) -> Trace:
        validate(data)
        if data["version"] == 1:
            data = upgrade_v1(data)
        requests = [RequestRecord(**_known(RequestRecord, r)) for r in data["requests"]]
        per_run = {"num_seats": data["config"]["slots"], "kv_blocks_total": data["config"]["num_blocks"]}
        steps = [StepRecord(**(per_run | _known(StepRecord, s))) for s in data["steps"]]
        return cls(config=data["config"], requests=requests, steps=steps)

    @classmethod
    def loads(cls, text: str | bytes) -> Trace:
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise TraceError(f"not a JSON file ({e})") from None
        return cls.from_dict(data)

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        return cls.loads(Path(path).read_bytes())


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


def upgrade_v1(data: dict) -> dict:
    """A version 1 trace (a full list of seats per step) in version 2's shape. A prefill then ran the
    prompt plus any earlier output, in one go, and produced a token; every decode ran and produced one."""
    prompt_len = {r["id"]: len(r["prompt_ids"]) for r in data["requests"]}
    made: dict[str, int] = {}
    steps = []
    for s in data["steps"]:
        seats = []
        for seat, slot in enumerate(s["slots"]):
            if slot is None:
                continue
            rid, state = slot["id"], slot["state"]
            ran = {"prefill": prompt_len[rid] + made.get(rid, 0), "decode": 1}.get(state, 0)
            seats.append([seat, rid, state, ran, int(state != "held")])
            made[rid] = made.get(rid, 0) + (state != "held")
        extra = {"num_seats": len(s["slots"]), "num_waiting": len(s["waiting"]), "seats": seats}
        steps.append({k: v for k, v in s.items() if k != "slots"} | extra)
    return data | {"steps": steps, "version": 2}


CONFIG_FIELDS = ("scheduler", "kv", "slots", "block_size", "num_blocks", "model", "device", "workload", "seed")
REQUEST_FIELDS = {"id": str, "prompt_ids": list, "output_ids": list, "arrival_step": int, "preemptions": int}
STEP_FIELDS = {"step": int, "tokens": int, "kv_blocks_used": int, "wall_s": (int, float)}
STEP_LISTS = ("waiting", "admitted", "finished", "preempted")  # may be left out when empty


def validate(data: object) -> None:
    """Raise TraceError naming the first thing wrong with a would-be trace."""

    def fail(msg: str):
        raise TraceError(f"invalid minillm trace: {msg}")

    if not isinstance(data, dict):
        fail("the top level must be a JSON object")
    if data.get("format") != FORMAT:
        fail(f'"format" must be "{FORMAT}", got {data.get("format")!r}')
    if data.get("version") not in READABLE_VERSIONS:
        fail(f"unsupported version {data.get('version')!r}; this minillm reads versions {READABLE_VERSIONS}")
    for key, kind in (("config", dict), ("requests", list), ("steps", list)):
        if not isinstance(data.get(key), kind):
            fail(f'"{key}" must be a JSON {"object" if kind is dict else "array"}')
    missing = [f for f in CONFIG_FIELDS if f not in data["config"]]
    if missing:
        fail(f"config lacks {missing}")
    ids = set()
    for i, r in enumerate(data["requests"]):
        for name, kind in REQUEST_FIELDS.items():
            if not isinstance(r, dict) or not isinstance(r.get(name), kind):
                fail(f'request {i}: "{name}" is missing or not a {kind.__name__}')
        ids.add(r["id"])
    slots = data["config"]["slots"]
    if not isinstance(slots, int) or slots < 1:
        fail('config "slots" must be a positive integer')
    for i, s in enumerate(data["steps"]):
        for name, kind in STEP_FIELDS.items():
            if not isinstance(s, dict) or not isinstance(s.get(name), kind):
                fail(f'step {i}: "{name}" is missing or has the wrong type')
        for name in STEP_LISTS:
            if not isinstance(s.get(name, []), list):
                fail(f'step {i}: "{name}" must be a list')
        if not isinstance(s.get("kv_blocks_total", 0), int):
            fail(f'step {i}: "kv_blocks_total" must be an integer')
        if data["version"] == 1:
            _validate_v1_slots(s, i, slots, ids, fail)
        else:
            _validate_seats(s, i, slots, ids, fail)


def _validate_v1_slots(s: dict, i: int, slots: int, ids: set, fail) -> None:
    if not isinstance(s.get("slots"), list) or len(s["slots"]) != slots:
        fail(f"step {i}: needs {slots} slots, as config says")
    for slot in s["slots"]:
        if slot is not None and (not isinstance(slot, dict) or slot.get("state") not in SLOT_STATES):
            fail(f"step {i}: a slot must be null or {{'id', 'state': {'|'.join(SLOT_STATES)}}}")
        if slot is not None and slot.get("id") not in ids:
            fail(f"step {i}: slot names unknown request {slot.get('id')!r}")


def _validate_seats(s: dict, i: int, slots: int, ids: set, fail) -> None:
    if not isinstance(s.get("seats"), list) or s.get("num_seats", slots) != slots:
        fail(f'step {i}: "seats" must be a list and "num_seats" must equal config slots ({slots})')
    for entry in s["seats"]:
        ok = isinstance(entry, list) and len(entry) == 5 and isinstance(entry[0], int) and 0 <= entry[0] < slots
        if not ok or entry[2] not in SLOT_STATES or not all(isinstance(x, int) for x in entry[3:]):
            fail(f"step {i}: a seat must be [seat < {slots}, id, {'|'.join(SLOT_STATES)}, tokens, produced]")
        if entry[1] not in ids:
            fail(f"step {i}: seat names unknown request {entry[1]!r}")
