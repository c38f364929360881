"""The trace: every step the engine took, and what became of every request.

It is the single source of truth: the app replays it, the notebooks plot it, metrics
are computed from it and tests check invariants on it. Saved as JSON (documented in
README), loaded back with validation: a malformed file is a clear TraceError, and
loading never runs code from the file (plain json, no pickle).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from minillm.errors import MinillmError

FORMAT, VERSION = "minillm-trace", 1
SLOT_STATES = ("prefill", "decode", "held")


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
    finish_reason: str | None  # "eos", "length", or "rejected: <why>"
    preemptions: int
    prompt: str = ""
    max_new_tokens: int = 0
    first_token_s: float | None = None  # seconds since the run began
    finish_s: float | None = None


@dataclass
class StepRecord:
    step: int
    slots: list[dict | None]  # per seat: None or {"id", "state": prefill | decode | held}
    waiting: list[str]
    admitted: list[str]
    finished: list[str]
    preempted: list[str]
    tokens: int  # output tokens produced this step
    kv_blocks_used: int
    kv_blocks_total: int
    wall_s: float  # duration of this step
    kv_tables: dict[str, list[int]] = field(default_factory=dict)  # request id -> its KV blocks
    kv_tokens: dict[str, int] = field(default_factory=dict)  # request id -> tokens stored in the cache
    time_s: float = 0.0  # seconds since the run began, at the end of this step


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
            "steps": [asdict(s) for s in self.steps],
        }

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict()))

    def request(self, request_id: str) -> RequestRecord:
        return next(r for r in self.requests if r.id == request_id)

    @classmethod
    def from_dict(cls, data: object) -> Trace:
        validate(data)
        requests = [RequestRecord(**_known(RequestRecord, r)) for r in data["requests"]]
        steps = [StepRecord(**_known(StepRecord, s)) for s in data["steps"]]
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


def _known(kind, data: dict) -> dict:
    return {k: v for k, v in data.items() if k in kind.__dataclass_fields__}  # extra fields are welcome


CONFIG_FIELDS = ("scheduler", "kv", "slots", "block_size", "num_blocks", "model", "device", "workload", "seed")
REQUEST_FIELDS = {"id": str, "prompt_ids": list, "output_ids": list, "arrival_step": int, "preemptions": int}
STEP_FIELDS = {"step": int, "slots": list, "waiting": list, "admitted": list, "finished": list, "preempted": list}
STEP_FIELDS |= {"tokens": int, "kv_blocks_used": int, "kv_blocks_total": int, "wall_s": (int, float)}


def validate(data: object) -> None:
    """Raise TraceError naming the first thing wrong with a would-be trace."""

    def fail(msg: str):
        raise TraceError(f"invalid minillm trace: {msg}")

    if not isinstance(data, dict):
        fail("the top level must be a JSON object")
    if data.get("format") != FORMAT:
        fail(f'"format" must be "{FORMAT}", got {data.get("format")!r}')
    if data.get("version") != VERSION:
        fail(f"unsupported version {data.get('version')!r}; this minillm reads version {VERSION}")
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
    for i, s in enumerate(data["steps"]):
        for name, kind in STEP_FIELDS.items():
            if not isinstance(s, dict) or not isinstance(s.get(name), kind):
                fail(f'step {i}: "{name}" is missing or has the wrong type')
        if len(s["slots"]) != slots:
            fail(f"step {i}: {len(s['slots'])} slots, but config says {slots}")
        for slot in s["slots"]:
            if slot is not None and (not isinstance(slot, dict) or slot.get("state") not in SLOT_STATES):
                fail(f"step {i}: a slot must be null or {{'id', 'state': {'|'.join(SLOT_STATES)}}}")
            if slot is not None and slot.get("id") not in ids:
                fail(f"step {i}: slot names unknown request {slot.get('id')!r}")
