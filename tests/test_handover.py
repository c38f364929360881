"""Prefill on one engine, decode on another (layers/handover.py): token-exact against one engine, no block left
behind on either side, under every engine feature on either side."""

from __future__ import annotations

import pytest

from minillm.config import EngineConfig, Sampling
from minillm.engine.request import Request
from minillm.engine.scheduler import ContinuousScheduler
from minillm.grammar import compile_regex
from minillm.layers import LayeredEngine, generate
from minillm.layers.handover import hand_over
from tests.conftest import random_model
from tests.lessons.harness import crowd
from tests.test_speculate import noisy


def model():
    return random_model("gqa")


def engine(token_budget=256, **cfg) -> LayeredEngine:
    cfg = {"max_len": 256, "debug": True, "slots": 3} | cfg
    return LayeredEngine(model(), ContinuousScheduler(token_budget=token_budget), EngineConfig(**cfg),
                  draft=noisy() if cfg.get("speculate") else None)  # fmt: skip


def disaggregated(requests, prefill: LayeredEngine, decode: LayeredEngine) -> list[Request]:
    """Every request prefilled on `prefill`, handed over after its first token, decoded on `decode`: the requests
    as they ended (on the decode engine, or on the prefill engine when the first token ended them)."""
    for r in requests:
        prefill.handover.mark(r)
        prefill.submit(r)
    ended = {}
    while prefill.has_work() or decode.has_work():
        if prefill.has_work():
            prefill.step()
        for copy in hand_over(prefill, decode):
            ended[copy.id] = copy
        if decode.has_work():
            decode.step()
    for pool in (prefill, decode):
        if pool.cfg.kv == "paged":
            assert pool.cache.allocator.num_free == pool.cache.allocator.num_blocks, "KV blocks left behind"
        assert not pool.held, "a handed-over request still holds its KV"
    return [ended.get(r.id, r) for r in requests]


def plain(r: Request) -> list[int]:
    s = r.sampling
    return generate(model(), r.prompt_ids, r.max_new_tokens, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                    seed=s.seed, use_cache=False, ignore_eos=r.ignore_eos, constraint=s.constraint).tokens  # fmt: skip


SIDES = {
    "paged to paged": ({}, {}),
    "paged to contiguous": ({}, {"kv": "contiguous"}),
    "contiguous to paged": ({"kv": "contiguous"}, {}),
    "chunked prefill": ({"token_budget": 5}, {}),
    "prefix caching on both": ({"prefix_caching": True, "block_size": 4}, {"prefix_caching": True, "block_size": 4}),
    "decode pool short (preemption)": ({}, {"block_size": 4, "num_blocks": 16, "slots": 4}),
    "speculating decode": ({}, {"speculate": 3}),
    "one seat each": ({"slots": 1}, {"slots": 1}),
}


@pytest.mark.parametrize("sides", SIDES)
def test_replies_equal_one_engines_whatever_each_side_runs(sides):
    prefill_cfg, decode_cfg = SIDES[sides]
    requests = crowd(8)
    shared = [257] + list(range(60, 75))
    requests += [Request("s0", shared, 5, ignore_eos=True), Request("s1", shared + [3], 5, arrival_step=6,
                                                                        ignore_eos=True)]  # fmt: skip
    ended = disaggregated(requests, engine(**prefill_cfg), engine(**decode_cfg))
    for r in ended:
        assert r.output_ids == plain(r), f"{sides}: {r.id}"
        assert r.finish_reason == "length"
    if "preemption" in sides:
        assert sum(r.preemptions for r in ended), "the decode pool must run short for this case"


def test_sampled_constrained_and_one_token_replies_cross_too():
    requests = [
        Request("warm", [257, 5, 6], 16, ignore_eos=True, sampling=Sampling(temperature=1.0, seed=3)),
        Request("digits", [257, 7], 30, sampling=Sampling(constraint=compile_regex(r"[0-9]{3,6}"))),
        Request("one", [257, 9, 9], 1, ignore_eos=True),  # done on the prefill engine: nothing to hand over
        # may end at its first pick
        Request("eos-first", [257, 1], 8, sampling=Sampling(constraint=compile_regex(r"(x)?"))),
    ]
    ended = disaggregated(requests, engine(), engine())
    for r in ended:
        assert r.output_ids == plain(r), r.id
    by_id = {r.id: r for r in ended}
    assert by_id["one"].finish_reason == "length" and by_id["digits"].finish_reason == "eos"


def test_the_prefill_engine_keeps_a_handed_requests_kv_until_released():
    prefill = engine()
    r = Request("a", [257] + list(range(20)), 10, ignore_eos=True)
    prefill.handover.mark(r)
    prefill.submit(r)
    while not prefill.held:
        prefill.step()
    assert r.finish_reason == "handed-over" and len(r.output_ids) == 1 and r.seat is not None
    held = prefill.cache.allocator.num_used
    assert held == 2  # 21 prompt tokens in blocks of 16: its KV is still there, for the copy
    prefill.release(r)
    assert prefill.cache.allocator.num_used == 0 and r.seat is None and not prefill.held
