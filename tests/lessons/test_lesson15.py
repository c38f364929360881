"""Lesson 15: earliest deadline first, with aging. Run: pytest -m lesson15

Your rank and last_kept seat four crowds in the real engine (everyone at once; newcomers displacing the seated; a
KV pool too small; arrivals by step, aging, equal due times) on a clock that ticks 1/64 s a step. A referee works out
each step's plan from each request's due time and checks yours: the running one due latest makes way first (ties: the
newest), only as many as the KV cache needs, and for a newcomer only if due later than it; admissions in due order
(ties: the queue's), no seat empty while the next one due fits; every reply the plain loop's, every block free after.
WRONG (below) lists the mistakes a room makes, each caught; CORRECT, versions written differently that must pass.

Then the differential checks (tests/lessons/drawn/lesson15.py), seeded (the same draws every run;
MINILLM_CHECK_EXAMPLES=N draws N per check), the smallest input that differs shown first. Times are whole ticks of
1/64 s; a drawn request is chat (TTFT only), batch (deadline only), both, or has no target (aging_s 1 to 32 ticks),
and arrives at once, spread, so that its due time meets an earlier one's (exactly or a tick either side, before or
after either's first token), or at the moment an earlier one is due (exactly or a tick past: the aging boundary),
arrivals in seconds or by step. On 100 drawn moments (1 to 7 requests: never seated, preempted after or before their
first token at step 0 or later, running with it or mid-prompt, seated in a drawn order; the clock at a due time, a
tick past, or later) your rank must sort the queue and rank running requests after each waiting one as the
reference's does (equal due times: equal ranks), your last_kept order the running as its does. On 25 drawn crowds
(2 to 6 requests, 1 to 4 seats, roomy or tight pools of blocks of 2 or 4 tokens; half squeezed: long replies on 2 or
3 seats in a pool that binds, so newcomers displace and the KV cache preempts; a quarter with a token budget, running
requests mid-prompt) your policy seats each step as the reference does beside it on the same state, the referee above
judging too. DRAWN_ONLY names the wrong versions only the drawn checks catch.
"""

from __future__ import annotations

import ast
import math
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from minillm.card.simulate import VirtualClock
from minillm.config import EngineConfig
from minillm.engine.request import Request
from minillm.engine.runner import ModelRunner
from minillm.engine.scheduler import PlanError
from minillm.layers import LayeredEngine
from minillm.layers.policies import AGING_S, DeadlinePolicy, RankedPolicy
from minillm.layers.service import DEFAULT, Service
from tests.lessons import harness
from tests.lessons.drawn.lesson15 import check_drawn
from tests.lessons.harness import CHECKS, Guarded, Referee, case, implementations, small_model

lesson = pytest.mark.lesson15  # your code's checks: pytest -m lesson15
TICK = 1 / 64  # seconds a step takes on the checks' clock (a power of two: sums of due times stay exact)
CHAT, QUICK = Service("chat", 0, ttft_s=0.25), Service("chat", 0, ttft_s=0.125)
BATCH, REPORT = Service("batch", 1, deadline_s=1.0), Service("report", 1, ttft_s=0.125, deadline_s=0.75)


@pytest.fixture(params=implementations(lesson))
def policy_of(request):
    """(aging_s, token_budget) -> a policy to check: the reference (DeadlinePolicy, its own victim rule) or yours."""
    if request.param == "reference":
        return lambda aging_s, budget=None: DeadlinePolicy(token_budget=budget, victim="latest-due", aging_s=aging_s)
    module = harness.student_module("lesson15_deadline")
    assert_writes_its_own_order(module)
    return lambda aging_s, budget=None: module.MyDeadlinePolicy(token_budget=budget, aging_s=aging_s)


def assert_writes_its_own_order(module) -> None:
    """RankedPolicy, AGING_S and the like may come from minillm.layers.policies; the deadline policy may not."""
    cls = getattr(module, "MyDeadlinePolicy", None)
    assert cls is not None, "lesson15_deadline.py defines no MyDeadlinePolicy"
    assert not issubclass(cls, DeadlinePolicy), "MyDeadlinePolicy subclasses DeadlinePolicy: write the order yourself"
    reference = ("DeadlinePolicy", "due", "POLICIES", "make_policy", "policies", "minillm.layers.policies")
    source = Path(module.__file__).read_text()
    names = [a.name for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Import | ast.ImportFrom) for a in n.names]
    taken = [name for name in names if name in reference]
    assert not taken, f"lesson15_deadline.py imports {', '.join(taken)}: write the order yourself"


# --- the referee ----------------------------------------------------------------------------------------------------
def due_at(service: Service, arrived: float, first_token: bool, aging_s: float) -> float:
    if service.ttft_s is not None and (not first_token or service.deadline_s is None):
        return arrived + service.ttft_s
    return arrived + (service.deadline_s if service.deadline_s is not None else aging_s)


def expected_plan(d, due: dict[str, float]) -> tuple[list[str], list[str], dict[str, str]]:
    """(admitted, preempted, displaced -> for whom) by the rules, from one step's decision (d.running: oldest first)."""
    newest = {rid: i for i, rid in enumerate(d.running)}
    keep, victims, free, shoved = sorted(d.running, key=lambda r: (due[r], newest[r])), [], d.free_blocks, {}
    while keep and sum(d.grow[r] for r in keep) > free:  # the KV cache cannot hold the next tokens
        victims.append(keep.pop())
        free += d.held[victims[-1]]
    free -= sum(d.grow[r] for r in keep)
    seats, admitted = d.free_seats + len(victims), []
    for head in sorted(d.waiting, key=lambda r: due[r]):  # (stable: ties in the queue's order)
        took = []
        while (not seats or d.cost[head] > free) and any(due[r] > due[head] for r in keep):
            took.append(victim := [r for r in keep if due[r] > due[head]][-1])  # due latest, ties the newest
            keep.remove(victim)
            seats, free = seats + 1, free + d.held[victim] + d.grow[victim]
        if not seats or d.cost[head] > free:
            break  # it does not fit even so: it waits, and everyone due after it
        victims, admitted, shoved = victims + took, admitted + [head], shoved | dict.fromkeys(took, head)
        seats, free = seats - 1, free - d.cost[head]
    return admitted, victims, shoved


class DueReferee(Referee):  # the harness's referee, each request's due time worked out before every step (self.due)
    def __init__(self, policy, services: dict[str, Service], clock, aging_s: float):
        super().__init__(Guarded(policy), lambda d: judge(d, self.due))
        self.services, self.clock, self.aging_s, self.seen, self.due = services, clock, aging_s, {}, {}

    def schedule(self, waiting, seats, kv):
        now, seated = self.clock.now(), [r for r in seats if r is not None]
        for r in waiting:
            self.seen.setdefault(r.id, now if r.arrival_s is None else r.arrival_s)
        service = lambda r: self.services.get(r.id, DEFAULT)
        self.due = {r.id: due_at(service(r), self.seen[r.id], r.first_token_step is not None, self.aging_s)
                    for r in [*waiting, *seated]}  # fmt: skip
        return super().schedule(waiting, seats, kv)


def judge(d, due: dict[str, float]) -> None:
    admitted, victims, shoved = expected_plan(d, due)
    if d.admit == admitted and sorted(d.preempt) == sorted(victims):
        return
    show = lambda ids: "[" + ", ".join(f"{r} due {due[r]:.4g} s" for r in ids) + "]"
    where = f"{d.where()}.\nThe queue {show(d.waiting)}; running {show(d.running)}.\n"
    if sorted(d.preempt) != sorted(victims):
        why = victims_why(d, due, victims, shoved)
        raise AssertionError(f"{where}You preempted {d.preempt}: {why}. Expected {victims}")
    order = sorted(d.waiting, key=lambda r: due[r])
    why = "while seats and blocks last: no seat empty while the next request due fits"
    if d.admit != order[: len(d.admit)]:
        why = f"by due time, earliest first, ties in the queue's order: {show(order)}"
    raise AssertionError(f"{where}You admitted {d.admit}: admit {why}. Expected {admitted}")


def victims_why(d, due, victims: list[str], shoved: dict[str, str]) -> str:
    extra, missing = [v for v in d.preempt if v not in victims], [v for v in victims if v not in d.preempt]
    for x, m in ((x, m) for x in extra for m in missing if due[x] == due[m]):
        return f"{x} and {m} are due at the same moment: the newer of them, {m}, makes way first"
    for x in extra:
        if stayed := [k for k in d.running if due[k] > due[x] and k not in d.preempt]:
            return f"{x} is due before {', '.join(stayed)}, who stayed: the running request due latest makes way first"
        return f"nobody needed {x}'s place: a waiting request takes a seat only from one due later than itself"
    m = missing[0]
    if m in shoved:
        return f"{shoved[m]} (due {due[shoved[m]]:.4g} s) waits with no room, and {m} is due later: {m} makes way"
    need = sum(d.grow.values())
    return f"the running need {need} KV block(s) to grow, {d.free_blocks} are free: the one due latest makes way first"


# --- the crowds -----------------------------------------------------------------------------------------------------
def request(rid: str, prompt: int, reply: int, at: float | None = None, step: int = 0) -> Request:
    ids = [257] + [(7 * len(rid) + 3 * ord(rid[-1]) + j) % 256 for j in range(prompt - 1)]
    return Request(rid, ids, reply, arrival_s=at, arrival_step=step, ignore_eos=True)


def crowds() -> dict[str, tuple]:
    """name -> (requests and their services, engine settings, aging_s)."""
    together = [("b0", BATCH, 9, 14), ("b1", BATCH, 6, 10), ("c0", CHAT, 5, 8), ("n0", DEFAULT, 7, 6),
                ("c1", CHAT, 4, 12), ("r0", REPORT, 8, 9), ("c2", CHAT, 6, 7), ("b2", BATCH, 5, 5)]  # fmt: skip
    displace = [("b0", BATCH, 0, 40), ("b1", BATCH, 0, 40), ("c0", CHAT, 4, 12), ("c1", CHAT, 8, 12),
                ("r0", REPORT, 12, 12), ("c2", CHAT, 14, 8)]  # fmt: skip
    by_step = [("x0", QUICK, 0, 24), ("t9", CHAT, 1, 4), ("n0", DEFAULT, 2, 4), ("c0", QUICK, 3, 4),
               ("b0", BATCH, 4, 4), ("t10", REPORT, 9, 4)]  # fmt: skip
    return {
        "everyone at once, past the seats (3 seats)": (
            [(request(rid, p, n, at=0.0), s) for rid, s, p, n in together], dict(slots=3), 0.5),
        "newcomers displacing the seated (2 seats)": (
            [(request(rid, 6, n, at=k * TICK), s) for rid, s, k, n in displace], dict(slots=2), 2.0),
        "a KV pool too small for everyone (14 blocks of 4)": (
            [(request("b0", 7, 24, at=0.0), BATCH), (request("b1", 7, 24, at=0.0), BATCH),
             (request("c0", 5, 24, at=2 * TICK), CHAT)], dict(slots=4, num_blocks=14), 0.5),
        "arrivals by step, aging, equal due times (1 seat)": (
            [(request(rid, 5, n, step=k), s) for rid, s, k, n in by_step], dict(slots=1), 0.25),
    }  # fmt: skip


def serve(policy_of, name: str) -> DueReferee:
    """One crowd through the real engine, refereed at every step; every reply exact and every block free after."""
    members, settings, aging_s = crowds()[name]
    runner = ModelRunner(small_model("gqa"))
    runner.clock = VirtualClock()
    referee = DueReferee(policy_of(aging_s), {r.id: s for r, s in members}, runner.clock, aging_s)
    engine = LayeredEngine(runner, referee, EngineConfig(max_len=256, kv="paged", block_size=4, **settings))
    engine.observers.append(lambda engine, step: engine.clock.advance(TICK))
    for r, s in members:
        engine.submit(r, service=s)
    with case(name):
        try:
            engine.run(max_steps=400)
        except PlanError as e:
            raise AssertionError(f"step {engine.step_no}: the engine refused the plan: {e}") from None
        harness.assert_served_everyone(engine, [r for r, _ in members])
    return referee


def check_crowds(policy_of) -> None:
    for name in crowds():
        serve(policy_of, name)


def check_drawn_inputs(policy_of, examples: int = 100) -> None:
    check_drawn(policy_of, DueReferee, examples)


def check_all(policy_of) -> None:
    check_crowds(policy_of)
    check_drawn_inputs(policy_of)


@pytest.mark.parametrize("name", list(crowds()), ids=["at-once", "newcomers", "tight-kv", "by-step"])
def test_each_step_seats_by_due_time_and_stays_exact(policy_of, name):
    serve(policy_of, name)


def test_your_orders_and_plans_equal_the_references_on_drawn_crowds(policy_of):
    check_drawn_inputs(policy_of)


# --- the checks catch plausible mistakes ----------------------------------------------------------------------------
def right_due(p, r, arrived=None) -> float:
    s, t = p.service(r), p.arrived_s(r) if arrived is None else arrived
    return due_at(s, t, r.first_token_step is not None, p.aging_s)


class Edf(RankedPolicy):
    """Earliest deadline first written out, with its due rule, rank, last_kept and plan replaceable for the mistakes."""

    name, default_victim = "edf-variant", "latest-due"

    def __init__(self, token_budget=None, aging_s=AGING_S, due=right_due, rank=None, last=None, plan=None):
        super().__init__(token_budget)
        self.schedule = (lambda w, s, kv: plan(RankedPolicy.schedule(self, w, s, kv))) if plan else self.schedule
        self.aging_s, self.due = aging_s, lambda r: due(self, r)
        self.rank = lambda r: (rank or (lambda p, r: (p.due(r),)))(self, r)  # (shadows RankedPolicy's methods)
        self.last_kept = lambda r: (last or (lambda p, r: (p.due(r), r.admit_order)))(self, r)


WRONG = {
    "orders-by-arrival": dict(rank=lambda p, r: (p.arrived_s(r),)),
    "orders-by-priority": dict(rank=lambda p, r: (p.service(r).priority,)),
    "latest-due-first": dict(rank=lambda p, r: (-p.due(r),)),
    "forgets-aging": dict(due=lambda p, r: right_due(p, r) if p.service(r).targets else math.inf),
    "no-target-due-on-arrival": dict(due=lambda p, r: right_due(p, r) if p.service(r).targets else p.arrived_s(r)),
    "keeps-the-ttft-after-the-first-token": dict(
        due=lambda p, r: p.arrived_s(r) + p.service(r).ttft_s if p.service(r).ttft_s else right_due(p, r)),
    "deadline-before-the-first-token": dict(
        due=lambda p, r: p.arrived_s(r) + p.service(r).deadline_s if p.service(r).deadline_s else right_due(p, r)),
    "a-reading-chat-user-ages": dict(due=lambda p, r: p.arrived_s(r) + p.aging_s
                                     if r.first_token_step is not None and not p.service(r).deadline_s
                                     else right_due(p, r)),
    "arrival-step-as-seconds": dict(due=lambda p, r: right_due(p, r, arrived=float(r.arrival_step))),
    "ties-last-come-first": dict(rank=lambda p, r: (p.due(r), -p.arrived_s(r))),
    "ties-by-id": dict(rank=lambda p, r: (p.due(r), r.id)),
    "preempts-the-newest": dict(last=lambda p, r: (r.admit_order,)),
    "preempts-the-earliest-due": dict(last=lambda p, r: (-p.due(r), r.admit_order)),
    "victim-ties-the-oldest": dict(last=lambda p, r: (p.due(r), -r.admit_order)),
    "admits-one-a-step": dict(plan=lambda p: replace(p, admit=p.admit[:1], tokens={
        k: n for k, n in p.tokens.items() if all(k != r.id for r in p.admit[1:])})),
}  # fmt: skip
DRAWN_ONLY = {  # right on every hand-built crowd; only the drawn checks catch these (words in their first line)
    # equal due times left in seat order, which is not the admission order once a seat has been given back
    "last-kept-is-the-rank": (dict(last=lambda p, r: (p.due(r),)), "your last_kept"),
    # first come, first served read as "by arrival": a preempted request is back at the head, ahead of earlier ones
    "ties-first-come-by-arrival": (dict(rank=lambda p, r: (p.due(r), p.arrived_s(r))), "your rank"),
}
WRONG |= {name: mistake for name, (mistake, _) in DRAWN_ONLY.items()}


def by_slack(token_budget=None, aging_s=AGING_S) -> Edf:
    """Right, written differently: the slack, due - now (the same order: now is everyone's)."""
    slack = lambda p, r: p.due(r) - p.clock.now()
    return Edf(token_budget, aging_s, rank=lambda p, r: (slack(p, r),), last=lambda p, r: (slack(p, r), r.admit_order))


class ByPromise(RankedPolicy):
    """Right, written differently: the first promise that still binds, from a list; victims by (rank, admission)."""

    name, default_victim = "edf-promises", "latest-due"

    def __init__(self, token_budget=None, aging_s=AGING_S):
        super().__init__(token_budget)
        self.aging_s = aging_s

    def rank(self, r):
        s, waiting_first = self.service(r), r.first_token_step is None
        promises = [(s.ttft_s, waiting_first), (s.deadline_s, True), (s.ttft_s, True), (self.aging_s, True)]
        return (self.arrived_s(r) + next(seconds for seconds, binds in promises if seconds is not None and binds),)

    def last_kept(self, r):
        return self.rank(r) + (r.admit_order,)


def padded(token_budget=None, aging_s=AGING_S) -> Edf:
    """Right, written differently: the first token told by the reply so far, tuples with elements that never reorder
    (a constant; the id after admit_order, which no two running requests share)."""
    due = lambda p, r: due_at(p.service(r), p.arrived_s(r), bool(r.output_ids), p.aging_s)
    rank, last = lambda p, r: (p.due(r), 0), lambda p, r: (p.due(r), r.admit_order, r.id)
    return Edf(token_budget, aging_s, due, rank=rank, last=last)


CORRECT = {"written-out": Edf, "by-slack": by_slack, "by-promise": ByPromise, "padded": padded}


@CHECKS
@pytest.mark.parametrize("right", CORRECT.values(), ids=CORRECT.keys())
def test_a_correct_version_passes(right):
    check_all(lambda aging_s, budget=None: right(token_budget=budget, aging_s=aging_s))


@CHECKS
@pytest.mark.parametrize("name", [name for name in WRONG if name not in DRAWN_ONLY])
def test_the_checks_catch_a_wrong_deadline_policy(name):
    with pytest.raises(AssertionError):
        check_crowds(lambda aging_s, budget=None: Edf(budget, aging_s, **WRONG[name]))


@CHECKS
@pytest.mark.parametrize("name", DRAWN_ONLY)
def test_the_drawn_checks_catch_what_the_crowds_miss(name):
    mistake, words = DRAWN_ONLY[name]
    wrong = lambda aging_s, budget=None: Edf(budget, aging_s, **mistake)
    check_crowds(wrong)  # every hand-built crowd passes it
    first, message = harness.failure_of(check_drawn_inputs, wrong)
    assert words in first, message


@CHECKS
def test_the_crowds_are_what_their_names_say():
    reference = lambda aging_s: DeadlinePolicy(token_budget=None, victim="latest-due", aging_s=aging_s)
    together, displace, tight, by_step = (serve(reference, name).decisions for name in crowds())
    assert together[0].admit == ["r0", "c0", "c1"] and any(d.preempt for d in together)
    assert [d.preempt for d in displace if d.preempt][:3] == [["b1"], ["b0"], ["c1"]]  # b1: b0's tie, but newer
    ties = [d for d in tight if d.preempt]
    assert ties and ties[0].preempt == ["b1"] and ties[0].running[-1] == "c0"  # c0 the newest, b1 b0's tie
    assert [d.admit[0] for d in by_step if d.admit][1:4] == ["c0", "t9", "t10"]  # t9 and t10: due at the same time


@CHECKS
def test_a_stub_says_not_attempted_yet():  # (the NotImplementedError reaches the lesson summary untouched)
    with pytest.raises(NotImplementedError):
        check_all(lambda aging_s, budget=None: Edf(budget, aging_s, rank=harness.stub))


BORROWED = ("from minillm.layers.policies import DeadlinePolicy as MyDeadlinePolicy\n",
            "from minillm.layers.policies import RankedPolicy, due\nclass MyDeadlinePolicy(RankedPolicy): pass\n",
            "from minillm.layers import policies\nclass MyDeadlinePolicy(policies.RankedPolicy): pass\n")  # fmt: skip


@CHECKS
@pytest.mark.parametrize("source", BORROWED)
def test_the_reference_borrowed_is_refused(source, tmp_path):
    (path := tmp_path / "borrowed.py").write_text(source)
    exec(source, namespace := {})
    with pytest.raises(AssertionError, match="write the order yourself"):
        assert_writes_its_own_order(SimpleNamespace(__file__=str(path), **namespace))
