"""Shared helpers for the lesson checks: which code is under test, small models, a crowd, a referee.

Every lesson test takes the implementation under test as an argument (ARENA style), so the same
check runs on the reference and on yours (lessons/exercises/). Testing the reference never imports
your files, so a half-written exercise cannot break the reference's checks. `pytest -m lessonNN` runs
the checks on your code; the full suite also runs them on the reference and against the wrong versions
each test file lists (marker lesson_checks).

MINILLM_EXERCISES=<module prefix> points "student" at another package with the same file names,
e.g. `PYTHONPATH=/tmp/sol MINILLM_EXERCISES=solutions pytest -m lesson03` checks /tmp/sol/solutions/.
The default is `lessons.exercises`.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import math
import os
import textwrap
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest

from minillm.config import EngineConfig
from minillm.engine.blocks import BlockPoolExhausted
from minillm.engine.engine import Engine
from minillm.engine.generate import generate
from minillm.engine.request import Request
from minillm.engine.scheduler import Plan, PlanError
from minillm.layers import LayeredEngine
from minillm.model.transformer import Transformer

EXERCISES = os.environ.get("MINILLM_EXERCISES", "lessons.exercises")
CHECKS = pytest.mark.lesson_checks  # the checks themselves: on the reference, and against known wrong versions


def implementations(lesson_mark) -> list:
    """The two implementations every check runs on, as fixture params: the reference (its run is marked
    lesson_checks: the full suite runs it) and yours (marked lessonNN: `pytest -m lessonNN` runs only yours,
    so a student's run stays fast; `pytest tests/lessons/test_lessonNN.py` runs both)."""
    return [pytest.param("reference", marks=CHECKS), pytest.param("student", marks=lesson_mark)]


def student_module(name: str):
    """Your exercise module, e.g. student_module("lesson01_generate"); a file that does not import fails clearly."""
    try:
        return importlib.import_module(f"{EXERCISES}.{name}")
    except Exception as e:  # a syntax error, a typo in an import: say where, not a 40-line traceback
        where = f" (line {e.lineno})" if isinstance(e, SyntaxError) else ""
        pytest.fail(f"your {EXERCISES.replace('.', '/')}/{name}.py does not import{where}: {e!r}", pytrace=False)


def stub(*args, **kwargs):
    """What an exercise looks like before you write it."""
    raise NotImplementedError("stub")


# --- not attempted, or partly done? ------------------------------------------------------------
@dataclass
class Unwritten:
    """Where your code raised NotImplementedError."""

    state: str  # "not attempted": the stub as given; "partly done": a function you started still raises
    name: str  # e.g. "MyContinuousScheduler.schedule"
    file: str
    line: int
    message: str

    def describe(self) -> str:
        return (
            f"{self.name} ({self.file}, line {self.line}) still raises NotImplementedError({self.message!r}); "
            "this check needs that part"
        )


def exercises_dir() -> Path | None:
    spec = importlib.util.find_spec(EXERCISES)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def check_numbers(function: str, yours, cases, answer, known_mistakes: dict[str, str], abs_tol: float) -> None:
    """Your function against the answer on every case, (situation, args); the first difference fails, led by the
    likely mistake when one of known_mistakes gives every one of your numbers (answer(mistake): the functions as that
    mistake writes them; answer(): the right ones)."""
    same = lambda got, expected: got == expected or math.isclose(got, expected, rel_tol=1e-9, abs_tol=abs_tol)  # noqa: E731
    key = getattr(answer(), function)
    for where, args in cases:
        with case(f"{function}, {where}"):
            got = yours(*args)
        assert isinstance(got, int | float) and not isinstance(got, bool), (
            f"{function}, {where}: return a number, got {got!r}"
        )
        if same(got, key(*args)):
            continue
        mine = [yours(*a) for _, a in cases]
        hints = [m for m in known_mistakes
                 if all(same(g, getattr(answer(m), function)(*a)) for g, (_, a) in zip(mine, cases))]  # fmt: skip
        lines = [f"likely mistake: {known_mistakes[m]}" for m in hints[:1]]
        lines.append(f"{function}, {where}: yours gives {got:,.6g}, the answer is {key(*args):,.6g}")
        raise AssertionError("\n".join(lines))


def failure_of(check_all, wrong) -> tuple[str, str]:
    """(first line, whole message) of the AssertionError the checks give a wrong version: what a student sees
    first, and all of it (for a test's own failure message). Fails the test if the checks let it pass."""
    with pytest.raises(AssertionError) as caught:
        check_all(wrong)
    message = str(caught.value)
    return message.splitlines()[0], message


def unwritten_part(error: NotImplementedError) -> Unwritten | None:
    """The exercise function that raised `error`, and whether it is still the untouched stub; None when the
    error did not come from your exercise files."""
    folder, raised_at = exercises_dir(), None
    for frame, line in traceback.walk_tb(error.__traceback__):
        if folder is not None and Path(frame.f_code.co_filename).resolve().parent == folder:
            raised_at = frame, line  # the deepest frame in your files
    if raised_at is None:
        return None
    frame, line = raised_at
    state = "not attempted" if is_untouched_stub(frame.f_code, line) else "partly done"
    file = f"{EXERCISES.replace('.', '/')}/{Path(frame.f_code.co_filename).name}"
    return Unwritten(state, frame.f_code.co_qualname, file, line, str(error))


def is_untouched_stub(code, line: int) -> bool:
    """True when the function's first statement (after its docstring) is the raise at `line`."""
    try:
        lines, first = inspect.getsourcelines(code)
        function = ast.parse(textwrap.dedent("".join(lines))).body[0]
    except (OSError, SyntaxError, IndexError):
        return False
    body = list(getattr(function, "body", []))
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        body = body[1:]  # the docstring
    return bool(body) and isinstance(body[0], ast.Raise) and body[0].lineno + first - 1 == line


def assert_writes_its_own_policy(module, class_name: str, allowed=("Plan", "KVSpace")) -> None:
    """Your scheduler's file may take Plan and KVSpace from minillm.engine.scheduler, nothing else: the reference's
    policies and helpers are the answer, not a building block."""
    path = Path(module.__file__)
    cls = getattr(module, class_name, None)
    assert cls is not None, f"{path.name} defines no {class_name}"
    origin = getattr(cls, "__module__", "")
    assert not origin.startswith("minillm"), f"{path.name}: {class_name} is {origin}'s; write the policy yourself"
    from minillm.engine import scheduler as reference  # its names may also be taken through minillm.engine

    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "minillm.engine.scheduler":
            taken = [alias.name for alias in node.names if alias.name not in allowed]
        elif isinstance(node, ast.ImportFrom) and node.module in ("minillm", "minillm.engine"):
            names = [alias.name for alias in node.names]
            taken = ["scheduler"] * ("scheduler" in names) + [
                n for n in names if n not in allowed and getattr(reference, n, None) is not None and n != "scheduler"
            ]
        elif isinstance(node, ast.Import):
            taken = [alias.name for alias in node.names if alias.name.startswith("minillm.engine.scheduler")]
        else:
            continue
        assert not taken, (
            f"{path.name}, line {node.lineno}: you import {', '.join(taken)} from minillm.engine.scheduler; "
            f"write the policy yourself (only {' and '.join(allowed)} may come from there)"
        )


# --- models ----------------------------------------------------------------------------------
@functools.cache
def small_model(name: str) -> Transformer:
    """A small random model from tests/conftest.py (mha, gqa or mqa), built once per session."""
    from tests.conftest import random_model

    return random_model(name)


@functools.cache
def shipped_model() -> Transformer:
    from minillm.model.checkpoint import load_model

    return load_model(device="cpu")


# --- a crowd served by the real engine ---------------------------------------------------------
def crowd(n: int = 10, seed: int = 0) -> list[Request]:
    """Requests with mixed prompt and reply lengths, arriving over the first ten steps."""
    return [
        Request(
            id=f"r{i}",
            prompt_ids=[257] + [(seed * 31 + i * 7 + j) % 256 for j in range(2 + (i * 5) % 13)],
            max_new_tokens=3 + (i * 11) % 29,
            arrival_step=(i * 3) % 10,
            ignore_eos=True,
        )
        for i in range(n)
    ]


def exact_crowd() -> list[Request]:
    """(Lessons 3 and 4.) A pool of 10 blocks of 4 tokens that the prompts fill exactly: e0 needs 4 blocks and e1
    the 6 left (one batch); e2 needs all 10 (a batch of its own); then e3. Two-token replies stay in their prompts'
    last block."""
    shape = [(15, 2), (23, 2), (39, 2), (3, 3)]  # (prompt tokens, reply tokens)
    return [
        Request(f"e{i}", [257] + [(3 * i + j) % 256 for j in range(n - 1)], reply, ignore_eos=True)
        for i, (n, reply) in enumerate(shape)
    ]


@functools.cache
def expected_reply(model: Transformer, prompt_ids: tuple[int, ...], max_new_tokens: int, ignore_eos: bool) -> list[int]:
    """The plain no-cache loop's reply: what any batching must reproduce token for token (memoized)."""
    return generate(model, list(prompt_ids), max_new_tokens, use_cache=False, ignore_eos=ignore_eos).tokens


def serve(model, scheduler, requests, max_steps: int = 2000, **cfg) -> Engine:
    """Run the real engine with `scheduler` until every request is done (or max_steps)."""
    engine = LayeredEngine(model, scheduler, EngineConfig(max_len=model.cfg.max_seq_len, **cfg))
    for r in requests:
        engine.submit(r)
    try:
        engine.run(max_steps=max_steps)
    except PlanError as e:
        raise AssertionError(f"step {engine.step_no}: the engine refused your plan: {e}") from None
    except BlockPoolExhausted as e:
        raise AssertionError(
            f"step {engine.step_no}: the KV cache ran out of blocks: you admitted more than fits, "
            f"or did not preempt when the running requests could not grow ({e})"
        ) from None
    return engine


def assert_served_everyone(engine: Engine, requests: list[Request], blame: str = "your policy") -> None:
    """Nothing lost: every request finished with its full reply, token-exact, and all KV memory is free."""
    stuck = [r.id for r in requests if r.finish_reason != "length"]
    assert not stuck, (
        f"after {engine.step_no} steps these requests never finished: {stuck} "
        f"(still waiting: {[r.id for r in engine.waiting]}); does {blame} admit whenever it may?"
    )
    for r in requests:
        expected = expected_reply(engine.runner.model, tuple(r.prompt_ids), r.max_new_tokens, r.ignore_eos)
        assert r.output_ids == expected, (
            f"{r.id}: its reply differs from the plain no-cache loop's: {first_difference(expected, r.output_ids)}"
        )
    assert engine.cache.free_blocks == engine.cache.num_blocks, "KV blocks are still held after the run"


# --- a referee: checks each scheduling decision at the moment it is made -----------------------
@dataclass
class Decision:
    """The state a scheduler saw at one step, and the plan it returned (ids only: requests keep changing)."""

    step: int
    waiting: list[str]
    seated: list[str | None]  # per seat: the request's id, or None
    running: list[str]  # seated and unfinished, oldest admission first
    free_seats: int  # None seats, plus finished ones when the policy holds finished seats
    free_blocks: int
    cost: dict[str, int]  # waiting id -> blocks its prefill needs
    grow: dict[str, int]  # running id -> blocks it needs to decode one more token
    held: dict[str, int]  # running id -> blocks it holds now
    admit: list[str]
    preempt: list[str]

    def where(self) -> str:
        return (
            f"step {self.step}: queue {self.waiting}, running (oldest admission first) {self.running}, "
            f"{self.free_seats} free seat(s), {self.free_blocks} free KV block(s)"
        )


class Referee:
    """Wraps a scheduler for the engine; `judge(decision)` raises AssertionError on a wrong decision."""

    def __init__(self, scheduler, judge):
        self.inner, self.judge = scheduler, judge
        self.name, self.holds_finished_seats = scheduler.name, scheduler.holds_finished_seats
        self.decisions: list[Decision] = []

    def __getattr__(self, name):  # anything else the engine asks (e.g. a token budget) is the scheduler's
        return getattr(self.inner, name)

    def schedule(self, waiting, seats, kv) -> Plan:
        running = sorted((r for r in seats if r is not None and not r.is_finished), key=lambda r: r.admit_order)
        held_seats = sum(1 for r in seats if r is not None and r.is_finished) if self.holds_finished_seats else 0
        before = dict(
            step=len(self.decisions),
            waiting=[r.id for r in waiting],
            seated=[None if r is None else r.id for r in seats],
            running=[r.id for r in running],
            free_seats=seats.count(None) + held_seats,
            free_blocks=kv.free_blocks,
            cost={r.id: kv.blocks_to_admit(r.tokens_in_cache_after_prefill) for r in waiting},
            grow={r.id: kv.blocks_to_grow(r.seat) for r in running},
            held={r.id: kv.blocks_held(r.seat) for r in running},
        )
        plan = self.inner.schedule(waiting, seats, kv)
        assert isinstance(plan, Plan), f"schedule() must return a Plan, got {type(plan).__name__}"
        decision = Decision(**before, admit=[r.id for r in plan.admit], preempt=[r.id for r in plan.preempt])
        self.decisions.append(decision)
        self.judge(decision)
        return plan


def fcfs(decision: Decision, free_seats: int, free_blocks: int) -> list[str]:
    """Who first-come-first-served admits: the head of the queue, in order, while seats and blocks last."""
    admitted = []
    for rid in decision.waiting:
        if len(admitted) == free_seats or decision.cost[rid] > free_blocks:
            break
        admitted.append(rid)
        free_blocks -= decision.cost[rid]
    return admitted


def blocks(n: int) -> str:
    return f"{n} block" if n == 1 else f"{n} blocks"


def assert_admitted_the_head_of_the_queue(d: Decision, free_seats: int, free_blocks: int, victims=()) -> None:
    """Shared by both policies: admit from the head, in order, while seats and blocks last; nobody jumps ahead.
    free_seats and free_blocks: what newcomers may use, after this step's victims and the running requests' growth."""
    expected = fcfs(d, free_seats, free_blocks)
    if d.admit == expected:
        return
    once = [f"{', '.join(victims)} gave back {'its' if len(victims) == 1 else 'their'} blocks"] if victims else []
    once += ["the running requests have grown"] if d.running else []
    pool = f"{blocks(free_blocks)} free for newcomers" + (f" once {' and '.join(once)}" if once else "")
    strangers = [rid for rid in d.admit if rid not in d.waiting]
    assert not strangers, f"{d.where()}: you admitted {strangers}, who are not in the queue: admit from `waiting` only"
    assert len(set(d.admit)) == len(d.admit), f"{d.where()}: you admitted {d.admit}: somebody twice"
    if sorted(d.admit) == sorted(d.waiting[: len(d.admit)]) and d.admit != d.waiting[: len(d.admit)]:
        raise AssertionError(f"{d.where()}: you admitted {d.admit}: admit them in queue order, {expected}")
    if d.admit != d.waiting[: len(d.admit)]:
        skipped = next(rid for rid in d.waiting if rid not in d.admit)
        jumper = next(rid for rid in d.admit if d.waiting.index(rid) > d.waiting.index(skipped))
        ahead = [r for r in expected if d.waiting.index(r) < d.waiting.index(skipped)]
        left = free_blocks - sum(d.cost[r] for r in ahead)
        room = f"{left} left after {ahead} ({pool})" if ahead else pool
        why = (
            f"{skipped} needs {blocks(d.cost[skipped])}, with {room}, so it waits, and everybody behind it waits too"
            if skipped not in expected
            else f"{skipped} came first and fits"
        )
        raise AssertionError(
            f"{d.where()}: you admitted {d.admit}, so {jumper} jumped ahead of {skipped}. Admission is first come, "
            f"first served: take requests from the head of the queue, in order; {why}. Expected {expected}"
        )
    if len(d.admit) > len(expected):
        extra = d.admit[len(expected)]
        seats_left, left = free_seats - len(expected), free_blocks - sum(d.cost[r] for r in expected)
        if seats_left == 0:
            why = "no seat is left"
        elif expected:
            given = sum(d.cost[r] for r in expected)
            why = f"its prefill needs {blocks(d.cost[extra])} and {left} are left: {pool}, less {given} for {expected}"
        else:
            why = f"its prefill needs {blocks(d.cost[extra])}, with {pool}"
        raise AssertionError(
            f"{d.where()}: you admitted {d.admit}, but {extra} does not fit: {why}. Expected {expected}"
        )
    missed = expected[len(d.admit)]
    raise AssertionError(
        f"{d.where()}: you admitted {d.admit}, but {missed} was next in the queue and fits: "
        f"{free_seats} free seat(s) and {pool}. Expected {expected}: no seat may idle while the head of the queue fits"
    )


def first_difference(expected: list, got: list) -> str:
    """'first difference at token 3: expected 52, got 10' for the first position where two token lists differ."""
    for i, (e, g) in enumerate(zip(expected, got)):
        if e != g:
            return f"first difference at token {i}: expected {e}, got {g}"
    if len(expected) != len(got):
        return f"expected {len(expected)} tokens, got {len(got)} (the first {min(len(expected), len(got))} agree)"
    return "no difference"


def run_seed_story(scheduler, judge, steps: int | None = None) -> dict[str, Request]:
    """The lessons' eight users on four seats, for `steps` steps (default: the longest reply's, plus one: enough
    to see the last user join under either policy)."""
    from lessons.fairness import stand_in_model
    from minillm.runs.workload import SEED_STORY, SEED_STORY_SLOTS, seed_story

    steps = steps or max(n for *_, n in SEED_STORY) + 1
    model = stand_in_model(1024)  # no computation: it never says EOS, and each story reply's cap is its length
    requests = seed_story()
    engine = LayeredEngine(model, Referee(scheduler, judge), EngineConfig(slots=SEED_STORY_SLOTS, max_len=1024))
    for r in requests:
        engine.submit(r)
    try:
        while engine.has_work() and engine.step_no < steps:
            engine.step()
    except PlanError as e:
        raise AssertionError(f"seed story, step {engine.step_no}: the engine refused your plan: {e}") from None
    return {r.id: r for r in requests}


def assert_admitted_at(story: dict[str, Request], expected: dict[str, int], why: dict[str, str]) -> None:
    for rid, step in expected.items():
        got = story[rid].admit_step
        assert got == step, (
            f"seed story: {rid} should be admitted at step {step} ({why[rid]}), but was admitted at {got}"
        )


# --- a failure that names its case: your code's crash, and arguments it changed (lessons 01-04) ------------------
def raised_in_your_code(error: BaseException) -> str:
    """' (your lesson01_generate.py, line 17: width = max(...))': the deepest line of your exercise files in the
    error's traceback, or '' when it did not come from them."""
    folder, found = exercises_dir(), ""
    for frame in traceback.extract_tb(error.__traceback__):
        path = Path(frame.filename).resolve()
        if folder is not None and path.parent == folder:
            found = f" (your {path.name}, line {frame.lineno}: {(frame.line or '').strip()})"
    return found


class case:
    """`with case("a reply whose first token is EOS"):` a check failing inside says so first: an AssertionError gets
    the case in front, a crash of your code becomes one (with your line). NotImplementedError passes untouched: it
    says "not attempted" or "partly done"."""

    def __init__(self, label: str):
        self.label = label

    def __enter__(self):
        return self

    def __exit__(self, kind, error, tb):
        if error is None or isinstance(error, NotImplementedError) or not isinstance(error, Exception):
            return False
        if isinstance(error, AssertionError):
            message = str(error)
            if message.startswith(self.label):
                return False
            raise AssertionError(f"{self.label}: {message}") from error
        raise AssertionError(
            f"{self.label}: your code raised {type(error).__name__}: {error}{raised_in_your_code(error)}"
        ) from error


class Guarded:
    """A scheduler, watched: schedule() must leave the lists it is given as they were (a policy that pops admitted
    requests off `waiting`, or marks a victim's seat None in `seats`, breaks any caller that hands it its own
    lists), and a crash in it names the step and the queue it saw."""

    def __init__(self, scheduler):
        self.inner, self.calls = scheduler, 0
        self.name, self.holds_finished_seats = scheduler.name, scheduler.holds_finished_seats

    def __getattr__(self, name):  # anything else the engine asks (e.g. a token budget) is the scheduler's
        return getattr(self.inner, name)

    def schedule(self, waiting, seats, kv) -> Plan:
        step, self.calls = self.calls, self.calls + 1
        given = {"waiting": list(waiting), "seats": list(seats)}
        shown = lambda rs: [r if r is None else r.id for r in rs]
        where = f"step {step}: queue {shown(waiting)}, seats {shown(seats)}, {kv.free_blocks} free KV block(s)"
        try:
            plan = self.inner.schedule(waiting, seats, kv)
        except (NotImplementedError, AssertionError):
            raise
        except Exception as e:
            raise AssertionError(
                f"{where}: your schedule() raised {type(e).__name__}: {e}{raised_in_your_code(e)}"
            ) from e
        for name, now in (("waiting", waiting), ("seats", seats)):
            before = given[name]
            if len(now) != len(before) or any(a is not b for a, b in zip(now, before)):
                raise AssertionError(
                    f"step {step}: your schedule() changed the `{name}` list it was given: {shown(before)} became "
                    f"{shown(now)}. Read the arguments, never change them: the Plan says who boards and who leaves, "
                    "and the engine moves them"
                )
        return plan
