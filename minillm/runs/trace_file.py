"""Reading a trace file from elsewhere: checked field by field before any of it is used.

A trace may come from an upload in the app, a server's /trace or an old run on disk. It is plain
JSON (never pickle: loading runs no code from the file), and anything malformed is a TraceError that
names the first thing wrong. Older files are upgraded on the way in: version 1 (one entry per seat per
step, no token counts) to version 2's shape, and version 2 to 3 as it is (version 3 only adds speculative
decoding's draft tokens, which a version 2 run never had); older files' `cached_prompt_tokens` read as
`prompt_tokens_from_cache` (see `renamed_fields`). A step's `kv_moves` (blocks copied, or moved between the device
and host memory) is optional: files from before it load with none.
"""

from __future__ import annotations

import json
from pathlib import Path

from minillm.errors import InputError, MinillmError
from minillm.layers.service import Service
from minillm.layers.trace import FORMAT, KV_MOVES, SLOT_STATES, Trace

READABLE_VERSIONS = (1, 2, 3)


class TraceError(MinillmError):
    """A trace file that is not a valid minillm trace."""


def from_dict(data: object) -> Trace:
    """A checked trace from parsed JSON (any readable version)."""
    validate(data)
    if data["version"] == 1:
        data = upgrade_v1(data)
    return Trace.from_dict(renamed_fields(data) | {"version": 3})  # (a version 2 trace is a version 3 one)


def loads(text: str | bytes) -> Trace:
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TraceError(f"not a JSON file ({e})") from None
    return from_dict(data)


def load(path: str | Path) -> Trace:
    return loads(Path(path).read_bytes())


def renamed_fields(data: dict) -> dict:
    """Traces written before `prompt_tokens_from_cache` have `cached_prompt_tokens`: the same figure summed over
    a request's admissions (so it could exceed the prompt after a preemption). Read it capped at the prompt:
    exact for every request that was never preempted."""
    requests = [
        r | {"prompt_tokens_from_cache": min(r["cached_prompt_tokens"], len(r["prompt_ids"]))}
        if "cached_prompt_tokens" in r and "prompt_tokens_from_cache" not in r
        else r
        for r in data["requests"]
    ]
    return data | {"requests": requests}


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
        if (problem := service_problem(r.get("service", {}))) is not None:
            fail(f'request {i}: "service" must be an object of its class, priority and targets: {problem}')
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
        why = s.get("preempted_why", {})
        if not isinstance(why, dict) or not all(isinstance(v, str) for v in why.values()):
            fail(f'step {i}: "preempted_why" must be an object: preempted request id -> why (text)')
        if not isinstance(s.get("kv_blocks_total", 0), int):
            fail(f'step {i}: "kv_blocks_total" must be an integer')
        drafts, accepted = s.get("drafts", {}), s.get("accepted", {})
        if not isinstance(drafts, dict) or not isinstance(accepted, dict) or set(accepted) - set(drafts):
            fail(f'step {i}: "drafts" and "accepted" must be objects keyed by the ids of requests that checked drafts')
        if any(not isinstance(n, int) or not 0 <= n <= len(drafts[rid]) for rid, n in accepted.items()):
            fail(f"step {i}: a request cannot accept more draft tokens than it checked")
        total = s.get("kv_blocks_total", data["config"]["num_blocks"])
        if (problem := moves_problem(s.get("kv_moves", {}), total)) is not None:
            fail(f'step {i}: "kv_moves" must be an object of {"/".join(KV_MOVES)} -> [block ids]: {problem}')
        if data["version"] == 1:
            _validate_v1_slots(s, i, slots, ids, fail)
        else:
            _validate_seats(s, i, slots, ids, fail)


def service_problem(service: object) -> str | None:
    """What is wrong with a request's promised service (layers/service.py), or None."""
    if not isinstance(service, dict):
        return f"got {type(service).__name__}"
    try:
        Service.from_dict(service)
    except (InputError, TypeError) as e:
        return str(e)
    return None


def moves_problem(moves: object, total: object) -> str | None:
    """What is wrong with a step's block moves (layers/trace.py's KV_MOVES, each a list of blocks of the pool)."""
    if not isinstance(moves, dict):
        return f"got {type(moves).__name__}"
    if unknown := set(moves) - set(KV_MOVES):
        return f"unknown {sorted(unknown)}"
    limit = total if isinstance(total, int) else float("inf")  # (a config's pool size is not checked elsewhere)
    in_pool = lambda b: isinstance(b, int) and not isinstance(b, bool) and 0 <= b < limit  # noqa: E731
    bad = [name for name, blocks in moves.items() if not isinstance(blocks, list) or not all(map(in_pool, blocks))]
    return f'"{bad[0]}" is not a list of blocks of the pool ({total} blocks)' if bad else None


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
