"""Serving metrics, computed from a trace alone (so a saved or uploaded trace gives the same figures).

  tokens/step, tokens/s   output tokens produced (an EOS counts: it took a step to produce)
  slot utilization        seat-steps doing useful work (prefill or decode) / all seat-steps
  prefix hit rate         prompt tokens the prefix cache served / prompt tokens admitted (each request's
                          first admission: a re-admission after preemption finds mostly its own blocks)
  TTFT                    time to first token: arrival -> the step that produced it
  TPOT                    time per output token after the first (one average per request)
  ITL                     inter-token latency: every gap between two tokens of a request
  queue time              arrival -> first admission
  latency                 arrival -> finish (end to end)
  KV waste                reserved-but-empty token slots / reserved token slots, averaged over steps
  draft acceptance        draft tokens the model kept / draft tokens it checked (speculative decoding)
  goodput                 finished requests that met all their targets (TTFT, TPOT, deadline: their Service,
                          layers/service.py) per second, overall and per class (DistServe, OSDI 2024); a
                          request with no target meets them by finishing
  longest wait            the longest arrival -> first admission: whether a policy starved anyone

Step-counted figures say what the policy did; second-counted ones include this machine's speed.
"""

from __future__ import annotations

import numpy as np

from minillm.layers.service import Service, judge
from minillm.layers.trace import StepRecord, Trace


def percentiles(values: list[float], qs=(50, 90, 99)) -> dict[str, float | None]:
    if not values:
        return {f"p{q}": None for q in qs}
    return {f"p{q}": float(np.percentile(values, q)) for q in qs}


def step_start_times(trace: Trace) -> list[float]:
    return [s.time_s - s.wall_s for s in trace.steps]


def busy_seats(step: StepRecord) -> int:
    """Seats that ran tokens this step (prefill or decode; not held, not stalled)."""
    return sum(1 for entry in step.seats if entry[2] in ("prefill", "decode"))


def slot_utilization(trace: Trace, upto: int | None = None) -> float:
    """Busy seat-steps over all seat-steps so far (the whole run's average)."""
    steps = trace.steps[: None if upto is None else upto + 1]
    if not steps:
        return 0.0
    return sum(busy_seats(s) for s in steps) / (len(steps) * trace.config["slots"])


def utilization_now(trace: Trace, step: int) -> float:
    """Busy seats at this one step over all seats: the instantaneous figure."""
    return busy_seats(trace.steps[step]) / trace.config["slots"]


def one_user_left(trace: Trace) -> tuple[int, int] | None:
    """The first stretch of steps (first, last) in which one request runs while finished ones hold their seats: a
    static batch waiting for its longest reply, the moment articles quote utilization for. None if there is none."""
    alone = {s.step for s in trace.steps if busy_seats(s) == 1 and any(e[2] == "held" for e in s.seats)}
    if not alone:
        return None
    first = last = min(alone)
    while last + 1 in alone:
        last += 1
    return first, last


def kv_waste(trace: Trace, upto: int | None = None) -> float:
    """Mean over steps (with anything cached) of the share of reserved slots holding no token."""
    block, shares = trace.config["block_size"], []
    for s in trace.steps[: None if upto is None else upto + 1]:
        reserved = s.kv_blocks_used * block
        if reserved:
            stored = s.kv_tokens_stored or sum(s.kv_tokens.values())  # (version 1 traces recorded only the tables)
            shares.append((reserved - stored) / reserved)
    return float(np.mean(shares)) if shares else 0.0


def prefix_cache_figures(trace: Trace, upto: int | None = None) -> dict[str, float | int]:
    """Tokens prefilled (recomputation after preemption included), the prompt tokens of the requests admitted
    and how many of those the prefix cache served at their first admission; the hit rate, at most 1."""
    steps = trace.steps[: None if upto is None else upto + 1]
    last = len(trace.steps) - 1 if upto is None else upto
    admitted = [r for r in trace.requests if r.admit_step is not None and r.admit_step <= last]
    prompt, cached = sum(len(r.prompt_ids) for r in admitted), sum(r.prompt_tokens_from_cache for r in admitted)
    return {
        "prefill_tokens": sum(s.prefill_tokens for s in steps),
        "prompt_tokens": prompt,
        "prompt_tokens_from_cache": cached,
        "prefix_hit_rate": cached / prompt if prompt else 0.0,
    }


def draft_figures(trace: Trace, upto: int | None = None) -> dict[str, float | int | None]:
    """Speculative decoding: draft tokens checked and kept, the share kept, and the tokens a row that checked
    guesses gained on average (the guesses kept, and the model's own next token)."""
    steps = trace.steps[: None if upto is None else upto + 1]
    rows = sum(len(s.drafts) for s in steps)
    verified = sum(len(draft) for s in steps for draft in s.drafts.values())
    accepted = sum(n for s in steps for n in s.accepted.values())
    return {
        "drafts_verified": verified,
        "drafts_accepted": accepted,
        "draft_acceptance": accepted / verified if verified else 0.0,
        "tokens_per_verify_row": (accepted + rows) / rows if rows else None,
    }


def per_request(trace: Trace, upto: int | None = None) -> dict[str, dict[str, float]]:
    """TTFT, TPOT, queue time and latency of each request, in steps and seconds, as far as known by `upto`.

    A request admitted in the step it arrives has TTFT 1 step. TPOT counts the tokens after the
    first, an EOS included (producing it took a step); it is absent for one-token replies.
    """
    starts = step_start_times(trace)
    last = len(trace.steps) - 1 if upto is None else upto
    out: dict[str, dict[str, float]] = {}
    for r in trace.requests:
        if r.arrival_step > last or r.arrival_step >= len(starts):
            continue
        arrived, m = starts[r.arrival_step] if r.arrival_s is None else r.arrival_s, {}
        if r.first_token_step is not None and r.first_token_step <= last:
            m["ttft_steps"], m["ttft_s"] = r.first_token_step - r.arrival_step + 1, r.first_token_s - arrived
            m["queue_steps"], m["queue_s"] = r.admit_step - r.arrival_step, starts[r.admit_step] - arrived
        if r.finish_step is not None and r.finish_step <= last and r.finish_reason in ("eos", "length"):
            m["latency_steps"], m["latency_s"] = r.finish_step - r.arrival_step + 1, r.finish_s - arrived
            produced = len(r.output_ids) + (r.finish_reason == "eos")
            if produced > 1:
                m["tpot_steps"] = (r.finish_step - r.first_token_step) / (produced - 1)
                m["tpot_s"] = (r.finish_s - r.first_token_s) / (produced - 1)
        out[r.id] = m
    return out


def inter_token_gaps(trace: Trace, upto: int | None = None) -> list[float]:
    """Seconds between consecutive tokens of the same request, over every request: the stutter a user sees.

    TPOT is one average per request; one long prompt prefilled in a running user's step is a single
    long gap, which this list keeps (its p99 is what a token budget is for)."""
    last_at: dict[str, float] = {}
    gaps = []
    for s in trace.steps[: None if upto is None else upto + 1]:
        for _, rid, _, _, made in s.seats:
            if made:
                if rid in last_at:
                    gaps.append(s.time_s - last_at[rid])
                last_at[rid] = s.time_s
    return gaps


def request_latencies(trace: Trace, upto: int | None = None) -> dict[str, list[float]]:
    """Each latency figure as a list over requests (those it is known for), e.g. for percentiles."""
    names = [f"{n}_{unit}" for n in ("ttft", "tpot", "queue", "latency") for unit in ("steps", "s")]
    rows = per_request(trace, upto).values()
    return {name: [m[name] for m in rows if name in m] for name in names}


def judged(trace: Trace, upto: int | None = None) -> dict[str, dict[str, bool]]:
    """Request id -> {target: met} for every request that arrived (an empty dict: it has no target)."""
    figures, last = per_request(trace, upto), len(trace.steps) - 1 if upto is None else upto
    out = {}
    for r in trace.requests:
        if r.id in figures:
            finished = r.finish_reason in ("eos", "length") and r.finish_step is not None and r.finish_step <= last
            out[r.id] = judge(Service.from_dict(r.service), figures[r.id], finished)
    return out


def met_all(r, verdicts: dict[str, bool], last: int) -> bool:
    finished = r.finish_reason in ("eos", "length") and r.finish_step is not None and r.finish_step <= last
    return finished and all(verdicts.values())


def goodput_figures(trace: Trace, upto: int | None = None) -> dict[str, float | int | None]:
    """The run's goodput and the share that met their targets, overall and per class (keys `{class}_...`), and
    the longest wait for a seat."""
    steps = trace.steps[: None if upto is None else upto + 1]
    last = len(trace.steps) - 1 if upto is None else upto
    duration = steps[-1].time_s if steps else 0.0
    verdicts, figures = judged(trace, upto), per_request(trace, upto)
    by_class: dict[str, list] = {}
    for r in trace.requests:
        if r.id in verdicts:
            by_class.setdefault(r.service.get("cls", "default"), []).append(r)
    out: dict[str, float | int | None] = {}
    for name, group in [("", [r for rs in by_class.values() for r in rs])] + sorted(by_class.items()):
        prefix = f"{name}_" if name else ""
        met = sum(met_all(r, verdicts[r.id], last) for r in group)
        out[f"{prefix}requests_judged"] = len(group)
        out[f"{prefix}targets_met"] = met
        out[f"{prefix}targets_met_share"] = met / len(group) if group else 0.0
        out[f"{prefix}goodput_per_s"] = met / duration if duration else 0.0
        if name:
            ttfts = [figures[r.id]["ttft_s"] for r in group if "ttft_s" in figures[r.id]]
            out[f"{prefix}ttft_p99_s"] = percentiles(ttfts, (99,))["p99"]
    queued = [(m["queue_s"], m["queue_steps"]) for m in figures.values() if "queue_s" in m]
    out["longest_wait_s"] = max((q[0] for q in queued), default=None)
    out["longest_wait_steps"] = max((q[1] for q in queued), default=None)
    return out


def summarize(trace: Trace, upto: int | None = None) -> dict:
    """All the headline figures of a run (or of its first `upto` + 1 steps)."""
    steps = trace.steps[: None if upto is None else upto + 1]
    tokens, wall = sum(s.tokens for s in steps), sum(s.wall_s for s in steps)
    lat = request_latencies(trace, upto)
    rejected = sum(1 for r in trace.requests if (r.finish_reason or "").startswith("rejected"))
    summary = {
        "requests": len(trace.requests),
        "finished": sum(1 for r in trace.requests if r.finish_reason in ("eos", "length")),
        "rejected": rejected,
        "aborted": sum(1 for r in trace.requests if r.finish_reason == "aborted"),
        "output_tokens": tokens,
        "steps": len(steps),
        "wall_s": wall,
        "tokens_per_step": tokens / len(steps) if steps else 0.0,
        "tokens_per_s": tokens / wall if wall else 0.0,
        "slot_utilization": slot_utilization(trace, upto),
        "kv_waste": kv_waste(trace, upto),
        "preemptions": sum(len(s.preempted) for s in steps),
        "queue_length": steps[-1].num_waiting if steps else 0,
        "last_finish_step": max((r.finish_step for r in trace.requests if r.finish_step is not None), default=None),
    }
    summary |= prefix_cache_figures(trace, upto) | draft_figures(trace, upto) | goodput_figures(trace, upto)
    summary |= {f"itl_{k}_s": v for k, v in percentiles(inter_token_gaps(trace, upto)).items()}
    for name, values in lat.items():  # e.g. ttft_steps -> ttft_p50_steps, ttft_p90_steps, ...
        metric, unit = name.rsplit("_", 1)
        summary |= {f"{metric}_{k}_{unit}": v for k, v in percentiles(values).items()}
    return summary
