"""Tensor parallelism at tp = 2 (two processes over gloo): every engine feature gives the replies one device gives.

One sharded runner serves every test of this module (a worker process starts once). Replies are compared token for
token with the plain no-cache loop on one device; a sum of two shards rounds differently from one matmul, so a
reply may part from it only where the loop's two best logits are within TIE of each other (a near-tie that the
rounding can break either way), and the test prints that margin. The fuzz test's random workloads (policies,
layouts, budgets, prefix caching, preemption, aborts, speculation) run through the same runner.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from minillm.config import EngineConfig, Sampling
from minillm.engine.request import Request
from minillm.engine.scheduler import ContinuousScheduler, StaticScheduler
from minillm.errors import ConfigError
from minillm.grammar import compile_regex
from minillm.layers import LayeredEngine, generate
from minillm.model.tokenizer import EOS
from minillm.parallel.shard import check_tp, shard_view
from tests.conftest import SMALL_CONFIGS, random_model
from tests.lessons.harness import crowd
from tests.test_engine_fuzz import run_workload

TIE = 1e-4  # logits within this of each other: either token is a right answer (fp32 sums differ by about 1e-6)


@pytest.fixture(scope="module")
def runner():
    from minillm.parallel.runner import ShardedRunner

    sharded = ShardedRunner(random_model("gqa"), 2)  # the fuzz test's model: 4 query heads, 2 key/value heads
    try:
        yield sharded
    finally:
        sharded.close()


def reference(r: Request) -> list[int]:
    s = r.sampling
    return generate(random_model("gqa"), r.prompt_ids, r.max_new_tokens, temperature=s.temperature, top_k=s.top_k,
                    top_p=s.top_p, seed=s.seed, use_cache=False, ignore_eos=r.ignore_eos,
                    constraint=s.constraint).tokens  # fmt: skip


@torch.no_grad()
def margin(prompt: list[int], reply: list[int], ignore_eos: bool) -> float:
    """The plain loop's top-2 logit margin after prompt + reply (one device)."""
    logits = random_model("gqa")(torch.tensor([prompt + reply]), last_only=True)[0, -1]
    if ignore_eos:
        logits[EOS] = -math.inf
    first, second = logits.topk(2).values.tolist()
    return first - second


def assert_same_or_near_tie(requests: list[Request]) -> None:
    for r in requests:
        expected = reference(r)
        if r.output_ids != expected:
            at = next(i for i, (a, b) in enumerate(zip(r.output_ids + [None], expected + [None])) if a != b)
            gap = margin(r.prompt_ids, expected[:at], r.ignore_eos)
            print(f"\n  {r.id}: parts from one device at token {at}, where the top-2 margin is {gap:.2e}")
            assert gap < TIE, f"{r.id} differs at token {at} and the margin there is {gap:.3g}: a wrong shard"


def serve(runner, requests, scheduler=None, draft=None, **cfg) -> LayeredEngine:
    cfg = EngineConfig(**({"max_len": 256, "debug": True} | cfg))
    engine = LayeredEngine(runner, scheduler or ContinuousScheduler(), cfg, draft=draft)
    for r in requests:
        engine.submit(r)
    engine.run(max_steps=3000)
    if engine.cfg.kv == "paged":
        assert engine.cache.allocator.num_free == engine.cache.allocator.num_blocks, "KV blocks leaked"
    return engine


FEATURES = {
    "paged continuous": {},
    "contiguous": {"kv": "contiguous"},
    "static": {"scheduler": StaticScheduler()},
    "token budget 1": {"scheduler": ContinuousScheduler(token_budget=1)},
    "chunked prefill": {"scheduler": ContinuousScheduler(token_budget=5)},
    "prefix caching": {"prefix_caching": True, "block_size": 4},
    "preemption": {"block_size": 4, "num_blocks": 14, "slots": 4},
    "speculation": {"speculate": 3, "drafter": "ngram"},
}


@pytest.mark.parametrize("feature", FEATURES)
def test_every_feature_gives_one_devices_replies(runner, feature):
    how = {"slots": 3} | FEATURES[feature]
    requests = crowd(8)
    shared = [257] + list(range(30, 45))  # a prompt of 4 whole blocks, and the same with one token more, later
    requests += [Request("shared-a", shared, 6, ignore_eos=True),
                 Request("shared-b", shared + [9], 6, arrival_step=12, ignore_eos=True)]  # fmt: skip
    engine = serve(runner, requests, how.pop("scheduler", None), **how)
    assert_same_or_near_tie(requests)
    if feature == "preemption":
        assert sum(r.preemptions for r in requests), "the pool must run short for this case"
    if feature == "speculation":
        assert sum(r.drafts_verified for r in engine.trace().requests)
    if feature == "prefix caching":
        assert engine.trace().config["prefix_cache_events"]["hit_blocks"] > 0


def test_sampling_constraints_and_aborts_at_tp_2(runner):
    sampled = [Request(f"s{i}", [257, 5 + i, 6], 12, ignore_eos=True, sampling=Sampling(temperature=1.0, seed=i))
               for i in range(3)]  # fmt: skip
    held = [
        Request(f"c{i}", [257, 70 + i], 30, sampling=Sampling(constraint=compile_regex(r"[0-9]{2,4}")))
        for i in range(2)
    ]
    doomed = Request("doomed", [257, 1, 2, 3], 40, ignore_eos=True)
    engine = LayeredEngine(runner, ContinuousScheduler(), EngineConfig(max_len=256, slots=4, debug=True))
    for r in sampled + held + [doomed]:
        engine.submit(r)
    for _ in range(4):
        engine.step()
    assert engine.abort("doomed") and doomed.finish_reason == "aborted"
    engine.run()
    assert_same_or_near_tie(sampled + held)  # (seeded draws from near-equal logits: the same tokens)
    assert engine.cache.allocator.num_free == engine.cache.allocator.num_blocks


def test_the_fuzz_tests_random_workloads_at_tp_2(runner):
    counts: Counter = Counter(ties=0)
    for seed in range(12):
        try:
            run_workload(seed, counts, runner=runner, tie=TIE)
        except AssertionError as e:
            raise AssertionError(f"workload seed {seed} at tp=2: {e}") from None
    print(f"\n  tp=2 fuzz: {', '.join(f'{k} {v}' for k, v in sorted(counts.items()))}")
    assert counts["workloads"] == 12


def test_each_ranks_cache_holds_its_own_heads(runner):
    engine = LayeredEngine(runner, ContinuousScheduler(), EngineConfig(max_len=256))
    one_device = SMALL_CONFIGS["gqa"]
    assert engine.cache.k.shape[-2] == one_device.n_kv_heads // 2 and engine.cache.k.shape[-1] == one_device.head_dim
    assert shard_view(one_device, 2).head_dim == one_device.head_dim


@pytest.mark.parametrize("tp, needle", [(3, "choose one of 1, 2"), (0, "at least 1"), (8, "choose one of 1, 2")])
def test_a_tp_that_does_not_split_the_heads_names_the_divisors(tp, needle):
    with pytest.raises(ConfigError, match=needle) as caught:
        check_tp(SMALL_CONFIGS["gqa"], tp)
    assert tp < 1 or "4 query heads, 2 key/value heads" in str(caught.value)
