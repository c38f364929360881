"""Lesson 06: latency from a trace, and a scheduling decision. Run: pytest -m lesson06

Part 1: your ttft_tpot must agree with minillm.runs.metrics.per_request on a real trace: the shipped model
serving a small crowd on a KV pool so small that requests are preempted (so TPOT is not always 1),
with long replies, replies that end on EOS or on their length limit, a one-token reply plus EOS, a
rejected request and one still running when the trace ends; then an empty trace, and a one-request trace whose
reply is only an EOS. Your function gets a copy of each trace and must leave it as it was.

Part 2: your MyFairScheduler serves the crowds of lessons/fairness.py: its TTFT p90 must be at least 15%
lower than first come, first served's, and nobody may wait longer than the longest wait under FCFS. A fresh
scheduler must decide alike on the same crowd (no state carried from one run to the next).

WRONG_METRICS and WRONG_POLICIES (below) list the mistakes a room makes, each caught (an aborted request
kept included); RIGHT_METRICS and RIGHT_POLICIES, answers written differently that must pass.

Then part 1's differential check (tests/lessons/drawn/lesson06.py): your ttft_tpot against the reference on the
traces of 60 drawn runs (seeded: the same every run; MINILLM_CHECK_EXAMPLES=N draws N), each compared as the real
trace is, the smallest run that differs shown first. Its strategies: 0 to 5 requests on 1 to 3 seats, served by
the real engine with a countdown stand-in model: replies that end on EOS at once, after one token or more, or on
their caps of 1 to 8 (a cap of 0: rejected); arrivals at steps 0 to 4; prompts sharing a start; and each engine
mode drawn on or off: chunked prefill (a budget of 1 to 6 tokens), a tight paged pool (preemption), prefix caching,
speculation (1 to 3 guesses a step by prompt lookup: several tokens in one step, TPOT below 1), an abort at a drawn
step, a run cut short. DRAWN_ONLY names the wrong answers only the drawn traces catch.

Part 2 cannot be compared with a reference (many policies are right), so its drawn check (same file) is of what
every valid policy does, on 60 drawn crowds of the kind lessons/fairness.py builds, your scheduler fresh for each,
served by the real engine (the countdown stand-in, the KV books checked every step). Its strategies: 1 to 12 users
on 1 to 4 seats; replies short (1 to 12 tokens, 1 on purpose) or long (13 to 24, one user in four), exactly
max_new_tokens long (EOS ignored) or, one in four, ending on EOS sooner (at once included); prompts of 1 to 12 tokens
(1 and block boundaries on purpose); everybody arriving in one step (0 to 4), or spread out 0 to 6 steps apart
(equal arrivals too); plentiful memory as the exercise promises, from exactly enough to roomy: the contiguous layout,
or a paged pool of blocks of 1, 2 or 4 tokens holding what the largest requests that fit the seats hold at their
longest, plus 0 to 8 blocks. Every crowd: the engine carries out every plan; no seat stays empty while somebody
waits; every request finishes within three times the crowd's tokens after its last arrival, its reply token for
token the plain one-user loop's; every KV block is free at the end. DRAWN_ONLY_POLICIES names the wrong policies
that pass the judgement on the crowds and only the drawn crowds catch.
"""

from __future__ import annotations

import copy
import functools
import itertools
import math
import numbers
from fractions import Fraction

import numpy as np
import pytest

from lessons import fairness
from minillm.config import EngineConfig
from minillm.engine.request import Request
from minillm.engine.scheduler import ContinuousScheduler, KVSpace, Plan
from minillm.layers import LayeredEngine
from minillm.layers.trace import Trace
from minillm.model.tokenizer import EOS, encode_prompt
from minillm.runs.metrics import per_request
from tests.lessons.differential import against_reference
from tests.lessons.drawn.lesson06 import check_drawn, check_drawn_policy, crowds
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
    engine = LayeredEngine(shipped_model(), ContinuousScheduler(), cfg)
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


def served_alone(*requests: Request) -> Trace:
    """A small run of its own: the shipped model, two seats."""
    engine = LayeredEngine(shipped_model(), ContinuousScheduler(), EngineConfig(slots=2))
    for r in requests:
        engine.submit(r)
    return engine.run(max_steps=50)


@functools.cache
def edge_traces() -> dict[str, Trace]:
    """The situations the real trace leaves out, each named as a failure's first line names it."""
    return {
        "an empty trace (nobody was served)": served_alone(),
        # "please" is not a task the model knows: its first reply token is EOS
        "a one-request trace whose reply ends on its first token (EOS: an empty reply)": served_alone(
            Request("please", encode_prompt("please"), 20, arrival_step=2)
        ),
    }


def first_change(given: Trace, original: Trace) -> str:
    """Where `given` (the copy handed to your code) no longer equals the trace it was copied from."""
    if len(given.requests) != len(original.requests):
        return f"trace.requests had {len(original.requests)} records, now {len(given.requests)}"
    for mine, theirs in zip(given.requests, original.requests):
        for name, value in vars(theirs).items():
            if getattr(mine, name, "missing") != value:
                return f"request {theirs.id}'s {name} was {value!r}, now {getattr(mine, name, 'missing')!r}"
    return "trace.steps or trace.config changed"


def check_trace(ttft_tpot) -> None:
    check_one_trace(ttft_tpot, real_trace(), "")
    for situation, trace in edge_traces().items():
        check_one_trace(ttft_tpot, trace, f"{situation}: ")


def check_one_trace(ttft_tpot, trace: Trace, situation: str) -> None:
    given = copy.deepcopy(trace)  # yours gets a copy: the original stays as it was for the next check
    expected, got = reference_ttft_tpot(trace), ttft_tpot(given)
    assert given == trace, (
        f"{situation}your ttft_tpot changed the trace it was given ({first_change(given, trace)}): the app, the "
        "metrics and the next reader use that same trace; compute from it, never write into it"
    )
    assert isinstance(got, dict), f"{situation}return a dict keyed by request id, got {type(got).__name__}"
    extra, missing = sorted(set(got) - set(expected)), sorted(set(expected) - set(got))
    strangers = [rid for rid in extra if rid not in {r.id for r in trace.requests}]
    assert not strangers, (
        f"{situation}expected {expected}, got entries for {strangers}, who are not in this trace: left over "
        "from an earlier call? Build a new dict on every call (no module-level results)"
    )
    reasons = {rid: trace.request(rid).finish_reason for rid in extra}
    assert not extra, (
        f"{situation}{extra} did not finish (their finish_reason: {reasons}; an aborted request has a first token "
        "and a finish step, but no complete reply): keep only finish_reason 'eos' or 'length'"
    )
    empty = [rid for rid in missing if not trace.request(rid).output_ids]
    assert not empty, (
        f"{situation}{empty} finished on EOS with no reply tokens, but your result has no entry for them: they "
        "are finished requests too (TTFT counts to the step that produced the EOS; TPOT is None)"
    )
    assert not missing, f"{situation}{missing} finished, but your result has no entry for them"
    for rid, want in expected.items():
        for key, value in want.items():
            mine = got[rid].get(key, "missing")
            ok = (mine is None) if value is None else isinstance(mine, numbers.Real) and math.isclose(mine, value)
            assert ok, f"{situation}{describe(trace, rid)}: expected {key} {value}, got {mine}"


def check_drawn_traces(ttft_tpot) -> None:
    check_drawn(ttft_tpot, check_one_trace)


def test_ttft_and_tpot_equal_the_reference_on_a_real_trace(ttft_tpot):
    check_trace(ttft_tpot)


def test_ttft_and_tpot_equal_the_reference_on_drawn_traces(ttft_tpot):
    check_drawn_traces(ttft_tpot)


# --- part 2: a policy that beats FCFS on TTFT p90 without starving anyone ----------------------------
@functools.cache
def fcfs_ttfts() -> dict[str, int]:
    return fairness.ttfts(ContinuousScheduler)


def first_token_steps(make_scheduler, crowd: list[Request]) -> dict[str, int]:
    cfg = EngineConfig(slots=fairness.SEATS, kv="contiguous", max_len=256)  # as lessons/fairness.py serves them
    engine = LayeredEngine(fairness.stand_in_model(), make_scheduler(), cfg)
    for r in crowd:
        engine.submit(r)
    return {r.id: r.first_token_step for r in engine.run().requests}


def check_policy(make_scheduler) -> None:
    crowd = functools.partial(fairness.mixed_crowd, 7, users=24, rate=1.0)  # small, and a long queue builds
    first, again = first_token_steps(make_scheduler, crowd()), first_token_steps(make_scheduler, crowd())
    moved = [rid for rid in first if first[rid] != again[rid]]
    assert not moved, (
        f"the same crowd served twice, each time by a fresh scheduler: {moved[0]}'s first token came at step "
        f"{first[moved[0]]}, then at step {again[moved[0]]}. Your scheduler keeps state outside the instance (a class "
        "attribute or a module-level variable) that carries from one run to the next, or draws at random: keep its "
        "state in self, set in __init__"
    )
    verdict = fairness.judge(make_scheduler, fcfs_ttfts())
    assert verdict.faster and verdict.fair, (
        f"on the crowds of lessons/fairness.py: {verdict.describe()}"
        + ("" if verdict.faster else "; to cut the p90, let short requests board before long ones")
        + ("" if verdict.fair else "; to stop starving, make sure a request that has waited long enough boards")
    )


def check_drawn_crowds(make_scheduler) -> None:
    """What every valid policy does, on drawn crowds (tests/lessons/drawn/lesson06.py): plans the engine carries out,
    no seat empty while somebody waits, everybody served in full, every KV block free at the end."""
    check_drawn_policy(make_scheduler)


def test_your_policy_beats_fcfs_on_ttft_p90_without_starving_anyone(fair_scheduler):
    check_policy(fair_scheduler)


def test_your_policy_serves_every_drawn_crowd(fair_scheduler):
    check_drawn_crowds(fair_scheduler)


# --- the checks catch plausible mistakes --------------------------------------------------------
RESULTS: dict = {}  # the module-level dict of the mistake "keeps its results between calls"


def make_metrics(
    plus_one=True, divide_by_n=False, count_eos=True, only_finished=True, one_token=None, start="arrival", span="end",
    keep="finish_reason", number=float, skip_empty=False, append_eos=False, module_dict=False,
):  # fmt: skip
    def ttft_tpot(trace):
        out = RESULTS if module_dict else {}  # module_dict: results pile up from one call to the next (wrong)
        for r in trace.requests:
            if append_eos and r.finish_reason == "eos":
                r.output_ids.append(EOS)  # counts the EOS by writing it into the caller's trace (wrong)
            if skip_empty and not r.output_ids:
                continue  # a reply that was only an EOS is finished too (wrong)
            kept = {
                "finish_reason": r.finish_reason in ("eos", "length"),
                "finish_step": r.finish_step is not None,  # an aborted request has one too (wrong)
                "first_token": r.first_token_step is not None,  # aborted and unfinished ones too (wrong)
            }[keep]
            if only_finished and not kept:
                continue
            begin = r.arrival_step if start == "arrival" else r.admit_step
            ttft = None if r.first_token_step is None else r.first_token_step - begin + plus_one
            n = len(r.output_ids) + (count_eos and r.finish_reason == "eos" and not append_eos)
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
    # each caught only by an edge case (right on the real trace): an empty reply, the caller's trace, state
    "skips-a-reply-that-is-only-an-eos": dict(skip_empty=True),
    "counts-the-eos-by-appending-it-to-the-trace": dict(append_eos=True),
    "keeps-its-results-between-calls": dict(module_dict=True),
}
EDGE_METRICS = {  # the mistake, and what the first line of the check that catches it must say
    "skips-a-reply-that-is-only-an-eos": "a one-request trace whose reply ends on its first token",
    "counts-the-eos-by-appending-it-to-the-trace": "your ttft_tpot changed the trace it was given",
    "keeps-its-results-between-calls": "an empty trace (nobody was served): expected {}, got entries",
}


def from_the_steps(trace):
    """Right, written differently: each request's produced tokens read off the steps, not its record."""
    made: dict[str, list[int]] = {}  # request id -> the step of each token it produced (an EOS included)
    for s in trace.steps:
        for _seat, rid, _state, _ran, produced in s.seats:
            made.setdefault(rid, []).extend([s.step] * produced)
    out = {}
    for r in trace.requests:
        if r.finish_reason not in ("eos", "length"):
            continue
        steps = made[r.id]
        out[r.id] = {
            "ttft_steps": steps[0] - r.arrival_step + 1,
            "tpot_steps": (steps[-1] - steps[0]) / (len(steps) - 1) if len(steps) > 1 else None,
        }
    return out


def one_entry_per_step(trace):
    """Wrong, yet right on every hand-built trace: each request's tokens read off the steps, a step that produced
    any counted as one token (true without speculation; with it, a step may produce several)."""
    made: dict[str, list[int]] = {}
    for s in trace.steps:
        for _seat, rid, _state, _ran, produced in s.seats:
            if produced:
                made.setdefault(rid, []).append(s.step)
    out = {}
    for r in trace.requests:
        if r.finish_reason in ("eos", "length"):
            steps = made[r.id]
            tpot = (steps[-1] - steps[0]) / (len(steps) - 1) if len(steps) > 1 else None
            out[r.id] = {"ttft_steps": steps[0] - r.arrival_step + 1, "tpot_steps": tpot}
    return out


DRAWN_ONLY = {"counts-a-step-as-one-token": one_entry_per_step}  # only the drawn traces catch these


def comprehension(trace):
    """Right, written differently: one dict comprehension, the EOS counted as a token on a list copy."""

    def tpot(r):
        tokens = r.output_ids + [EOS] * (r.finish_reason == "eos")
        return (r.finish_step - r.first_token_step) / (len(tokens) - 1) if len(tokens) > 1 else None

    return {
        r.id: {"ttft_steps": r.first_token_step - r.arrival_step + 1, "tpot_steps": tpot(r)}
        for r in trace.requests
        if r.finish_reason in {"eos", "length"}
    }


RIGHT_METRICS = {  # right, written differently: the checks must pass them
    "floats": make_metrics(),
    "fractions": make_metrics(number=Fraction),
    "numpy-numbers": make_metrics(number=np.float64),
    "read-off-the-steps": from_the_steps,
    "one-comprehension": comprehension,
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


class CountsWaits:
    """Shortest reply first, but whoever this scheduler has seen waiting PATIENCE times goes first: its count of
    calls is per request, not a step number (right with shared=False: written differently)."""

    name, holds_finished_seats, PATIENCE = "counts-waits", False, 40
    waited_in_the_class: dict[str, int] = {}

    def __init__(self, shared: bool = False):
        self.waited = self.waited_in_the_class if shared else {}  # shared: carried from one run to the next (wrong)

    def schedule(self, waiting, seats, kv):
        for r in waiting:
            self.waited[r.id] = self.waited.get(r.id, 0) + 1
        tired = [r for r in waiting if self.waited[r.id] > self.PATIENCE]
        rest = sorted((r for r in waiting if r not in tired), key=lambda r: r.max_new_tokens)
        return Plan(admit=(tired + rest)[: seats.count(None)])


RIGHT_POLICIES = {
    "patient-shortest-first": PatientShortestFirst,
    "aging-by-two-per-step": lambda: Aging(2),
    "counts-each-requests-waits": CountsWaits,
}


class Boarding:
    """Wrong in three ways, each judged fast and fair on the crowds: the reference's order (whoever has waited
    PATIENCE steps, then shortest reply first), but `board` changes who of it boards."""

    name, holds_finished_seats, PATIENCE = "boarding-variant", False, 40

    def __init__(self, board: str):
        self.board, self.step = board, 0

    def schedule(self, waiting, seats, kv):
        tired = [r for r in waiting if self.step - r.arrival_step >= self.PATIENCE]
        order = tired + sorted((r for r in waiting if r not in tired), key=lambda r: r.max_new_tokens)
        free, admit = seats.count(None), []
        if self.board == "one-a-step":  # one newcomer a step, however many seats are free
            admit = order[: min(free, 1)]
        elif self.board == "four-seats":  # the free seats counted as four less the busy ones (the crowds' four)
            admit = order[: 4 - sum(s is not None for s in seats)]
        elif self.board == "keep-a-seat":  # a long reply (the crowds' short ones ask 4 to 12 tokens) never takes the
            for r in order:  # last free seat before it is tired: a short one arriving next boards at once
                if len(admit) < free and not (r.max_new_tokens > 12 and r not in tired and len(admit) == free - 1):
                    admit.append(r)
        self.step += 1
        return Plan(admit=admit)


DRAWN_ONLY_POLICIES = {  # each passes the judgement on the crowds; the drawn crowds catch it, first line saying so
    "one-newcomer-a-step": (lambda: Boarding("one-a-step"), "seat stayed empty while"),
    "keeps-a-seat-for-short-replies": (lambda: Boarding("keep-a-seat"), "seat stayed empty while"),
    "assumes-four-seats": (lambda: Boarding("four-seats"), "the engine refused your plan"),
}

WRONG_POLICIES = {
    "first-come-first-served": lambda: Priority(),
    "shortest-first-starves-the-long": lambda: Priority(key=lambda r: r.max_new_tokens),
    "patience-too-short": lambda: Priority(key=lambda r: r.max_new_tokens, patience=20),
    "patience-too-long": lambda: Priority(key=lambda r: r.max_new_tokens, patience=100),
    "shortest-prompt-first": lambda: Priority(key=lambda r: len(r.prompt_ids)),
    "newest-first": lambda: Priority(key=lambda r: -r.arrival_step),
    "longest-first": lambda: Priority(key=lambda r: -r.max_new_tokens),
    "ages-too-slowly": lambda: Aging(1),
    "counts-waits-in-a-class-attribute": lambda: CountsWaits(shared=True),  # caught only by serving a crowd twice
}


@CHECKS
@pytest.mark.parametrize("right", RIGHT_METRICS.values(), ids=RIGHT_METRICS.keys())
def test_a_correct_version_passes(right):
    check_trace(right)
    check_drawn_traces(right)


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
    RESULTS.clear()
    with pytest.raises(AssertionError):
        check_trace(make_metrics(**mistake))
    RESULTS.clear()
    with pytest.raises(AssertionError):  # the drawn traces catch each too
        check_drawn_traces(make_metrics(**mistake))


@CHECKS
@pytest.mark.parametrize("name", DRAWN_ONLY)
def test_the_drawn_traces_catch_what_the_cases_miss(name):
    check_trace(DRAWN_ONLY[name])  # the hand-built traces pass it
    with pytest.raises(AssertionError, match="speculation"):
        check_drawn_traces(DRAWN_ONLY[name])


@CHECKS
@pytest.mark.parametrize("name", EDGE_METRICS)
def test_an_edge_case_catches_its_mistake_and_names_the_situation_first(name):
    RESULTS.clear()
    assert make_metrics(**WRONG_METRICS[name])(copy.deepcopy(real_trace())) == reference_ttft_tpot(real_trace())
    RESULTS.clear()  # (its numbers are right on the real trace: only the edge case catches it)
    with pytest.raises(AssertionError) as caught:
        check_trace(make_metrics(**WRONG_METRICS[name]))
    assert EDGE_METRICS[name] in str(caught.value).splitlines()[0], str(caught.value)


@CHECKS
def test_the_edge_traces_are_what_they_say():
    empty, eos_first = edge_traces().values()
    assert not empty.requests and not empty.steps
    (please,) = eos_first.requests
    assert please.finish_reason == "eos" and please.output_ids == [] and please.first_token_step is not None
    assert reference_ttft_tpot(eos_first) == {"please": {"ttft_steps": 1, "tpot_steps": None}}


@CHECKS
@pytest.mark.parametrize("policy", RIGHT_POLICIES.values(), ids=RIGHT_POLICIES.keys())
def test_a_correct_policy_passes(policy):
    check_policy(policy)
    check_drawn_crowds(policy)


@CHECKS
@pytest.mark.parametrize("name", DRAWN_ONLY_POLICIES)
def test_the_drawn_crowds_catch_a_policy_the_judgement_passes(name):
    policy, says = DRAWN_ONLY_POLICIES[name]
    check_policy(policy)  # the judgement on the crowds passes it (and it decides alike when served twice)
    with pytest.raises(AssertionError) as caught:
        check_drawn_crowds(policy)
    first = str(caught.value).splitlines()[0]
    assert first.startswith("with ") and says in first, str(caught.value)


@CHECKS
def test_the_drawn_crowds_are_what_the_docstring_says():
    drawn = []
    against_reference("the crowds", crowds(), drawn.append, 60)  # the draws the check serves (seeded)
    users = {len(c.shape) for c in drawn}
    shapes = [s for c in drawn for s in c.shape]
    assert {1, 12} <= users and users <= set(range(1, 13)) and {c.slots for c in drawn} == {1, 2, 3, 4}
    assert {c.block_size for c in drawn} == {None, 1, 2, 4}, "the contiguous layout, blocks of 1, 2 and 4 tokens"
    assert any(c.block_size and not c.spare for c in drawn) and any(c.spare > 4 for c in drawn), "exactly, roomy"
    assert any(len(c.shape) > 1 and len({s[4] for s in c.shape}) == 1 for c in drawn), "everybody in one step"
    assert any(len({s[4] for s in c.shape}) not in (1, len(c.shape)) for c in drawn), "equal arrivals, spread out"
    caps = {cap for _, _, _, cap, _ in shapes}
    assert {1, 12, 13} <= caps and max(caps) > 20, "replies of 1 and 12 tokens (short), of 13 and 20 and more (long)"
    assert {1, 12} <= {n for _, n, _, _, _ in shapes}, "prompts of 1 and 12 tokens"
    assert any(says == 0 for _, _, says, _, _ in shapes) and any(0 < says < cap for _, _, says, cap, _ in shapes)
    assert sum(says >= cap for _, _, says, cap, _ in shapes) > len(shapes) / 2, "mostly exact lengths (EOS ignored)"
    for c in (c for c in drawn if c.block_size):  # memory never binds: any seated requests fit at their longest
        longest = [-(-r.max_cached_tokens // c.block_size) for r in c.requests()]
        most = max(sum(seated) for seated in itertools.combinations(longest, min(c.slots, len(longest))))
        assert most <= c.num_blocks and (c.spare or most == c.num_blocks), f"{c.describe()}: {longest}"


@CHECKS
@pytest.mark.parametrize("policy", WRONG_POLICIES.values(), ids=WRONG_POLICIES.keys())
def test_the_checks_catch_a_policy_that_is_slow_or_unfair(policy):
    CountsWaits.waited_in_the_class.clear()
    with pytest.raises(AssertionError):
        check_policy(policy)


@CHECKS
def test_a_policy_that_carries_state_between_runs_is_caught_by_name():
    CountsWaits.waited_in_the_class.clear()
    verdict = fairness.judge(lambda: CountsWaits(shared=True), fcfs_ttfts())
    assert verdict.faster and verdict.fair  # the judgement alone misses it...
    CountsWaits.waited_in_the_class.clear()
    with pytest.raises(AssertionError, match="^the same crowd served twice"):  # ... serving a crowd twice does not
        check_policy(lambda: CountsWaits(shared=True))


@CHECKS
def test_the_stubs_are_rejected():
    with pytest.raises(NotImplementedError):
        check_trace(stub)

    class Stub:
        name, holds_finished_seats = "stub", False
        schedule = stub

    with pytest.raises(NotImplementedError):
        check_policy(Stub)
    with pytest.raises(NotImplementedError):
        check_drawn_crowds(Stub)
