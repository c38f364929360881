"""Lesson 15's differential checks: your rank and last_kept against the reference's (DeadlinePolicy) on drawn crowds.

Times are whole ticks of 1/64 s (sums stay exact: due times meet exactly when they should). A drawn request has a
service: chat (a TTFT target only, 1 to 24 ticks), batch (a deadline only, 2 to 48 ticks), both, or none (due aging_s
after it arrives, aging_s 1 to 32 ticks). It arrives at once (0), spread (0 to 16 ticks), placed so that its due time
meets an earlier request's (exactly, or a tick either side; before or after either's first token), or at the moment
an earlier one is due (exactly, or a tick past: for one with no target, the clock at arrival + aging_s); arrivals in
seconds or by step (the clock when the policy first sees it).

- the orders: 1 to 7 requests at a drawn moment (when all have arrived: exactly when one is due, a tick past, or any
  later), each waiting (never seated; preempted after its first token, at step 0 or later; preempted mid-prompt) or
  running (its first token seen; mid-prompt under a token budget, none yet), seated in a drawn order (not always
  their admission order). Your rank must sort the queue (the preempted at its head, then by arrival) as the
  reference's does (a stable sort: equal ranks keep the queue's order) and rank the same running requests after each
  waiting one (whose seat it may take); your last_kept must order the running as the reference's does.
- the engine: 2 to 6 such requests (prompts of 2 to 9 tokens, replies of 1 to 12) on 1 to 4 seats, KV blocks of 2 or
  4 tokens in a roomy pool or a tight one (what the largest request needs alone and 0 to 4 blocks more); half the
  crowds squeezed (3 to 6 requests, replies of 4 to 12 tokens, 2 or 3 seats, a pool of what the largest needs alone or
  one block more: displacements, preemptions, requests back in the queue with their first token); a quarter with a
  token budget of 2 to 8 (running requests mid-prompt, no first token yet). Your policy serves them in the real
  engine on a clock that ticks once a step, the lesson's referee judging each step (without a token budget: it does
  not model one); beside it, on the very same state, the reference decides too, and the two must admit the same
  requests in the same order and preempt the same ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

from hypothesis import strategies as st

from minillm.card.simulate import VirtualClock
from minillm.config import EngineConfig
from minillm.engine.request import Request, State
from minillm.engine.runner import ModelRunner
from minillm.engine.scheduler import Plan, PlanError
from minillm.layers import LayeredEngine
from minillm.layers.policies import DeadlinePolicy
from minillm.layers.service import Service
from minillm.model.tokenizer import BOS
from tests.lessons.differential import against_reference, plural
from tests.lessons.drawn.crowds import countdown_model
from tests.lessons.harness import case

TICK = 1 / 64  # seconds a tick (and an engine step) takes: a power of two, so due times add up exactly
KINDS = {
    "chat": ("c", True, False),
    "batch": ("b", False, True),
    "both": ("r", True, True),
    "none": ("n", False, False),
}
PolicyOf = Callable[[float, int | None], object]  # (aging_s, token_budget) -> the policy under test


def secs(ticks: int) -> str:
    return f"{ticks * TICK:.10g} s"


@dataclass(frozen=True)
class Ask:
    """One drawn request: its id, its targets and arrival in ticks (None: no such target)."""

    rid: str
    ttft: int | None
    deadline: int | None
    at: int

    def service(self) -> Service:
        seconds = lambda t: None if t is None else t * TICK  # noqa: E731
        return Service(self.rid[0], 0, ttft_s=seconds(self.ttft), deadline_s=seconds(self.deadline))

    def due(self, first_token: bool, aging: int) -> int:
        """The exercise's rule, in ticks."""
        if self.ttft is not None and (not first_token or self.deadline is None):
            return self.at + self.ttft
        return self.at + (self.deadline if self.deadline is not None else aging)

    def targets(self) -> str:
        promised = [f"{name} {secs(t)}" for name, t in (("TTFT", self.ttft), ("deadline", self.deadline)) if t]
        return " and ".join(promised) or "no target (aging)"


# (strategies built once: hypothesis checks every new one, which costs more than drawing from it)
KIND = st.sampled_from(tuple(KINDS))
TTFT = st.one_of(st.sampled_from((4, 8, 16)), st.integers(1, 24))
DEADLINE = st.integers(2, 48)
HOW = st.sampled_from(("at once", "spread", "meets", "when due"))
SPREAD = st.integers(0, 16)
NUDGE = st.sampled_from((0, -1, 1))  # exactly, or a tick either side


def pick(draw, values):
    """One of `values`, a set that changes from draw to draw."""
    values = sorted(values)
    return values[draw(st.integers(0, len(values) - 1))]


def another_ask(draw, drawn: list[Ask], aging: int) -> Ask:
    """One more request, its due time meeting an earlier one's on purpose (its id: not in arrival order)."""
    letter, ttft_on, deadline_on = KINDS[draw(KIND)]
    ttft, deadline = draw(TTFT) if ttft_on else None, draw(DEADLINE) if deadline_on else None
    how = draw(HOW) if drawn else "at once" if draw(st.booleans()) else "spread"
    at = 0 if how == "at once" else draw(SPREAD)
    if how in ("meets", "when due"):
        their = pick(draw, {a.due(f, aging) for a in drawn for f in (False, True)})
        mine = {Ask("", ttft, deadline, 0).due(f, aging) for f in (False, True)}  # its due, from its arrival
        at = their + draw(NUDGE) - (pick(draw, mine) if how == "meets" else 0)
    return Ask(f"{letter}{len(drawn)}", ttft, deadline, max(at, 0))


@st.composite
def asks(draw, aging: int, count: int) -> tuple[Ask, ...]:
    """`count` requests in arrival order (same-tick arrivals in the drawn order)."""
    drawn: list[Ask] = []
    for _ in range(count):
        drawn.append(another_ask(draw, drawn, aging))
    return tuple(sorted(drawn, key=lambda a: a.at))


def make_request(a: Ask, by_step: bool, prompt: int = 6, reply: int = 8) -> Request:
    return Request(a.rid, [BOS] + [65] * (prompt - 1), reply, arrival_step=a.at,
                   arrival_s=None if by_step else a.at * TICK, ignore_eos=True)  # fmt: skip


def attach(policy, services: dict[str, Service], now: int, by_step: bool, asked: tuple[Ask, ...]):
    """The policy attached as the engine would: its service book, a clock at `now`; arrivals by step seen then."""
    clock = VirtualClock()
    clock.t = now * TICK
    policy.attach(SimpleNamespace(services=services, clock=clock))
    if by_step:  # (the engine's policy first sees a request the step it arrives)
        policy.seen_s.update({a.rid: a.at * TICK for a in asked})
    return policy


# --- the orders -------------------------------------------------------------------------------------------------------
WAITING = {"queued": "waiting, never seated", "preempted": "waiting, preempted after its first token",
           "preempted mid-prompt": "waiting, preempted mid-prompt (no first token yet)"}  # fmt: skip
RUNNING = {"running": "running, its first token seen", "running mid-prompt": "running mid-prompt (no first token yet)"}


@dataclass(frozen=True)
class Moment:
    asks: tuple[Ask, ...]
    states: tuple[str, ...]  # per ask: a key of WAITING or RUNNING
    admit: tuple[int, ...]  # per ask: its admit_order (-1: never seated)
    first: tuple[int, ...]  # per ask: the step of its first token (when it has one)
    seats: tuple[int, ...]  # the running asks' indices in seat order
    now: int
    aging: int
    by_step: bool

    def requests(self) -> tuple[list[Request], list[Request]]:
        """(the queue: the preempted at its head, then by arrival; the running in seat order)."""
        made = []
        for a, state, order, first in zip(self.asks, self.states, self.admit, self.first):
            r = make_request(a, self.by_step)
            made.append(r)
            r.admit_order, r.admit_step = order, None if order < 0 else a.at
            if state in ("preempted", "running"):
                r.first_token_step, r.first_token_s, r.output_ids = first, first * TICK, [65] * (1 + first % 3)
            r.state = State.RUNNING if state in RUNNING else State.WAITING
            r.num_computed = {"running": r.num_tokens - 1, "running mid-prompt": 3}.get(state, 0)
            r.preemptions = int(state.startswith("preempted"))
        queue = [r for r, s in zip(made, self.states) if s.startswith("preempted")]
        queue += [r for r, s in zip(made, self.states) if s == "queued"]
        running = [made[i] for i in self.seats]
        for seat, r in enumerate(running):
            r.seat = seat
        return queue, running

    def due(self, rid: str) -> int:
        i = next(i for i, a in enumerate(self.asks) if a.rid == rid)
        return self.asks[i].due(self.states[i] in ("preempted", "running"), self.aging)

    def describe(self) -> str:
        queue, running = self.requests()
        arrivals = "arrivals by step" if self.by_step else "arrivals in seconds"
        return (f"at {secs(self.now)} (aging_s {secs(self.aging)}, {arrivals}), the queue {[r.id for r in queue]} "
                f"and {plural(len(running), 'request')} running (seat order {[r.id for r in running]})")  # fmt: skip

    def listing(self) -> list[str]:
        lines = []
        for a, state, order in zip(self.asks, self.states, self.admit):
            seated = f" (admit_order {order})" if order >= 0 else ""
            told = WAITING.get(state) or RUNNING[state]
            lines.append(
                f"  {a.rid}: {a.targets()}, arrived at {secs(a.at)}, {told}{seated}: due {secs(self.due(a.rid))}"
            )
        return lines


AGING = st.integers(1, 32)
STATE = st.sampled_from((*WAITING, *RUNNING))


@st.composite
def moments(draw) -> Moment:
    aging, drawn = draw(AGING), []
    for _ in range(draw(st.integers(1, 7))):  # (each request's draws together: the shrinker drops whole requests)
        a = another_ask(draw, [d[0] for d in drawn], aging)
        first = a.at + draw(st.integers(0, 2))  # (a first token at step 0 among them)
        drawn.append((a, draw(STATE), first, draw(st.integers(0, 7)), draw(st.integers(0, 7))))  # ..., admitted, seat
    drawn.sort(key=lambda d: d[0].at)  # (stable: same-tick arrivals in the drawn order)
    asked, states, first = tuple(d[0] for d in drawn), tuple(d[1] for d in drawn), tuple(d[2] for d in drawn)
    admit = [-1] * len(drawn)
    for order, i in enumerate(sorted((i for i, s in enumerate(states) if s != "queued"), key=lambda i: drawn[i][3])):
        admit[i] = order
    running = sorted((i for i, s in enumerate(states) if s in RUNNING), key=lambda i: drawn[i][4])  # in seat order
    latest = asked[-1].at  # (everyone has arrived)
    dues = {a.due(f, aging) + d for a in asked for f in (False, True) for d in (0, 1)}  # when one is due, a tick past
    now = max(latest, pick(draw, dues) if draw(st.booleans()) else latest + draw(st.integers(0, 48)))
    return Moment(asked, states, tuple(admit), first, tuple(running), now, aging, draw(st.booleans()))


def orders(policy, queue: list[Request], running: list[Request]):
    """What the seating machinery sees of rank and last_kept: the queue sorted (stable), the running requests ranked
    after each waiting one (it may take their seat), and the running in last_kept order."""
    after = {h.id: [r.id for r in running if policy.rank(r) > policy.rank(h)] for h in queue}
    kept = [r.id for r in sorted(running, key=policy.last_kept)]
    return [r.id for r in sorted(queue, key=policy.rank)], after, kept


def compare_orders(policy_of: PolicyOf):
    def run(m: Moment):
        services = {a.rid: a.service() for a in m.asks}
        queue, running = m.requests()
        reference = attach(DeadlinePolicy(None, "latest-due", m.aging * TICK), services, m.now, m.by_step, m.asks)
        want = orders(reference, queue, running)
        with case(m.describe()):
            got = orders(attach(policy_of(m.aging * TICK, None), services, m.now, m.by_step, m.asks), queue, running)
        due = lambda rid: secs(m.due(rid))  # noqa: E731
        shown = lambda ids: "[" + ", ".join(f"{rid} due {due(rid)}" for rid in ids) + "]"  # noqa: E731
        if got[0] != want[0]:
            why = f"your rank sorts the queue {got[0]}; by due time, earliest first, ties in the queue's order"
            raise AssertionError("\n".join([f"{m.describe()}: {why}: {shown(want[0])}", *m.listing()]))
        for h in want[1]:
            if set(got[1][h]) != set(want[1][h]):
                wrong = sorted(set(got[1][h]) ^ set(want[1][h]))[0]
                told = "after" if wrong in got[1][h] else "no later than"
                rule = "a waiting request may take the seat of a running one due later than itself, and only then"
                why = f"your rank puts running {wrong} (due {due(wrong)}) {told} waiting {h} (due {due(h)}): {rule}"
                raise AssertionError("\n".join([f"{m.describe()}: {why}", *m.listing()]))
        if got[2] != want[2]:
            why = (f"your last_kept orders the running {got[2]}; the one due latest last (it makes way first), among "
                   f"equal due times the newest (the largest admit_order) last")  # fmt: skip
            order = {a.rid: n for a, n in zip(m.asks, m.admit)}
            want_kept = ", ".join(f"{rid} due {due(rid)} admit_order {order[rid]}" for rid in want[2])
            raise AssertionError("\n".join([f"{m.describe()}: {why}: [{want_kept}]", *m.listing()]))

    return run


# --- the engine -------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Crowd:
    asks: tuple[Ask, ...]
    sizes: tuple[tuple[int, int], ...]  # per ask: (prompt tokens, reply tokens)
    aging: int
    by_step: bool
    slots: int
    block_size: int
    num_blocks: int | None  # None: roomy
    budget: int | None

    def requests(self) -> list[Request]:
        return [make_request(a, self.by_step, n, reply) for a, (n, reply) in zip(self.asks, self.sizes)]

    def describe(self) -> str:
        pool = f"a pool of {plural(self.num_blocks, 'block')}" if self.num_blocks else "a roomy pool of blocks"
        budget = f", a token budget of {self.budget}" if self.budget else ""
        arrivals = "by step" if self.by_step else "in seconds"
        return (f"with these {plural(len(self.asks), 'request')} (arrivals {arrivals}) on {plural(self.slots, 'seat')}"
                f" and {pool} of {self.block_size} tokens{budget}, aging_s {secs(self.aging)}")  # fmt: skip

    def listing(self) -> list[str]:
        return [f"  {a.rid}: {a.targets()}, arrives at {secs(a.at)}, a prompt of {n} tokens, {plural(reply, 'token')} "
                f"to reply" for a, (n, reply) in zip(self.asks, self.sizes)]  # fmt: skip


@st.composite
def crowds(draw) -> Crowd:
    """Half the crowds squeezed: 3 to 6 requests with long replies on 2 or 3 seats in a pool that binds (displacements,
    preemptions, requests back in the queue with their first token)."""
    squeeze, aging = draw(st.booleans()), draw(AGING)
    asked = draw(asks(aging, draw(st.integers(3, 6) if squeeze else st.integers(2, 6))))
    sizes = tuple((draw(st.integers(2, 9)), draw(st.integers(4 if squeeze else 1, 12))) for _ in asked)
    block_size = draw(st.sampled_from((2, 4)))
    alone = max(-(-(n + reply) // block_size) for n, reply in sizes)
    tight = alone + draw(st.integers(0, 1) if squeeze else st.sampled_from((0, 1, 2, 4)))  # (squeezed: it binds)
    num_blocks = tight if squeeze or draw(st.booleans()) else None
    budget = draw(st.integers(2, 8)) if draw(st.integers(0, 3)) == 0 else None
    slots = draw(st.integers(2, 3) if squeeze else st.integers(1, 4))
    return Crowd(asked, sizes, aging, draw(st.booleans()), slots, block_size, num_blocks, budget)


class Beside:
    """Your policy (judged by the lesson's referee) with the reference deciding beside it on the same state."""

    def __init__(self, referee, reference):
        self.referee, self.reference = referee, reference
        self.name, self.holds_finished_seats = referee.name, referee.holds_finished_seats

    def __getattr__(self, name):
        return getattr(self.referee, name)

    def attach(self, engine) -> None:
        self.referee.attach(engine)
        self.reference.attach(engine)

    def schedule(self, waiting, seats, kv) -> Plan:
        want = self.reference.schedule(list(waiting), list(seats), kv)
        got = self.referee.schedule(waiting, seats, kv)  # the referee's own words first, when it objects
        ids = lambda rs: [r.id for r in rs]  # noqa: E731
        if ids(got.admit) != ids(want.admit) or sorted(ids(got.preempt)) != sorted(ids(want.preempt)):
            d, due = self.referee.decisions[-1], self.referee.due
            shown = lambda rids: "[" + ", ".join(f"{r} due {due[r]:.10g} s" for r in rids) + "]"  # noqa: E731
            raise AssertionError(
                f"{d.where()}.\nThe queue {shown(d.waiting)}; running {shown(d.running)}.\nYou admitted "
                f"{ids(got.admit)} and preempted {ids(got.preempt)}; the reference admits {ids(want.admit)} and "
                f"preempts {sorted(ids(want.preempt))}"
            )
        return got


def compare_crowds(policy_of: PolicyOf, referee_of):
    """referee_of(policy, services, clock, aging_s): the lesson's referee (tests/lessons/test_lesson15.py)."""

    def run(crowd: Crowd):
        runner, aging_s = ModelRunner(countdown_model()), crowd.aging * TICK
        runner.clock = VirtualClock()
        services = {a.rid: a.service() for a in crowd.asks}
        referee = referee_of(policy_of(aging_s, crowd.budget), services, runner.clock, aging_s)
        if crowd.budget:
            referee.judge = lambda d: None  # (its plan does not model a token budget: the reference alone judges)
        beside = Beside(referee, DeadlinePolicy(crowd.budget, "latest-due", aging_s))
        kv = dict(kv="paged", block_size=crowd.block_size, num_blocks=crowd.num_blocks)
        engine = LayeredEngine(runner, beside, EngineConfig(max_len=64, slots=crowd.slots, **kv))
        engine.observers.append(lambda engine, step: engine.clock.advance(TICK))
        requests = crowd.requests()
        for r in requests:
            engine.submit(r, service=services[r.id])
        try:
            try:
                engine.run(max_steps=400)
            except PlanError as e:
                raise AssertionError(f"step {engine.step_no}: the engine refused the plan: {e}") from None
            stuck = [r.id for r in requests if r.finish_reason != "length"]
            assert not stuck, f"after {engine.step_no} steps these requests never finished: {stuck}"
            assert engine.cache.free_blocks == engine.cache.num_blocks, "KV blocks are still held after the run"
        except AssertionError as error:
            raise AssertionError("\n".join([f"{crowd.describe()}, {error}", *crowd.listing()])) from error

    return run


def check_drawn(policy_of: PolicyOf, referee_of, examples: int = 100) -> None:
    """policy_of(aging_s, token_budget): the policy to check; referee_of: the lesson's referee."""
    against_reference("your rank and last_kept", moments(), compare_orders(policy_of), examples)
    against_reference("your policy", crowds(), compare_crowds(policy_of, referee_of), examples // 4)
