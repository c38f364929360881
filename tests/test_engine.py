"""One engine, two policies, two KV layouts: token-exact, nothing lost, each policy's invariant holds."""

import pytest

from minillm.config import EngineConfig
from minillm.engine.blocks import BlockAllocator
from minillm.engine.generate import generate
from minillm.engine.request import Request
from minillm.engine.scheduler import ContinuousScheduler, PlanError, StaticScheduler
from minillm.errors import InputError
from minillm.layers import LayeredEngine
from tests.conftest import random_model
from tests.lessons.harness import crowd  # the same mixed crowd the lesson checks use

COMBOS = [(s, kv) for s in (StaticScheduler, ContinuousScheduler) for kv in ("contiguous", "paged")]


def serve(model, scheduler_cls, kv, requests, **cfg):
    cfg = EngineConfig(kv=kv, max_len=256, debug=True, **cfg)  # books every step
    engine = LayeredEngine(model, scheduler_cls(), cfg)
    for r in requests:
        engine.submit(r)
    return engine, engine.run(max_steps=2000)


def assert_token_exact(model, requests):
    for r in requests:
        expected = generate(model, r.prompt_ids, r.max_new_tokens, use_cache=False, ignore_eos=r.ignore_eos).tokens
        assert r.output_ids == expected, f"{r.id} differs from its own no-cache generation"


@pytest.mark.parametrize("scheduler_cls,kv", COMBOS)
def test_every_output_equals_its_single_request_no_cache_generation(scheduler_cls, kv):
    model = random_model("gqa")
    requests = crowd()
    engine, trace = serve(model, scheduler_cls, kv, requests, slots=3, block_size=4)
    assert_token_exact(model, requests)
    assert all(r.finish_reason == "length" for r in requests)
    assert engine.cache.free_blocks == engine.cache.num_blocks  # nothing leaked
    assert engine.cache.stored_tokens == 0


@pytest.mark.parametrize("scheduler_cls", [StaticScheduler, ContinuousScheduler])
def test_a_tiny_pool_forces_preemption_and_stays_token_exact(scheduler_cls):
    model = random_model("mqa")
    requests = crowd(12, seed=1)
    engine, trace = serve(model, scheduler_cls, "paged", requests, slots=4, block_size=4, num_blocks=14)
    assert sum(r.preemptions for r in requests) > 0, "the pool was meant to be too small"
    assert sum(len(s.preempted) for s in trace.steps) == sum(r.preemptions for r in requests)
    assert_token_exact(model, requests)
    assert engine.cache.allocator.num_free == 14
    engine.cache.allocator.check()


def test_requests_that_can_never_fit_are_rejected_and_the_rest_complete():
    model = random_model("gqa")
    too_long = Request("too-long", [257] * 250, max_new_tokens=10)  # past the 256-token context
    too_big = Request("too-big", [257] * 30, max_new_tokens=40)  # 69 tokens > 16 blocks of 4
    empty = Request("empty", [], max_new_tokens=5)
    zero = Request("zero", [257, 1], max_new_tokens=0)
    requests = crowd(6) + [too_long, too_big, empty, zero]
    engine, trace = serve(model, ContinuousScheduler, "paged", requests, slots=3, block_size=4, num_blocks=16)
    assert "exceeds the context" in too_long.finish_reason
    assert "KV blocks but the whole pool has 16" in too_big.finish_reason
    assert "empty prompt" in empty.finish_reason and "at least 1" in zero.finish_reason
    finished = [r for r in requests if r.finish_reason in ("eos", "length")]
    rejected = [r for r in requests if r.finish_reason.startswith("rejected")]
    assert len(finished) == 6 and len(finished) + len(rejected) == len(requests)
    assert_token_exact(model, requests[:6])
    assert all(r.id not in s.waiting for s in trace.steps for r in rejected)


@pytest.mark.parametrize("kv", ["contiguous", "paged"])
def test_continuous_never_leaves_a_seat_empty_while_a_request_that_fits_waits(kv):
    model = random_model("gqa")
    requests = crowd(14, seed=2)
    engine, trace = serve(model, ContinuousScheduler, kv, requests, slots=3, block_size=4, num_blocks=40)
    by_id = {r.id: r for r in requests}
    for s in trace.steps:
        if None in s.slots and s.waiting:
            head = by_id[s.waiting[0]]
            need = BlockAllocator(1, trace.config["block_size"]).blocks_for(len(head.prompt_ids))
            free = s.kv_blocks_total - s.kv_blocks_used
            assert kv == "paged" and need > free, f"step {s.step}: a seat idles while {head.id} could fit"


@pytest.mark.parametrize("kv", ["contiguous", "paged"])
def test_static_lets_nobody_join_until_the_whole_batch_has_finished(kv):
    model = random_model("gqa")
    requests = crowd(10)
    engine, trace = serve(model, StaticScheduler, kv, requests, slots=3, block_size=4)
    by_id = {r.id: r for r in requests}
    batch: set[str] = set()
    for s in trace.steps:
        if s.admitted:
            assert all(by_id[i].finish_step < s.step for i in batch), f"step {s.step}: joined a running batch"
            batch = set(s.admitted)
        held = [slot for slot in s.slots if slot and slot["state"] == "held"]
        assert all(slot["id"] in batch for slot in held)
    assert any(slot and slot["state"] == "held" for s in trace.steps for slot in s.slots)


@pytest.mark.parametrize("scheduler_cls,kv", COMBOS)
def test_the_kv_record_agrees_with_the_seats_at_every_step(scheduler_cls, kv):
    """A step's record shows the KV memory its forward ran on: every seat that ran tokens holds blocks, a request
    writing its last token included (once, static batching's last straggler showed 0 blocks in use beside it);
    a held seat holds none; the count in use is the blocks on the map."""
    model = random_model("gqa")
    requests = crowd(12, seed=1)
    engine, trace = serve(
        model, scheduler_cls, kv, requests, slots=3, block_size=4, num_blocks=14 if kv == "paged" else None
    )
    last_step = {r.id: r.finish_step for r in requests}
    for s in trace.steps:
        working = {rid for _, rid, state, _, _ in s.seats if state in ("prefill", "decode")}
        held = {rid for _, rid, state, _, _ in s.seats if state == "held"}
        assert working <= set(s.kv_tables), f"step {s.step}: {working - set(s.kv_tables)} ran with no KV on the map"
        assert all(s.kv_tables[rid] and s.kv_tokens[rid] > 0 for rid in working), f"step {s.step}: an empty table"
        assert not held & set(s.kv_tables), f"step {s.step}: a held seat still holds KV"
        assert s.kv_blocks_used == len({b for blocks in s.kv_tables.values() for b in blocks})
        assert s.kv_tokens_stored == sum(s.kv_tokens.values())
        for rid in s.finished:  # its last step: every token but the last one written is in the cache
            r = next(r for r in requests if r.id == rid)
            assert last_step[rid] == s.step and s.kv_tokens[rid] == len(r.prompt_ids) + len(r.output_ids) - 1
    assert engine.cache.free_blocks == engine.cache.num_blocks and engine.cache.stored_tokens == 0  # then freed


def test_engine_rejects_a_plan_that_admits_a_request_twice():
    class Greedy(ContinuousScheduler):
        def schedule(self, waiting, seats, kv):
            plan = super().schedule(waiting, seats, kv)
            plan.admit = plan.admit + plan.admit[:1]
            return plan

    model = random_model("gqa")
    engine = LayeredEngine(model, Greedy(), EngineConfig(slots=4, max_len=256))
    engine.submit(Request("a", [257, 1], 3))
    with pytest.raises(PlanError, match="admitted the same request twice"):
        engine.run()


def test_a_second_submit_of_a_live_id_is_refused_and_the_others_are_served():
    model = random_model("gqa")
    engine = LayeredEngine(model, ContinuousScheduler(), EngineConfig(slots=2, max_len=256, block_size=4, debug=True))
    first, other = Request("a", [257, 1, 2], 4, ignore_eos=True), Request("b", [257, 3], 3, ignore_eos=True)
    assert engine.submit(first) and engine.submit(other)
    engine.step()
    with pytest.raises(InputError, match="request id 'a' is already queued or running: give each request its own id"):
        engine.submit(Request("a", [257, 9], 2))
    engine.run()
    assert [r.id for r in engine.requests] == ["a", "b"], "the refused request must not be recorded"
    assert_token_exact(model, [first, other])
    again = Request("a", [257, 5], 2, ignore_eos=True)  # an id may come back once its request has finished
    assert engine.submit(again) and engine.run() and again.finish_reason == "length"


def test_debug_mode_checks_the_allocator_every_step(monkeypatch):
    model = random_model("gqa")
    monkeypatch.delenv("MINILLM_DEBUG", raising=False)
    assert not EngineConfig().debug
    monkeypatch.setenv("MINILLM_DEBUG", "1")
    assert EngineConfig().debug, "MINILLM_DEBUG=1 turns the debug mode on"
    for debug in (False, True):
        cfg = EngineConfig(slots=2, max_len=256, block_size=4, debug=debug)
        engine = LayeredEngine(model, ContinuousScheduler(), cfg)
        engine.submit(Request("a", [257] * 9, 4))
        engine.step()
        engine.cache.allocator.ref_counts[0] += 1  # the books broken between two steps
        if debug:
            with pytest.raises(AssertionError, match="ref count"):
                engine.step()
        else:
            engine.step()  # unchecked: nobody notices
