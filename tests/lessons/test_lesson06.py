"""Lesson 06: latency from a trace, and a scheduling decision. Run: pytest -m lesson06

Part 1: your ttft_tpot must agree with minillm.runs.metrics.per_request on a real trace: the shipped model
serving a small crowd on a KV pool so small that requests are preempted (so TPOT is not always 1),
with long replies, replies that end on EOS or on their length limit, a one-token reply plus EOS, a
rejected request and one still running when the trace ends.

Part 2: your MyFairScheduler serves the crowds of lessons/fairness.py: its TTFT p90 must be at least 15%
lower than first come, first served's, and nobody may wait longer than the longest wait under FCFS.

WRONG_METRICS and WRONG_POLICIES (below) list the mistakes a room makes, each caught (an aborted request
kept included); RIGHT_METRICS and RIGHT_POLICIES, answers written differently that must pass.
"""

from __future__ import annotations

import functools
import math
import numbers
from fractions import Fraction

import numpy as np
import pytest

from lessons import fairness
from minillm.config import EngineConfig
from minillm.engine.engine import Engine
from minillm.engine.request import Request
from minillm.engine.scheduler import ContinuousScheduler, KVSpace, Plan
from minillm.engine.trace import Trace
from minillm.model.tokenizer import encode_prompt
from minillm.runs.metrics import per_request
from tests.lessons.harness import (
    CHECKS,
    assert_writes_its_own_policy,
    implementations,
    shipped_model,
    stub,
    student_module,
)

lesson = pytest.mark.lesson06  # your code's checks: pytest -m lesson06


def reference_ttft_tpot(trace: Trace) -> dict[str, dict[str, float | None]]:
    finished = {r.id for r in trace.requests if r.finish_reason in ("eos", "length")}
    return {
        rid: {"ttft_steps": m["ttft_steps"], "tpot_steps": m.get("tpot_steps")}
        for rid, m in per_request(trace).items()
        if rid in finished
    }


class PatientShortestFirst:
    """A reference answer to part 2: shortest reply first, but whoever has waited PATIENCE steps goes first."""

    name, holds_finished_seats, PATIENCE = "patient-shortest-first", False, 40

    def __init__(self):
        self.step = 0

    def schedule(self, waiting: list[Request], seats: list[Request | None], kv: KVSpace) -> Plan:
        tired = [r for r in waiting if self.step - r.arrival_step >= self.PATIENCE]  # oldest first
        rest = sorted((r for r in waiting if r not in tired), key=lambda r: r.max_new_tokens)
        self.step += 1
        return Plan(admit=(tired + rest)[: seats.count(None)])


@pytest.fixture(params=implementations(lesson))
def ttft_tpot(request):
    if request.param == "reference":
        return reference_ttft_tpot
    return student_module("lesson06_tradeoffs").ttft_tpot


@pytest.fixture(params=implementations(lesson))
def fair_scheduler(request):
    if request.param == "reference":
        return PatientShortestFirst
    module = student_module("lesson06_tradeoffs")
    assert_writes_its_own_policy(module, "MyFairScheduler")
    return module.MyFairScheduler


# --- part 1: TTFT and TPOT from a trace ------------------------------------------------------------
@functools.cache
def real_trace() -> Trace:
    """Four seats, a pool of 7 blocks of 16 tokens, 50 steps: replies that cannot all grow at once (one is
    preempted, so its TPOT is not 1), a one-token reply plus EOS, one cut by its length limit, one reply of
    exactly one token (TPOT undefined), a rejected request, one aborted mid-reply (its client hung up: it has a
    first token and a finish step, but it did not finish) and one still running when the trace ends."""
    requests = [
        Request("count-1", encode_prompt("count down from 1"), 20),  # "1" then EOS: two tokens produced
        Request("long-a", encode_prompt("count down from 15"), 60),  # 35 tokens + EOS
        Request("long-b", encode_prompt("count down from 12"), 60, arrival_step=1),
        Request("long-c", encode_prompt("count down from 13"), 60, arrival_step=1),  # preempted
        Request("one-token", encode_prompt("spell 7"), 1, arrival_step=2, ignore_eos=True),  # TPOT undefined
        Request("cut-short", encode_prompt("count down from 40"), 6, arrival_step=2),  # ends on length
        Request("spell", encode_prompt("spell 4096"), 40, arrival_step=4),
        Request("rejected", encode_prompt("spell 42"), 0),  # max_new_tokens 0: rejected, never finishes
        Request("unfinished", encode_prompt("count down from 40"), 60, arrival_step=8),  # running at the end
        Request("hung-up", encode_prompt("count down from 20"), 60, arrival_step=6),  # aborted mid-reply
    ]
    cfg = EngineConfig(slots=4, kv="paged", num_blocks=7, block_size=16)
    engine = Engine(shipped_model(), ContinuousScheduler(), cfg)
    for r in requests:
        engine.submit(r)
    hung_up = requests[-1]
    while engine.has_work() and engine.step_no < 50:
        if len(hung_up.output_ids) == 3:  # its client hangs up after three tokens
            engine.abort(hung_up.id)
        engine.step()
    return engine.trace()


def describe(trace: Trace, rid: str) -> str:
    r = trace.request(rid)
    return (
        f"{rid} (arrived at step {r.arrival_step}, first token at step {r.first_token_step}, finished at step "
        f"{r.finish_step} on {r.finish_reason}, {len(r.output_ids)} output tokens, preempted {r.preemptions} times)"
    )


def check_trace(ttft_tpot) -> None:
    trace = real_trace()
    expected, got = reference_ttft_tpot(trace), ttft_tpot(trace)
    assert isinstance(got, dict), f"return a dict keyed by request id, got {type(got).__name__}"
    extra, missing = sorted(set(got) - set(expected)), sorted(set(expected) - set(got))
    reasons = {rid: trace.request(rid).finish_reason for rid in extra}
    assert not extra, (
        f"{extra} did not finish (their finish_reason: {reasons}; an aborted request has a first token and a "
        "finish step, but no complete reply): keep only finish_reason 'eos' or 'length'"
    )
    assert not missing, f"{missing} finished, but your result has no entry for them"
    for rid, want in expected.items():
        for key, value in want.items():
            mine = got[rid].get(key, "missing")
            ok = (mine is None) if value is None else isinstance(mine, numbers.Real) and math.isclose(mine, value)
            assert ok, f"{describe(trace, rid)}: expected {key} {value}, got {mine}"


def test_ttft_and_tpot_equal_the_reference_on_a_real_trace(ttft_tpot):
    check_trace(ttft_tpot)


# --- part 2: a policy that beats FCFS on TTFT p90 without starving anyone ----------------------------
@functools.cache
def fcfs_ttfts() -> dict[str, int]:
    return fairness.ttfts(ContinuousScheduler)


def check_policy(make_scheduler) -> None:
    verdict = fairness.judge(make_scheduler, fcfs_ttfts())
    assert verdict.faster and verdict.fair, (
        f"on the crowds of lessons/fairness.py: {verdict.describe()}"
        + ("" if verdict.faster else "; to cut the p90, let short requests board before long ones")
        + ("" if verdict.fair else "; to stop starving, make sure a request that has waited long enough boards")
    )


def test_your_policy_beats_fcfs_on_ttft_p90_without_starving_anyone(fair_scheduler):
    check_policy(fair_scheduler)


# --- the checks catch plausible mistakes --------------------------------------------------------
def make_metrics(
    plus_one=True, divide_by_n=False, count_eos=True, only_finished=True, one_token=None, start="arrival", span="end",
    keep="finish_reason", number=float,
):  # fmt: skip
    def ttft_tpot(trace):
        out = {}
        for r in trace.requests:
            kept = {
                "finish_reason": r.finish_reason in ("eos", "length"),
                "finish_step": r.finish_step is not None,  # an aborted request has one too (wrong)
                "first_token": r.first_token_step is not None,  # aborted and unfinished ones too (wrong)
            }[keep]
            if only_finished and not kept:
                continue
            begin = r.arrival_step if start == "arrival" else r.admit_step
            ttft = None if r.first_token_step is None else r.first_token_step - begin + plus_one
            n = len(r.output_ids) + (count_eos and r.finish_reason == "eos")
            tpot = one_token
            if n > 1 and r.finish_step is not None:
                steps = r.finish_step - r.first_token_step + (span == "inclusive")
                tokens = n if divide_by_n else n - 1
                tpot = steps // tokens if span == "floor" else number(steps) / tokens
            out[r.id] = {"ttft_steps": ttft, "tpot_steps": tpot}
        return out

    return ttft_tpot


WRONG_METRICS = {
    "ttft-without-plus-one": dict(plus_one=False),
    "ttft-from-admission": dict(start="admit"),
    "tpot-divides-by-n": dict(divide_by_n=True),
    "tpot-forgets-the-eos": dict(count_eos=False),
    "tpot-floor-division": dict(span="floor"),
    "tpot-over-an-inclusive-span": dict(span="inclusive"),
    "includes-unfinished": dict(only_finished=False),
    "tpot-zero-for-one-token": dict(one_token=0.0),
    "keeps-every-request-with-a-finish-step": dict(keep="finish_step"),
    "keeps-every-request-with-a-first-token": dict(keep="first_token"),
}
RIGHT_METRICS = {  # right, written differently: the checks must pass them
    "floats": dict(),
    "fractions": dict(number=Fraction),
    "numpy-numbers": dict(number=np.float64),
}


class Priority:
    """An admission order, with switches for the mistakes below."""

    name, holds_finished_seats = "priority-variant", False

    def __init__(self, key=None, patience=None, seats_for_old=0):
        self.key, self.patience, self.seats_for_old, self.step = key, patience, seats_for_old, 0

    def schedule(self, waiting, seats, kv):
        tired = [r for r in waiting if self.patience is not None and self.step - r.arrival_step >= self.patience]
        rest = [r for r in waiting if r not in tired]
        order = tired + (sorted(rest, key=self.key) if self.key else rest)
        self.step += 1
        return Plan(admit=order[: seats.count(None)])


class Aging:
    """Shortest reply first, each step of waiting worth `weight` tokens of reply (right at 2: written differently)."""

    name, holds_finished_seats = "aging", False

    def __init__(self, weight: float):
        self.weight, self.step = weight, 0

    def schedule(self, waiting, seats, kv):
        order = sorted(waiting, key=lambda r: r.max_new_tokens - self.weight * (self.step - r.arrival_step))
        self.step += 1
        return Plan(admit=order[: seats.count(None)])


RIGHT_POLICIES = {"patient-shortest-first": PatientShortestFirst, "aging-by-two-per-step": lambda: Aging(2)}

WRONG_POLICIES = {
    "first-come-first-served": lambda: Priority(),
    "shortest-first-starves-the-long": lambda: Priority(key=lambda r: r.max_new_tokens),
    "patience-too-short": lambda: Priority(key=lambda r: r.max_new_tokens, patience=20),
    "patience-too-long": lambda: Priority(key=lambda r: r.max_new_tokens, patience=100),
    "shortest-prompt-first": lambda: Priority(key=lambda r: len(r.prompt_ids)),
    "newest-first": lambda: Priority(key=lambda r: -r.arrival_step),
    "longest-first": lambda: Priority(key=lambda r: -r.max_new_tokens),
    "ages-too-slowly": lambda: Aging(1),
}


@CHECKS
@pytest.mark.parametrize("right", RIGHT_METRICS.values(), ids=RIGHT_METRICS.keys())
def test_a_correct_version_passes(right):
    check_trace(make_metrics(**right))


@CHECKS
def test_the_trace_covers_every_case():
    trace = real_trace()
    metrics = reference_ttft_tpot(trace)
    reasons = [r.finish_reason for r in trace.requests]
    assert "eos" in reasons and "length" in reasons and None in reasons, "an end on EOS, on length, and no end"
    assert any(r.startswith("rejected") for r in reasons if r)
    assert any(r.preemptions and r.finish_reason == "eos" for r in trace.requests), "a preempted reply"
    assert any(m["tpot_steps"] is None for m in metrics.values()), "a one-token reply: TPOT undefined"
    assert any(m["tpot_steps"] and m["tpot_steps"] % 1 for m in metrics.values()), "a TPOT that is not whole"
    hung_up = trace.request("hung-up")
    assert hung_up.finish_reason == "aborted" and hung_up.first_token_step is not None and hung_up.output_ids
    one_plus_eos = trace.request("count-1")
    assert one_plus_eos.finish_reason == "eos" and len(one_plus_eos.output_ids) == 1


@CHECKS
@pytest.mark.parametrize("mistake", WRONG_METRICS.values(), ids=WRONG_METRICS.keys())
def test_the_checks_catch_wrong_metrics(mistake):
    with pytest.raises(AssertionError):
        check_trace(make_metrics(**mistake))


@CHECKS
@pytest.mark.parametrize("policy", RIGHT_POLICIES.values(), ids=RIGHT_POLICIES.keys())
def test_a_correct_policy_passes(policy):
    check_policy(policy)


@CHECKS
@pytest.mark.parametrize("policy", WRONG_POLICIES.values(), ids=WRONG_POLICIES.keys())
def test_the_checks_catch_a_policy_that_is_slow_or_unfair(policy):
    with pytest.raises(AssertionError):
        check_policy(policy)


@CHECKS
def test_the_stubs_are_rejected():
    with pytest.raises(NotImplementedError):
        check_trace(stub)

    class Stub:
        name, holds_finished_seats = "stub", False
        schedule = stub

    with pytest.raises(NotImplementedError):
        check_policy(Stub)
