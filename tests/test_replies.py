"""n replies to one prompt (layers/replies.py): each reply is its lone seeded twin, the prompt runs once, its blocks
are shared by reference count, and the books stay exact when replies end, are aborted or are preempted."""

from __future__ import annotations

import random

import pytest

from minillm.config import EngineConfig, Sampling
from minillm.engine.request import Request
from minillm.engine.scheduler import ContinuousScheduler
from minillm.errors import InputError
from minillm.layers import LayeredEngine, generate
from minillm.layers.replies import MAX_REPLIES
from tests.conftest import random_model

MODEL = random_model("gqa")  # (a context of 256)


def prompt_of(length: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(length)]


def engine(token_budget: int | None = None, **how) -> LayeredEngine:
    cfg = EngineConfig(**{"slots": 8, "max_len": 256, "debug": True} | how)
    return LayeredEngine(MODEL, ContinuousScheduler(token_budget=token_budget), cfg)


def twin(prompt: list[int], tokens: int, temperature: float, seed: int | None) -> list[int]:
    """The reply the same request gets sent alone with that seed: the one-user loop, no cache."""
    return generate(MODEL, prompt, tokens, temperature=temperature, seed=seed, use_cache=False, ignore_eos=True).tokens


@pytest.mark.parametrize("kv", ["paged", "contiguous"])
@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_each_reply_is_its_lone_seeded_twin_and_the_prompt_runs_once(kv, temperature):
    prompt, n, seed = prompt_of(101), 5, 7 if temperature else None
    e = engine(kv=kv)
    first = Request("a", prompt, 12, ignore_eos=True, sampling=Sampling(temperature=temperature, seed=seed))
    replies = e.submit_replies(first, n)
    e.run()
    assert [r.id for r in replies] == ["a", "a#1", "a#2", "a#3", "a#4"]
    for i, r in enumerate(replies):
        assert r.output_ids == twin(prompt, 12, temperature, None if seed is None else seed + i), f"reply {i}"
    if temperature:
        assert len({tuple(r.output_ids) for r in replies}) > 1, "the replies drew from one stream"
    # the prompt ran once; each other reply ran only its last token (its own pick needs its own logits)
    assert [r.prefill_tokens for r in replies] == [len(prompt)] + [1] * (n - 1)
    if kv == "paged":
        assert e.cache.allocator.num_free == e.cache.num_blocks


def peak_blocks(e: LayeredEngine) -> int:
    return max(s.kv_blocks_used for s in e.records)


def test_eight_replies_hold_a_quarter_of_the_blocks_of_eight_requests():
    prompt = prompt_of(200)
    shared, apart = engine(), engine()  # (no prefix caching on either side)
    shared.submit_replies(Request("a", prompt, 16, ignore_eos=True), 8)
    for i in range(8):
        apart.submit(Request(f"a{i}", prompt, 16, ignore_eos=True))
    shared.run(), apart.run()
    computed = lambda e: sum(r.prefill_tokens for r in e.requests)
    assert computed(shared) == 200 + 7 and computed(apart) == 8 * 200
    assert peak_blocks(shared) * 4 <= peak_blocks(apart), (peak_blocks(shared), peak_blocks(apart))
    assert [r.output_ids for r in shared.requests] == [r.output_ids for r in apart.requests]


@pytest.mark.parametrize("length", [16, 33])  # the prompt's last token opens a block, or sits in a shared one
def test_chunked_prompts_and_prefix_cache_hits_share_too(length):
    """The first reply's prompt in chunks of the token budget, a sibling that finds a cached prefix first: it takes
    those blocks from the cache, the rest from the first reply."""
    prompt = prompt_of(length, seed=3)
    e = engine(token_budget=5, prefix_caching=True, block_size=8)
    e.submit(Request("earlier", prompt[:17], 2, ignore_eos=True))
    e.run()
    replies = e.submit_replies(Request("b", prompt, 9, ignore_eos=True), 3)
    e.run()
    assert all(r.output_ids == twin(prompt, 9, 0.0, None) for r in replies)
    assert sum(r.prefill_tokens for r in replies[1:]) <= 2 * (8 + 1)  # (at most a block's tail and the last token)


def test_a_first_reply_that_ends_at_once_leaves_its_siblings_to_run_alone():
    prompt = prompt_of(40)
    e = engine()
    replies = e.submit_replies(Request("a", prompt, 1, ignore_eos=True, sampling=Sampling(1.0, seed=3)), 3)
    e.run()
    assert [r.prefill_tokens for r in replies] == [40, 40, 40]  # (its blocks were gone when they were seated)
    assert [r.output_ids for r in replies] == [twin(prompt, 1, 1.0, 3 + i) for i in range(3)]


def test_aborted_and_preempted_replies_keep_the_books():
    prompt = prompt_of(60)
    e = engine(slots=4, num_blocks=18, block_size=8)  # (too few blocks for four replies of 60 + 20: preemption)
    replies = e.submit_replies(Request("a", prompt, 20, ignore_eos=True), 5)
    assert e.abort("a#4") and replies[4].finish_reason == "aborted" and not e.abort("a#4")  # (never went in)
    e.run()
    assert sum(r.preemptions for r in replies) > 0, "the pool was meant to run short"
    assert all(r.output_ids == twin(prompt, 20, 0.0, None) for r in replies[:4])
    assert e.cache.allocator.num_free == 18 and not e.cache.allocator.tables


def test_a_refused_prompt_refuses_every_reply_and_n_is_checked():
    e = engine()
    replies = e.submit_replies(Request("long", prompt_of(250), 10), 3)  # (250 + 10 > the context of 256)
    assert [r.state.value for r in replies] == ["rejected"] * 3
    assert len({r.finish_reason for r in replies}) == 1 and "context" in replies[0].finish_reason
    for n in (0, MAX_REPLIES + 1, True, 2.0):
        with pytest.raises(InputError, match="n must be a whole number"):
            e.submit_replies(Request(f"n{n}", [1, 2, 3], 2), n)
    e.submit_replies(Request("c", [1, 2, 3], 2), 2)
    with pytest.raises(InputError, match="already queued"):
        e.submit_replies(Request("c#1", [1, 2, 3], 2), 1)
