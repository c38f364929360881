"""Lesson 06: latency metrics from a trace. Run: pytest -m lesson06

Your ttft_tpot must agree with minillm.metrics.per_request on real traces: the shipped model
serving a small crowd (replies that end on EOS, on the length limit, one-token replies, a
rejected request and one still running when the trace ends), under both policies.
"""

from __future__ import annotations

import functools
import math

import pytest

from minillm.config import EngineConfig
from minillm.engine import Engine
from minillm.metrics import per_request
from minillm.request import Request
from minillm.scheduler import ContinuousScheduler, StaticScheduler
from minillm.tokenizer import encode_prompt
from minillm.trace import Trace
from tests.lessons.harness import IMPLS, shipped_model, stub, student_module

pytestmark = pytest.mark.lesson06


def reference(trace: Trace) -> dict[str, dict[str, float | None]]:
    finished = {r.id for r in trace.requests if r.finish_reason in ("eos", "length")}
    return {
        rid: {"ttft_steps": m["ttft_steps"], "tpot_steps": m.get("tpot_steps")}
        for rid, m in per_request(trace).items()
        if rid in finished
    }


@pytest.fixture(params=IMPLS)
def ttft_tpot(request):
    if request.param == "reference":
        return reference
    return student_module("lesson06_metrics").ttft_tpot


# --- the checks --------------------------------------------------------------------------------
@functools.cache
def real_trace(policy: str) -> Trace:
    """Two seats, seven users, 40 steps: some queue, some end on EOS, some on length, one never ends."""
    requests = [
        Request("count-3", encode_prompt("count down from 3"), 20),  # ends on EOS
        Request("count-2", encode_prompt("count down from 2"), 20),  # ends on EOS
        Request("letters", encode_prompt("letters a to c"), 20),  # waits for a seat
        Request("one-token", encode_prompt("spell 7"), 1, arrival_step=1, ignore_eos=True),  # TPOT undefined
        Request("cut-short", encode_prompt("count down from 40"), 6, arrival_step=2),  # ends on length
        Request("long", encode_prompt("count down from 60"), 200, arrival_step=3),  # still running at the end
        Request("rejected", encode_prompt("spell 42"), 0),  # max_new_tokens 0: rejected, never finishes
    ]
    scheduler = {"static": StaticScheduler, "continuous": ContinuousScheduler}[policy]()
    engine = Engine(shipped_model(), scheduler, EngineConfig(slots=2, kv="paged"))
    for r in requests:
        engine.submit(r)
    return engine.run(max_steps=40)


def describe(trace: Trace, rid: str) -> str:
    r = trace.request(rid)
    return (
        f"{rid} (arrived at step {r.arrival_step}, first token at step {r.first_token_step}, finished at step "
        f"{r.finish_step} on {r.finish_reason}, {len(r.output_ids)} output tokens)"
    )


def check_trace(ttft_tpot, policy: str) -> None:
    trace = real_trace(policy)
    expected, got = reference(trace), ttft_tpot(trace)
    assert isinstance(got, dict), f"return a dict keyed by request id, got {type(got).__name__}"
    extra, missing = sorted(set(got) - set(expected)), sorted(set(expected) - set(got))
    assert not extra, f"{policy} trace: {extra} did not finish (finish_reason not eos or length): leave them out"
    assert not missing, f"{policy} trace: {missing} finished, but your result has no entry for them"
    for rid, want in expected.items():
        for key, value in want.items():
            mine = got[rid].get(key, "missing")
            ok = (mine is None) if value is None else isinstance(mine, (int, float)) and math.isclose(mine, value)
            assert ok, f"{policy} trace, {describe(trace, rid)}: expected {key} {value}, got {mine}"


def check_all(ttft_tpot) -> None:
    check_trace(ttft_tpot, "continuous")
    check_trace(ttft_tpot, "static")


@pytest.mark.parametrize("policy", ["continuous", "static"])
def test_ttft_and_tpot_equal_the_reference_on_a_real_trace(ttft_tpot, policy):
    check_trace(ttft_tpot, policy)


@pytest.mark.parametrize("policy", ["continuous", "static"])
def test_the_trace_covers_every_case(policy):
    trace = real_trace(policy)
    metrics = reference(trace)
    reasons = [r.finish_reason for r in trace.requests]
    assert "eos" in reasons and "length" in reasons and None in reasons, "an end on EOS, on length, and no end"
    assert any(r.startswith("rejected") for r in reasons if r)
    assert any(m["tpot_steps"] is None for m in metrics.values()), "a one-token reply: TPOT undefined"
    assert any(m["ttft_steps"] > 1 for m in metrics.values()), "somebody should have queued for a seat"


# --- the checks catch plausible mistakes --------------------------------------------------------
def make_metrics(plus_one=True, divide_by_n=False, count_eos=True, only_finished=True, one_token=None, start="arrival"):
    def ttft_tpot(trace):
        out = {}
        for r in trace.requests:
            if only_finished and r.finish_reason not in ("eos", "length"):
                continue
            begin = r.arrival_step if start == "arrival" else r.admit_step
            ttft = None if r.first_token_step is None else r.first_token_step - begin + plus_one
            n = len(r.output_ids) + (count_eos and r.finish_reason == "eos")
            tpot = one_token
            if n > 1 and r.finish_step is not None:
                tpot = (r.finish_step - r.first_token_step) / (n if divide_by_n else n - 1)
            out[r.id] = {"ttft_steps": ttft, "tpot_steps": tpot}
        return out

    return ttft_tpot


WRONG = {
    "ttft-without-plus-one": dict(plus_one=False),
    "ttft-from-admission": dict(start="admit"),
    "tpot-divides-by-n": dict(divide_by_n=True),
    "tpot-forgets-the-eos": dict(count_eos=False),
    "includes-unfinished": dict(only_finished=False),
    "tpot-zero-for-one-token": dict(one_token=0.0),
}


def test_a_correct_version_passes():
    check_all(make_metrics())


@pytest.mark.parametrize("mistake", WRONG.values(), ids=WRONG.keys())
def test_the_checks_catch_wrong_metrics(mistake):
    with pytest.raises(AssertionError):
        check_all(make_metrics(**mistake))


def test_the_stub_is_rejected():
    with pytest.raises(NotImplementedError):
        check_all(stub)
