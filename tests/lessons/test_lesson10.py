"""Lesson 10: the abort path. Run: pytest -m lesson10

Your abort takes a request out of wherever it is (not yet arrived, queued, seated mid-prompt or
mid-reply) and frees its seat and KV blocks at once; it leaves finished requests, and the seats they
once had, alone. Then it runs inside the real serve loop (minillm/serving/serve_loop.py, no HTTP), where a
reader hangs up on some requests while the others must still get exactly the plain loop's tokens.

Also at the edges: the contiguous layout (no blocks, no allocator), an id used again after its first request
finished, an arrival that is due but not yet queued, a preemption after an abort from the queue (engine.waiting must
stay a deque), a finished request still sitting in the seat static batching holds.

WRONG (below) lists the mistakes a room makes, each caught (the middle of the queue, a reason given, a
rejected request, the finish time included); RIGHT, aborts written differently that must pass.

Then the differential check (tests/lessons/drawn/lesson10.py): your abort and the reference's in two engines serving
the same 50 drawn runs (seeded: the same every run; MINILLM_CHECK_EXAMPLES=N draws N), compared after every abort
(the return, the seats, the queue, the requests not arrived yet, the free KV blocks, every request's state, reason
and finish step, the finish time on the engine's clock) and at the end (every reply), the smallest run that differs
shown first. Its strategies: 1 to 5 requests (replies ending on EOS at once or later, on their caps, or rejected),
arriving at steps 0 to 3, on 1 to 3 seats; continuous or static batching; a tight paged pool (long replies arriving
together: preemption), a roomy one, or contiguous KV; chunked prefill, prefix caching and speculation each on or
off; 1 to 4 aborts at steps 0 to 6, each aimed at a place (queued back from a preemption, seated mid-prompt or
mid-reply, queued, not arrived, finished or rejected, holding a static seat, an unknown id), with the default
reason or one given. DRAWN_ONLY names the wrong aborts only the drawn runs catch.
"""

from __future__ import annotations

import queue
import time
from collections import deque

import pytest

from minillm.config import EngineConfig
from minillm.engine.engine import Engine
from minillm.engine.request import Request, State
from minillm.engine.scheduler import ContinuousScheduler, StaticScheduler
from minillm.layers import LayeredEngine
from minillm.serving.serve_loop import ServeLoop
from minillm.serving.token_stream import TokenStream
from tests.lessons.drawn.lesson10 import check_drawn
from tests.lessons.harness import CHECKS, expected_reply, first_difference, implementations, small_model, stub
from tests.lessons.harness import student_module as student

lesson = pytest.mark.lesson10  # your code's checks: pytest -m lesson10


def reference_abort(engine: Engine, request_id: str, reason: str = "aborted") -> bool:
    return Engine.abort(engine, request_id, reason)  # (the class's: the serve-loop check replaces engine.abort)


@pytest.fixture(params=implementations(lesson))
def abort(request):
    return reference_abort if request.param == "reference" else student("lesson10_server").abort


# --- helpers ---------------------------------------------------------------------------------------
def req(rid: str, prompt_len: int, new: int, arrival_step: int = 0, seed: int = 0) -> Request:
    ids = [257] + [(seed * 37 + 11 * j + 3) % 256 for j in range(prompt_len - 1)]
    return Request(rid, ids, new, arrival_step=arrival_step, ignore_eos=True)


def engine_for(slots: int, token_budget: int | None = None, num_blocks: int | None = None, kv: str = "paged",
               policy=ContinuousScheduler) -> Engine:  # fmt: skip
    model = small_model("gqa")
    cfg = EngineConfig(slots=slots, kv=kv, block_size=4, num_blocks=num_blocks, max_len=model.cfg.max_seq_len)
    return LayeredEngine(model, policy(token_budget=token_budget), cfg)


def call(abort, engine: Engine, r: Request | str, where: str, reason: str | None = None):
    rid = r if isinstance(r, str) else r.id
    try:
        return abort(engine, rid) if reason is None else abort(engine, rid, reason)
    except NotImplementedError:
        raise
    except Exception as e:  # a crash is a wrong answer: say when it happened
        hint = ""
        if "allocator" in str(e):
            hint = ": the contiguous cache has no allocator; engine.cache.free(seat) frees a seat on either layout"
        elif "NoneType" in str(e) and not isinstance(r, str) and r.seat is None:
            hint = f": {rid} has no seat (r.seat is None), so there is nothing of its to free in the cache"
        raise AssertionError(f"{where}: your abort raised {e!r} while aborting {rid}{hint}") from None


def abort_and_check(abort, engine: Engine, r: Request, where: str, reason: str | None = None) -> None:
    """Abort `r` (with `reason`, or abort's default) and check it is finished, out of every place, on time."""
    queue, before = [q.id for q in engine.waiting], engine.clock.now()
    submitted, seats = list(engine.requests), list(engine.seats)
    others = {q.id: (q.state, q.finish_reason, q.seat) for q in submitted if q is not r and q.id != r.id}
    result = call(abort, engine, r, where, reason)
    after = engine.clock.now()
    assert len(engine.seats) == len(seats), (
        f"a side effect: aborting {r.id} ({where}) left engine.seats with {len(engine.seats)} seats, not "
        f"{len(seats)}: empty the seat (engine.seats[seat] = None), don't remove it (the others keep their numbers)"
    )
    assert [id(q) for q in engine.requests] == [id(q) for q in submitted], (
        f"a side effect: aborting {r.id} ({where}) changed engine.requests, the record of everything submitted "
        "(the trace and the metrics read it): leave it as it is"
    )
    touched = [q.id for q in submitted if q.id in others and (q.state, q.finish_reason, q.seat) != others[q.id]]
    moved = [i for i, q in enumerate(seats) if q is not None and q is not r and engine.seats[i] is not q]
    assert not touched and not moved, (
        f"a side effect: aborting {r.id} ({where}) changed other requests ({touched}) or seats ({moved}): touch only "
        f"{r.id}, its seat and its KV blocks"
    )
    assert result is True, f"aborting {r.id} ({where}) returned {result!r}; return True when you abort a request"
    want = "aborted" if reason is None else reason
    assert r.state == State.FINISHED and r.finish_reason == want, (
        f"{r.id} ({where}): after abort(engine, {r.id!r}{'' if reason is None else f', {reason!r}'}), state is "
        f"{r.state!r} and finish_reason {r.finish_reason!r}; expected State.FINISHED and {want!r}"
        + ("" if reason is None else ": the reason given, not always the default")
    )
    assert r.finish_step == engine.step_no, f"{r.id}: finish_step should be engine.step_no ({engine.step_no})"
    assert isinstance(r.finish_s, (int, float)) and before <= r.finish_s <= after, (
        f"{r.id} ({where}): finish_s is {r.finish_s!r}; it should be the engine's clock when you aborted it, "
        f"engine.clock.now() (between {before:.4f} and {after:.4f}: seconds since the engine started, not time.time())"
    )
    gone = [rid for rid in queue if rid != r.id and rid not in [q.id for q in engine.waiting]]
    assert not gone, (
        f"aborting {r.id} ({where}) took {gone} out of the queue {queue}: remove {r.id} itself "
        "(engine.waiting.remove(r)), not the head of the queue"
    )
    assert r not in engine.waiting and r not in engine.pending, f"{r.id} ({where}) is still in the queue"
    assert r not in engine.seats, f"{r.id} ({where}) still has a seat: set engine.seats[seat] = None"


def run_to_the_end(engine: Engine, requests: list[Request], situation: str = "") -> None:
    about = f"{situation}: " if situation else ""
    try:
        engine.run(max_steps=600)
    except NotImplementedError:
        raise
    except Exception as e:  # the engine met what your abort left behind
        hint = ""
        if "appendleft" in str(e):
            hint = (
                ". engine.waiting must stay a deque: the engine puts a preempted request back at its front with "
                "engine.waiting.appendleft(r); take a request out in place, engine.waiting.remove(r)"
            )
        crash = f"the engine crashed at step {engine.step_no}, after your abort: {e!r}{hint}"
        raise AssertionError(about + crash) from None
    stuck = [r.id for r in requests if not r.is_finished]
    assert not stuck, (
        f"{about}{stuck} never finished: is a seat still taken by an aborted request? (seats: "
        f"{[None if s is None else s.id for s in engine.seats]})"
    )
    for r in requests:
        if r.finish_reason == "length":
            want = expected_reply(engine.runner.model, tuple(r.prompt_ids), r.max_new_tokens, True)
            assert r.output_ids == want, f"{about}{r.id}'s reply went wrong: {first_difference(want, r.output_ids)}"
    assert engine.cache.free_blocks == engine.cache.num_blocks, (
        f"after the run {engine.cache.num_blocks - engine.cache.free_blocks} KV blocks are still held: an "
        "aborted request's blocks were never freed (engine.cache.free(seat))"
    )


# --- the checks ----------------------------------------------------------------------------------
def check_queued(abort) -> None:
    """One seat: A runs; H, B and T wait in the queue (B in the middle); C has not arrived yet (arrival_step 40).
    Abort B and C: H and T keep their places."""
    engine = engine_for(slots=1)
    a, b, c = req("A", 6, 10), req("B", 5, 10, seed=1), req("C", 5, 10, arrival_step=40, seed=2)
    head, tail = req("H", 4, 6, seed=3), req("T", 7, 5, seed=4)
    for r in (a, head, b, tail, c):
        engine.submit(r)
    engine.step()
    engine.step()
    abort_and_check(abort, engine, b, "waiting in the queue, between H and T")
    queue = [r.id for r in engine.waiting]
    assert queue == ["H", "T"], (
        f"the queue was H, B, T; after aborting B it is {queue}: take B out (engine.waiting.remove), not the head"
    )
    abort_and_check(abort, engine, c, "not arrived yet (in engine.pending)")
    run_to_the_end(engine, [a, head, b, tail, c])
    for r in (b, c):
        assert r.admit_step is None and not r.output_ids, (
            f"{r.id} was aborted before it had a seat, yet it was admitted later (at step {r.admit_step}): take it "
            f"out of {'engine.waiting' if r is b else 'engine.pending (requests whose arrival is still to come)'}"
        )


def check_mid_reply(abort) -> None:
    """Two seats: A and B decode, D waits. Abort A mid-reply: its blocks come back, and D takes its seat."""
    engine = engine_for(slots=2)
    a, b, d = req("A", 9, 20), req("B", 6, 20, seed=1), req("D", 7, 12, seed=2)
    for r in (a, b, d):
        engine.submit(r)
    for _ in range(5):
        engine.step()
    seat, held, free = a.seat, engine.cache.blocks_held(a.seat), engine.cache.free_blocks
    abort_and_check(abort, engine, a, "mid-reply", reason="client hung up")
    assert engine.cache.free_blocks == free + held, (
        f"A held {held} KV blocks mid-reply; after abort {engine.cache.free_blocks - free} came back: free its "
        "blocks with engine.cache.free(seat)"
    )
    engine.step()
    assert d.seat == seat, f"the next step, D should take A's seat {seat}; D's seat is {d.seat}"
    run_to_the_end(engine, [a, b, d])


def check_mid_prompt(abort) -> None:
    """A token budget of 8 cuts A's 40-token prompt into chunks: abort it after the first one (no output yet)."""
    engine = engine_for(slots=2, token_budget=8)
    a, b = req("A", 40, 10), req("B", 6, 10, arrival_step=2, seed=1)
    for r in (a, b):
        engine.submit(r)
    engine.step()
    assert a.seat is not None and not a.output_ids and 0 < a.num_computed < 40  # (the check's own premise)
    abort_and_check(abort, engine, a, "mid-prompt (seated, no output yet)")
    assert engine.cache.free_blocks == engine.cache.num_blocks, (
        "A was seated with the first chunk of its prompt in the KV cache and no output yet; after abort its "
        "blocks are still held. A request with no output may be seated: look at engine.seats, not at its output"
    )
    run_to_the_end(engine, [a, b])


def check_finished_and_unknown(abort) -> None:
    """A finishes and B takes its seat; aborting A then must change nothing (B sits where A sat). Nor may aborting
    an unknown id, or a request the engine rejected."""
    engine = engine_for(slots=1)
    a, b = req("A", 5, 2), req("B", 6, 12, seed=1)
    for r in (a, b):
        engine.submit(r)
    while b.seat is None:
        engine.step()
    engine.step()
    held, reason = engine.cache.blocks_held(b.seat), a.finish_reason
    result = call(abort, engine, a, "after it finished")
    assert result is False, f"aborting A, which had already finished, returned {result!r}; return False"
    assert a.finish_reason == reason, f"A had finished ({reason}); your abort changed it to {a.finish_reason!r}"
    assert engine.seats[0] is b and engine.cache.blocks_held(0) == held, (
        "aborting A after it finished took B's seat or blocks: A still names seat 0, where B sits now. "
        "Leave finished requests alone"
    )
    result = call(abort, engine, "nobody", "an id nobody has")
    assert result is False, f"aborting an unknown id returned {result!r}; return False"
    refused = Request("refused", [257, 5], 0)  # max_new_tokens 0: rejected when submitted, never queued
    engine.submit(refused)
    reason = refused.finish_reason
    result = call(abort, engine, refused, "a request rejected when it was submitted")
    assert result is False and refused.finish_reason == reason and refused.state == State.REJECTED, (
        f"aborting a request the engine rejected (state {State.REJECTED!r}, finish_reason {reason!r}) returned "
        f"{result!r} and left it {refused.state!r}, {refused.finish_reason!r}: it has already finished "
        "(r.is_finished covers rejected requests too): return False and change nothing"
    )
    run_to_the_end(engine, [a, b])


def check_contiguous(abort) -> None:
    """The contiguous layout: a seat reserves a whole row and has no blocks or allocator; abort A mid-reply there."""
    engine = engine_for(slots=2, kv="contiguous")
    a, b, d, e = req("A", 9, 20), req("B", 6, 20, seed=1), req("D", 7, 12, seed=2), req("E", 5, 6, seed=3)
    for r in (a, b, d, e):
        engine.submit(r)
    for _ in range(5):
        engine.step()
    abort_and_check(abort, engine, e, "on the contiguous layout, queued")
    seat, situation = a.seat, "on the contiguous layout, mid-reply"
    abort_and_check(abort, engine, a, situation)
    held = engine.cache.seat_tokens(seat)
    assert held == 0, (
        f"{situation}: after aborting A its seat {seat} still holds {held} tokens. Free them with "
        "engine.cache.free(seat) on either layout (the contiguous cache holds no blocks, but it keeps each seat's "
        "tokens: the next request in that seat would start after A's)"
    )
    engine.step()
    assert d.seat == seat, f"{situation}: the next step, D should take A's seat {seat}; D's seat is {d.seat}"
    run_to_the_end(engine, [a, b, d, e], situation)


def check_id_used_again(abort) -> None:
    """A client may reuse an id once its first request finished: engine.requests then holds both."""
    engine = engine_for(slots=1)
    first = req("A", 5, 2)
    engine.submit(first)
    while not first.is_finished:
        engine.step()
    again = req("A", 6, 12, seed=1)
    engine.submit(again)
    for _ in range(3):
        engine.step()
    assert again.seat is not None and again.output_ids  # (the check's own premise: the second A is mid-reply)
    situation = "an id used again (a first 'A' finished, a second 'A' is mid-reply)"
    result = call(abort, engine, again, situation)
    assert result is True and again.finish_reason == "aborted", (
        f"{situation}: abort(engine, 'A') returned {result!r} and left the second A {again.state!r}, "
        f"{again.finish_reason!r}: engine.requests holds both; abort the one that has not finished"
    )
    assert first.finish_reason == "length", (
        f"{situation}: the first A had finished (length); your abort changed it to {first.finish_reason!r}"
    )
    assert again not in engine.seats and engine.cache.free_blocks == engine.cache.num_blocks, (
        f"{situation}: the second A still has its seat or KV blocks after the abort"
    )
    run_to_the_end(engine, [first, again], situation)


def check_arrival_due(abort) -> None:
    """A request joins engine.waiting at the start of the step its arrival is due in: until then it is pending."""
    engine = engine_for(slots=1)
    a, c = req("A", 6, 10), req("C", 5, 10, arrival_step=3, seed=2)
    for r in (a, c):
        engine.submit(r)
    now = req("N", 4, 6, seed=3)  # arrival_step 0, submitted after the engine's step 0 ran
    for _ in range(3):
        engine.step()
    engine.submit(now)
    assert c in engine.pending and now in engine.pending and engine.step_no == 3  # (the check's own premise)
    for r in (c, now):
        situation = (
            f"a request whose arrival is due but that has not joined the queue yet ({r.id}: arrival_step "
            f"{r.arrival_step}, engine.step_no 3; it is in engine.pending until the next step starts)"
        )
        abort_and_check(abort, engine, r, situation)
    run_to_the_end(engine, [a, c, now], "after aborting two requests still in engine.pending")
    for r in (c, now):
        assert r.admit_step is None and not r.output_ids, (
            f"{r.id} was aborted while its arrival was due, yet it was admitted later (at step {r.admit_step}): look "
            "for it in engine.pending, not by its arrival step"
        )


def check_preemption_after_an_abort(abort) -> None:
    """A tight pool: A and B grow until one of them is preempted, back to the front of the queue, after C (queued)
    was aborted."""
    engine = engine_for(slots=2, num_blocks=12)
    a, b, c = req("A", 6, 30), req("B", 6, 30, seed=1), req("C", 5, 8, seed=2)
    for r in (a, b, c):
        engine.submit(r)
    for _ in range(2):
        engine.step()
    situation = "a preemption after an abort from the queue"
    abort_and_check(abort, engine, c, f"{situation} (C, queued)")
    assert isinstance(engine.waiting, deque), (
        f"{situation}: after aborting C engine.waiting is a {type(engine.waiting).__name__}. It must stay a deque: "
        "the engine puts a preempted request back at its front with engine.waiting.appendleft(r); take a request "
        "out in place, engine.waiting.remove(r)"
    )
    run_to_the_end(engine, [a, b, c], situation)
    assert a.preemptions + b.preemptions > 0  # (the check's own premise: somebody was preempted)


def check_a_held_seat(abort) -> None:
    """Static batching holds a finished request's seat until its whole batch is done: A finished and sits there."""
    engine = engine_for(slots=2, policy=StaticScheduler)
    a, b, c = req("A", 5, 2), req("B", 6, 12, seed=1), req("C", 4, 5, seed=2)
    for r in (a, b, c):
        engine.submit(r)
    while not a.is_finished:
        engine.step()
    engine.step()
    seat = a.seat
    assert engine.seats[seat] is a  # (the check's own premise: the static policy holds A's seat)
    situation = f"a finished request whose seat the static policy still holds (A, seat {seat})"
    result = call(abort, engine, a, situation)
    assert result is False and a.finish_reason == "length" and engine.seats[seat] is a, (
        f"{situation}: abort(engine, 'A') returned {result!r}, left A's finish_reason {a.finish_reason!r} and its "
        f"seat holding {getattr(engine.seats[seat], 'id', None)!r}. A has finished: return False and change nothing "
        "(check r.is_finished first: a finished request may still sit in a seat)"
    )
    run_to_the_end(engine, [a, b, c], situation)


def check_in_the_serve_loop(abort) -> None:
    """The real serve loop, on its thread, calling your abort when a reader hangs up on a stream."""
    call(abort, engine_for(slots=1), "nobody", "an id nobody has")  # a stub fails here, not on the engine thread
    engine = engine_for(slots=4, num_blocks=40)
    engine.abort = lambda rid, reason="aborted": abort(engine, rid, reason)  # the loop calls engine.abort
    loop = ServeLoop(engine).start()
    requests = [req(f"r{i}", 4 + i % 7, 60 if i in (0, 3, 5) else 8 + i, seed=i) for i in range(10)]
    streams = {r.id: TokenStream() for r in requests}
    try:
        for r in requests:
            loop.submit(r, streams[r.id])
        ends = {}
        for rid in ("r0", "r3", "r5"):  # hang up after 3 tokens
            got = 0
            while got < 3:
                event = next_event(loop, streams[rid])
                got += len(event.tokens)
                if event.kind == "done":
                    ends[rid] = event.detail
                    break
            loop.abort(rid)
        for r in requests:
            while r.id not in ends:
                event = next_event(loop, streams[r.id])
                if event.kind == "done":
                    ends[r.id] = event.detail
        free = loop.ask(lambda e: (e.cache.free_blocks, e.cache.num_blocks, e.running())).result(10)
    finally:
        loop.stop()
    assert [ends[rid] for rid in ("r0", "r3", "r5")].count("aborted") >= 2, f"the hung-up requests ended {ends}"
    assert free[0] == free[1] and not free[2], f"after every stream ended: {free[1] - free[0]} KV blocks still held"
    for r in requests:
        if ends[r.id] != "aborted":
            want = expected_reply(engine.runner.model, tuple(r.prompt_ids), r.max_new_tokens, True)
            assert r.output_ids == want, f"{r.id}, served beside the aborts: {first_difference(want, r.output_ids)}"


def next_event(loop: ServeLoop, stream: TokenStream):
    try:
        event = stream.get(timeout=20)
    except queue.Empty:
        raise AssertionError(f"the serve loop stopped answering; its engine thread died of {loop.error!r}") from None
    if isinstance(loop.error, NotImplementedError):
        raise loop.error  # a part of your abort still to write, met on the engine thread
    if event.detail.startswith("error"):
        raise AssertionError(f"the serve loop's engine thread died: {event.detail}")
    return event


CHECK_ALL = (
    check_queued,
    check_mid_reply,
    check_mid_prompt,
    check_finished_and_unknown,
    check_contiguous,
    check_id_used_again,
    check_arrival_due,
    check_preemption_after_an_abort,
    check_a_held_seat,
    check_in_the_serve_loop,
)


def test_abort_a_queued_request_and_one_not_arrived_yet(abort):
    check_queued(abort)


def test_abort_mid_reply_frees_seat_and_blocks_for_the_next_step(abort):
    check_mid_reply(abort)


def test_abort_mid_prompt_frees_its_blocks(abort):
    check_mid_prompt(abort)


def test_aborting_a_finished_request_changes_nothing(abort):
    check_finished_and_unknown(abort)


def test_abort_on_the_contiguous_layout(abort):
    check_contiguous(abort)


def test_abort_the_request_that_reuses_a_finished_ones_id(abort):
    check_id_used_again(abort)


def test_abort_a_request_whose_arrival_is_due_but_not_yet_queued(abort):
    check_arrival_due(abort)


def test_a_preemption_after_an_abort_from_the_queue(abort):
    check_preemption_after_an_abort(abort)


def test_aborting_a_finished_request_in_a_held_seat_changes_nothing(abort):
    check_a_held_seat(abort)


def test_your_abort_in_the_serve_loop(abort):
    check_in_the_serve_loop(abort)


def test_your_abort_equals_the_reference_on_drawn_runs(abort):
    check_drawn_runs(abort)


# --- the checks catch plausible mistakes --------------------------------------------------------
def make_abort(
    free_kv="cache", free_seat=True, pending=True, by_output=False, finished_too=False, mark=True, ret=True,
    finished="is_finished", head=False, keep_reason=True, clock="engine", first_with_the_id=False, by_arrival=False,
    rebuild=None, forget=False, by_admission=False,
):  # fmt: skip
    """An abort written out, with switches for the mistakes below."""
    done = {
        "is_finished": lambda r: r.is_finished,
        "state": lambda r: r.state == State.FINISHED,  # a rejected request looks unfinished (wrong)
    }[finished]
    now = {"engine": lambda e: e.clock.now(), "epoch": lambda e: time.time(), "none": lambda e: None}[clock]

    def wrong_abort(engine, request_id, reason="aborted"):
        found = [r for r in engine.requests if r.id == request_id and (finished_too or not done(r))]
        if first_with_the_id:  # the first request with that id, finished or not (wrong when an id is used again)
            found = [r for r in engine.requests if r.id == request_id][:1]
            found = [r for r in found if finished_too or not done(r)]
        if not found:
            return False if ret else None
        r = found[0]
        queued = (not r.output_ids) if by_output else r.seat is None
        if by_admission:  # never admitted: queued; else seated (wrong: one preempted since is queued again)
            queued = r.admit_step is None
        if by_arrival and queued:  # where it is told by its arrival step (wrong: a due arrival is still pending)
            (engine.pending if r.arrival_step > engine.step_no else engine.waiting).remove(r)
        elif queued or r.is_finished:
            if r in engine.waiting and rebuild is not None:  # list: the engine's appendleft fails later (wrong)
                engine.waiting = rebuild(q for q in engine.waiting if q is not r)
            elif r in engine.waiting:
                engine.waiting.popleft() if head else engine.waiting.remove(r)  # head: the queue's first (wrong)
            elif pending and r in engine.pending:
                engine.pending.remove(r)
        if free_kv == "even-without-a-seat":  # (the paged cache lets free(None) pass, the contiguous one not: wrong)
            engine.cache.free(r.seat)
        if (not queued or r.is_finished) and r.seat is not None:
            if free_kv == "cache":
                engine.cache.free(r.seat)
            elif free_kv == "allocator":  # lesson 05's allocator: the contiguous cache has none (wrong)
                engine.cache.allocator.free(r.seat)
            elif free_kv == "if-it-holds-blocks" and engine.cache.blocks_held(r.seat):  # contiguous: 0 (wrong)
                engine.cache.free(r.seat)
            if free_seat == "remove":  # the seats list one shorter (wrong)
                engine.seats.remove(r)
            elif free_seat:
                engine.seats[r.seat] = None
        if forget:  # out of the record of everything submitted too (wrong)
            engine.requests.remove(r)
        if mark:
            r.state, r.finish_reason = State.FINISHED, reason if keep_reason else "aborted"
            r.finish_step, r.finish_s = engine.step_no, now(engine)
        return True if ret else None

    return wrong_abort


def abort_by_search(engine, request_id, reason="aborted", seated=lambda r: not r.is_finished):
    """Right, written differently: look in each place in turn, without engine.requests."""
    places = [("pending", r) for r in engine.pending] + [("waiting", r) for r in engine.waiting]
    places += [("seat", r) for r in engine.seats if r is not None and seated(r)]
    for place, r in places:
        if r.id != request_id:
            continue
        if place == "seat":
            engine.cache.free(r.seat)
            engine.seats[r.seat] = None
        else:
            getattr(engine, place).remove(r)
        r.state, r.finish_reason, r.finish_step, r.finish_s = State.FINISHED, reason, engine.step_no, engine.clock.now()
        return True
    return False


def abort_by_place(engine, request_id, reason="aborted"):
    """Wrong: whatever sits in a seat is taken for running, and a finished request for one in no place at all."""
    return abort_by_search(engine, request_id, reason, seated=lambda r: True)


def abort_through_live(engine, request_id, reason="aborted"):
    """Right, written differently: engine.live indexes the requests queued or running by id."""
    r = engine.live.pop(request_id, None)
    if r is None or r.is_finished:
        return False
    if r.seat is not None and engine.seats[r.seat] is r:
        engine.cache.free(r.seat)
        engine.seats[r.seat] = None
    else:
        queue = engine.pending if r in engine.pending else engine.waiting
        queue.remove(r)
    r.state, r.finish_reason = State.FINISHED, reason
    r.finish_step, r.finish_s = engine.step_no, engine.clock.now()
    return True


def abort_newest_first(engine, request_id, reason="aborted"):
    """Right, written differently: the newest request with the id, its place found by where it is listed."""
    r = next((r for r in reversed(engine.requests) if r.id == request_id), None)
    if r is None or r.is_finished:
        return False
    for place in (engine.pending, engine.waiting):
        if r in place:
            place.remove(r)
            break
    else:
        seat = engine.seats.index(r)
        engine.cache.free(seat)
        engine.seats[seat] = None
    r.state, r.finish_reason, r.finish_step, r.finish_s = State.FINISHED, reason, engine.step_no, engine.clock.now()
    return True


WRONG = {  # name: (the abort, words its first failure starts with; None: anywhere in it)
    "leaks-the-kv-blocks": (make_abort(free_kv=None), None),
    "keeps-the-seat": (make_abort(free_seat=False), None),
    "forgets-pending": (make_abort(pending=False), None),
    "no-output-means-queued": (make_abort(by_output=True), None),
    "aborts-finished-requests": (make_abort(finished_too=True), None),
    "forgets-to-mark-it-finished": (make_abort(mark=False), None),
    "returns-nothing": (make_abort(ret=False), None),
    "takes-the-head-of-the-queue": (make_abort(head=True), None),
    "always-the-default-reason": (make_abort(keep_reason=False), None),
    "aborts-a-rejected-request": (make_abort(finished="state"), None),
    "finish-time-from-time.time": (make_abort(clock="epoch"), None),
    "no-finish-time": (make_abort(clock="none"), None),
    # caught by a check that names the situation in its first line
    "frees-through-the-allocator": (make_abort(free_kv="allocator"), "on the contiguous layout"),
    "frees-the-cache-even-without-a-seat": (make_abort(free_kv="even-without-a-seat"), "on the contiguous layout"),
    "frees-only-a-seat-that-holds-blocks": (make_abort(free_kv="if-it-holds-blocks"), "on the contiguous layout"),
    "takes-the-first-request-with-the-id": (make_abort(first_with_the_id=True), "an id used again"),
    "tells-the-place-by-the-arrival-step": (make_abort(by_arrival=True), "a request whose arrival is due"),
    "rebuilds-the-queue-as-a-list": (make_abort(rebuild=list), "a preemption after an abort from the queue"),
    "a-seated-request-is-a-running-one": (abort_by_place, "a finished request whose seat the static policy"),
    "removes-the-seat-from-the-list": (make_abort(free_seat="remove"), "a side effect"),
    "takes-it-out-of-engine.requests": (make_abort(forget=True), "a side effect"),
    # right on every hand-built check (none aborts a request back in the queue after a preemption); the drawn runs
    # catch it
    "a-request-once-admitted-is-taken-for-seated": (make_abort(by_admission=True), "with these"),
}
DRAWN_ONLY = ["a-request-once-admitted-is-taken-for-seated"]  # only the drawn runs catch these
RIGHT = {
    "written-out": make_abort(),
    "searching-each-place": abort_by_search,
    "through-engine.live": abort_through_live,
    "newest-first-by-its-listing": abort_newest_first,
    "rebuilds-the-queue-as-a-deque": make_abort(rebuild=deque),
}


def check_drawn_runs(abort) -> None:
    check_drawn(abort, reference_abort)


def check_cases(abort) -> None:
    for check in CHECK_ALL:
        check(abort)


def check_all(abort) -> None:
    check_cases(abort)
    check_drawn_runs(abort)


@CHECKS
@pytest.mark.parametrize("right", RIGHT.values(), ids=RIGHT.keys())
def test_a_correct_version_passes(right):
    check_all(right)


@CHECKS
@pytest.mark.parametrize("name", WRONG)
def test_the_checks_catch_a_wrong_abort(name):
    wrong, situation = WRONG[name]
    with pytest.raises(AssertionError) as caught:
        check_all(wrong)
    if situation is not None:  # a student sees the first lines: the situation comes first
        assert str(caught.value).startswith(situation), str(caught.value)


@CHECKS
@pytest.mark.parametrize("name", DRAWN_ONLY)
def test_the_drawn_runs_catch_what_the_cases_miss(name):
    wrong, _ = WRONG[name]
    check_cases(wrong)  # every hand-built check passes it
    with pytest.raises(AssertionError, match="back from a preemption"):
        check_drawn_runs(wrong)


@CHECKS
def test_the_stub_is_rejected():
    with pytest.raises(NotImplementedError):
        check_all(stub)
