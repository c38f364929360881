"""Speculative decoding: the acceptance rule, the rollback of rejected guesses, and exactness everywhere.

Under greedy decoding every reply with speculation equals the plain no-cache loop's, token for token, for every k
from 1 to 8, both caches, both policies, with preemption, prefix caching and small token budgets; a rejected
guess's KV blocks go back to the pool at once (block boundaries included) and no block ever leaks.
"""

from __future__ import annotations

import functools
import json

import pytest
import torch

from minillm.config import EngineConfig, Sampling
from minillm.engine.blocks import BlockAllocator
from minillm.engine.generate import generate
from minillm.engine.request import Request
from minillm.engine.scheduler import ContinuousScheduler, StaticScheduler
from minillm.errors import ConfigError
from minillm.layers import LayeredEngine
from minillm.layers.drafters import ModelDrafter, lookup
from minillm.layers.speculate import accept, speculates
from minillm.runs import trace_file
from minillm.runs.metrics import summarize
from tests.conftest import random_model
from tests.lessons.harness import crowd


@functools.cache
def target():
    return random_model("gqa")


@functools.cache
def noisy():
    """The target with noise in its weights: a draft that is right part of the time."""
    model = random_model("gqa")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.5 * p.std())
    return model


@functools.cache
def expected(prompt: tuple[int, ...], max_new_tokens: int, ignore_eos: bool) -> list[int]:
    return generate(target(), list(prompt), max_new_tokens, use_cache=False, ignore_eos=ignore_eos).tokens


def serve(requests, scheduler=None, draft=None, **cfg) -> LayeredEngine:
    cfg = {"max_len": 256, "debug": True, "slots": 3} | cfg
    engine = LayeredEngine(target(), scheduler or ContinuousScheduler(), EngineConfig(**cfg), draft=draft)
    for r in requests:
        engine.submit(r)
    engine.run(max_steps=3000)
    return engine


def assert_exact_and_nothing_leaked(engine: LayeredEngine, requests: list[Request]) -> None:
    for r in requests:
        assert r.output_ids == expected(tuple(r.prompt_ids), r.max_new_tokens, r.ignore_eos), r.id
    if engine.cfg.kv == "paged":
        alloc = engine.cache.allocator
        assert alloc.num_free == alloc.num_blocks and not alloc.tables, "KV blocks leaked"


# --- the rule ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "draft, picks, gained",
    [
        ([], [7], [7]),  # no guesses: the model's own token
        ([1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 4]),  # all right: the model's token after the last one, free
        ([1, 2, 3], [1, 5, 3, 4], [1, 5]),  # the second is wrong: stop there, take the model's pick instead
        ([9, 2, 3], [1, 2, 3, 4], [1]),  # the first is wrong: one token, as without speculation
        ([1, 2, 3], [1, 2, 9, 4], [1, 2, 9]),  # a later guess that happens to match after a miss is not kept
    ],
)
def test_greedy_acceptance_keeps_guesses_up_to_the_first_miss_then_the_models_own_token(draft, picks, gained):
    assert accept(draft, picks) == gained


def test_prompt_lookup_continues_from_the_latest_earlier_occurrence():
    assert lookup([1, 2, 3, 9, 1, 2, 3, 7, 1, 2], 3) == [3, 7, 1]  # "1 2" last seen before "3 7 1"
    assert lookup([5, 6, 7, 8, 6, 7], 2) == [8, 6]  # the longest suffix that occurs earlier: "6 7"
    assert lookup([1, 2, 3], 4) == []  # the last token never occurred before: no guess
    assert lookup([4, 4, 4], 5) == [4]  # as much as there is


def test_decoding_requests_guess_unless_they_ask_for_logprobs():
    r = Request("a", [1, 2, 3], 5)
    r.num_computed, r.output_ids = 3, [4]
    assert r.is_decoding and speculates(r)
    r.sampling = Sampling(temperature=0.8, seed=1)
    assert speculates(r), "a sampled request speculates: the rejection rule keeps its distribution"
    r.sampling = Sampling(logprobs=2)
    assert not speculates(r), "logprobs are recorded per token picked: a verify row picks after rejected guesses"


def test_sampled_requests_speculate_beside_greedy_ones_and_their_seeds_reproduce_them():
    """Greedy and sampled users in one batch with speculation on: the greedy replies are the plain loop's; the
    sampled one speculates too (the rejection rule), and its seed gives the same reply again, alone or in the crowd;
    logprobs one per token, never speculated."""

    def crowd_():
        return [Request("g0", [257, 5, 6], 16, ignore_eos=True), Request("g1", [257, 7, 8, 9], 12, ignore_eos=True),
                Request("s0", [257, 5, 6], 16, ignore_eos=True, sampling=Sampling(temperature=0.9, seed=3)),
                Request("p0", [257, 4], 10, ignore_eos=True, sampling=Sampling(logprobs=2))]  # fmt: skip

    plain, guessed, again = crowd_(), crowd_(), crowd_()
    serve(plain, slots=4)
    engine = serve(guessed, draft=noisy(), speculate=4, slots=4)
    serve(again[2:3], draft=noisy(), speculate=4, slots=1)  # the sampled user alone
    for a, b in zip(plain, guessed):
        if a.id != "s0":
            assert a.output_ids == b.output_ids, a.id
    assert again[2].output_ids == guessed[2].output_ids and len(guessed[2].output_ids) == 16
    assert len(engine.sampler.logprobs[guessed[3].id]) == len(guessed[3].output_ids)
    verified = {r.id: engine.trace().request(r.id).drafts_verified for r in guessed}
    assert verified["g0"] and verified["s0"] and not verified["p0"]
    assert_exact_and_nothing_leaked(engine, guessed[:2])


# --- rollback -----------------------------------------------------------------------------------------
def test_truncate_frees_the_blocks_past_the_kept_tokens_at_once():
    alloc = BlockAllocator(num_blocks=8, block_size=4)
    alloc.allocate(0, 6)  # blocks for tokens 0..5
    alloc.append(0, 5)  # a verify row: tokens 6..10, into a third block
    assert len(alloc.tables[0]) == 3 and alloc.num_free == 5
    alloc.truncate(0, 8)  # tokens 8..10 rejected: the third block holds none of the kept ones
    assert alloc.lengths[0] == 8 and len(alloc.tables[0]) == 2 and alloc.num_free == 6
    alloc.truncate(0, 7)  # a cut inside a block keeps the block
    assert len(alloc.tables[0]) == 2 and alloc.num_free == 6
    alloc.check()
    alloc.append(0, 2)  # the next tokens overwrite the rejected slots of the partly filled block
    alloc.check()
    with pytest.raises(ValueError, match="cannot keep"):
        alloc.truncate(0, 10)  # more than it holds


def test_truncate_never_cuts_into_a_keyed_block():
    alloc = BlockAllocator(num_blocks=8, block_size=4, prefix_caching=True)
    alloc.allocate(0, 9)
    alloc.cache_full_blocks(0, list(range(8)))  # two full blocks get keys: someone's cached prefix
    alloc.truncate(0, 8)
    with pytest.raises(ValueError, match="keyed"):
        alloc.truncate(0, 7)
    alloc.check()


@pytest.mark.parametrize("kv", ["paged", "contiguous"])
def test_rejected_guesses_across_a_block_boundary_leave_no_block_behind(kv):
    """Block size 4, a stranger's guesses (all wrong): every verify row reaches into the next block and is cut."""
    requests = [Request(f"r{i}", [257, 10 + i, 20, 30], 24, ignore_eos=True) for i in range(3)]
    engine = LayeredEngine(target(), ContinuousScheduler(), EngineConfig(slots=3, kv=kv, block_size=4, max_len=256,
                    debug=True, speculate=6), draft=random_model("mqa", seed=1))  # fmt: skip
    for r in requests:
        engine.submit(r)
    crossed = 0
    while engine.has_work():
        before = {r.id: r.num_computed for r in engine.running()}
        record = engine.step()
        for r in engine.running():  # the cache holds exactly the kept tokens: no rejected guess, no spare block
            assert engine.cache.seat_tokens(r.seat) == r.num_computed
            if kv == "paged":
                assert len(engine.cache.allocator.tables[r.seat]) == -(-r.num_computed // 4)
        for rid, draft in record.drafts.items():  # a verify row that reached into a block its kept tokens do not
            start = before[rid]
            crossed += (start + len(draft)) // 4 > (start + record.accepted[rid]) // 4
    assert crossed > 3, "the test meant to cut guesses across block boundaries"
    assert_exact_and_nothing_leaked(engine, requests)


def test_the_draft_models_cache_goes_with_the_request():
    """A draft cache row belongs to one admission: a newcomer in the seat, or a preempted request back, starts over;
    after each step it holds no more than the reply's tokens but the last."""
    requests = crowd(8)
    engine = LayeredEngine(target(), ContinuousScheduler(token_budget=8), EngineConfig(slots=2, max_len=256, debug=True,
                    speculate=3, num_blocks=13, block_size=4), draft=noisy())  # fmt: skip
    drafter = engine.speculation.drafter
    assert isinstance(drafter, ModelDrafter)
    for r in requests:
        engine.submit(r)
    while engine.has_work():
        engine.step()
        for r in engine.running():
            if drafter.holder[r.seat] == r.admit_order:
                assert drafter.cache.lengths[r.seat] <= r.num_tokens - 1
    assert sum(r.preemptions for r in requests), "the pool was meant to be tight enough to preempt"
    assert_exact_and_nothing_leaked(engine, requests)


# --- exactness everywhere -----------------------------------------------------------------------------
@pytest.mark.parametrize("k", range(1, 9))
@pytest.mark.parametrize("kv", ["paged", "contiguous"])
def test_every_k_gives_the_plain_loops_replies(k, kv):
    requests = crowd(6, seed=k)
    engine = serve(requests, draft=noisy(), kv=kv, speculate=k, block_size=4)
    assert_exact_and_nothing_leaked(engine, requests)
    assert summarize(engine.trace())["drafts_verified"] > 0


@pytest.mark.parametrize("budget", [1, 2, 7, 0])
@pytest.mark.parametrize("policy", [StaticScheduler, ContinuousScheduler])
def test_small_budgets_preemption_and_prefix_caching(budget, policy):
    """A verify row counts k + 1 tokens against the budget: under a small one it is cut (a partial check, or a
    plain decode row); shared prompts, a pool tight enough to preempt."""
    stem = [257, 3, 1, 4, 1, 5, 9, 2, 6]
    requests = [Request(f"s{i}", stem + [i, 7 * i % 256], 10 + 3 * i, ignore_eos=i % 2 == 0) for i in range(6)]
    engine = serve(requests, policy(token_budget=budget), draft=noisy(), speculate=4, block_size=4, num_blocks=14,
                   prefix_caching=True)  # fmt: skip
    trace = engine.trace()
    assert_exact_and_nothing_leaked(engine, requests)
    assert all(s.computed_tokens <= budget for s in trace.steps) or not budget
    assert engine.cache.allocator.events["shared_writes"] == 0


def test_a_perfect_draft_makes_k_plus_one_tokens_a_step_and_prompt_lookup_runs_without_a_model():
    requests = [Request("a", [257, 1, 2, 3], 30, ignore_eos=True)]
    engine = serve(requests, draft=target(), speculate=4, slots=1)
    assert_exact_and_nothing_leaked(engine, requests)
    made = [entry[4] for s in engine.trace().steps for entry in s.seats if entry[2] == "decode"]
    record = engine.trace().request("a")
    assert max(made) == 5 and record.drafts_accepted == record.drafts_verified  # (no ties here)
    requests = [Request("b", [257, 1, 2, 1, 2, 1, 2], 20, ignore_eos=True)]
    engine = serve(requests, speculate=3, drafter="ngram", slots=1)
    assert_exact_and_nothing_leaked(engine, requests)
    assert engine.speculation.drafter.name == "ngram"


def test_speculation_on_a_simulated_card_is_refused_with_the_reason():
    from minillm.card.hardware import get_device
    from minillm.card.modelspec import load_spec
    from minillm.card.simulate import SimulatedRunner

    runner = SimulatedRunner(load_spec("llama-3.1-8b"), get_device("rtx-4090"))
    with pytest.raises(ConfigError, match="simulated card"):
        LayeredEngine(runner, ContinuousScheduler(), EngineConfig(speculate=2))
    with pytest.raises(ConfigError, match="speculate"):
        EngineConfig(speculate=-1)
    with pytest.raises(ConfigError, match="drafter"):
        EngineConfig(speculate=2, drafter="oracle")


# --- the trace ----------------------------------------------------------------------------------------
def test_the_trace_records_each_rows_guesses_and_reads_back(tmp_path):
    requests = crowd(4)
    engine = serve(requests, draft=noisy(), speculate=3)
    trace = engine.trace()
    steps = [s for s in trace.steps if s.drafts]
    assert steps and trace.config["speculate"] == 3 and trace.config["drafter"] == "model"
    for s in steps:
        made = {rid: produced for _, rid, _, _, produced in s.seats}
        for rid, draft in s.drafts.items():
            assert 0 <= s.accepted[rid] <= len(draft) <= 3
            assert made[rid] <= s.accepted[rid] + 1  # (fewer when the reply ended in between)
    assert sum(s.tokens for s in trace.steps) == sum(len(r.output_ids) + (r.finish_reason == "eos") for r in requests)
    path = tmp_path / "t.json"
    trace.save(path)
    data = json.loads(path.read_text())
    assert data["version"] == 3
    again = trace_file.load(path)
    assert [s.drafts for s in again.steps] == [s.drafts for s in trace.steps]
    assert summarize(again)["drafts_accepted"] == sum(trace.request(r.id).drafts_accepted for r in requests)
    old = data | {"version": 2, "steps": [{k: v for k, v in s.items() if k not in ("drafts", "accepted")}
                                         for s in data["steps"]]}  # fmt: skip
    assert trace_file.from_dict(old).steps[0].drafts == {}
    data["steps"][steps[0].step]["accepted"] = {next(iter(steps[0].drafts)): 9}
    with pytest.raises(trace_file.TraceError, match="more draft tokens than it checked"):
        trace_file.from_dict(data)
