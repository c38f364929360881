"""The engine's books under stress: seeded random workloads, every step checked, every reply exact.

Each workload draws a policy (static, continuous, or continuous by priority or deadline with a victim rule and a
random promise for each request), a KV layout, a block size (1-16), a token budget (none, 1, a few tokens, a few
dozen), prefix caching over shared and nested prompts, a pool from tight (preemption, eviction) to roomy, aborts at
random steps (queued, mid-prompt, mid-reply, preempted) and now and then a second submit of a live request's id, now
and then n replies to one prompt sharing its blocks, now and then a second KV tier in host memory, and half the time
speculative decoding (k from 1 to 8) with a drafter that is always right (the model itself), one that is right now
and then (the model with noise added), a stranger (another random model) or prompt lookup. Every step: the
allocator's invariants (the engine's debug mode), no request lost, each seated request's cached tokens equal to what
it computed, no draft left over, no draft cache ahead of its request. At the end: the pool fully free (rejected
guesses' blocks included), and every reply equal to the plain no-cache loop's. A reply that parts from it where the
loop's two best logits tie (within 1e-6: the order of float sums can break such a tie either way) is counted as a
tie, not failed.

    MINILLM_FUZZ_RUNS=3000 python3 -m pytest -q -s tests/test_engine_fuzz.py   # a long run; prints its counts
    MINILLM_FUZZ_SEED=1234 MINILLM_FUZZ_RUNS=1 ...                              # one workload again, by its seed
"""

from __future__ import annotations

import functools
import math
import os
import random
from collections import Counter

import pytest
import torch

from minillm.config import EngineConfig
from minillm.engine.generate import generate
from minillm.engine.request import Request
from minillm.engine.scheduler import SCHEDULERS
from minillm.errors import InputError
from minillm.layers import LayeredEngine
from minillm.layers.policies import VICTIMS, make_policy
from minillm.layers.service import Service
from minillm.model.tokenizer import EOS
from minillm.runs.metrics import summarize
from tests.conftest import random_model

RUNS = int(os.environ.get("MINILLM_FUZZ_RUNS", "40"))
FIRST_SEED = int(os.environ.get("MINILLM_FUZZ_SEED", "0"))
TIE = 1e-6  # the reference's top two logits this close: either token is a right answer


@functools.cache
def model():
    return random_model("gqa")  # 2 layers, grouped-query attention, a context of 256


@functools.cache
def drafts():
    """Draft models: the model itself (every guess right but ties), the model with noise in its weights (right
    some of the time: accepts a few, then rejects), another random model (almost every guess wrong)."""
    noisy = random_model("gqa")
    with torch.no_grad():
        for p in noisy.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.5 * p.std())
    return {"itself": model(), "noisy": noisy, "stranger": random_model("mqa", seed=1)}


@functools.cache
def reference(prompt: tuple[int, ...], max_new_tokens: int, ignore_eos: bool) -> list[int]:
    return generate(model(), list(prompt), max_new_tokens, use_cache=False, ignore_eos=ignore_eos).tokens


@torch.no_grad()
def tie_at(prompt: list[int], reply: list[int], ignore_eos: bool, tie: float = TIE) -> bool:
    """Do the no-cache loop's two best next tokens after prompt + reply tie (within `tie`)?"""
    logits = model()(torch.tensor([prompt + reply]), last_only=True)[0, -1]  # (V,)
    if ignore_eos:
        logits[EOS] = -math.inf
    first, second = logits.topk(2).values.tolist()
    return first - second <= tie


def draw_workload(rng: random.Random, runner=None):
    """An engine and its requests, with the steps at which to abort some of them and to resubmit a live id, and
    each request's promised service (ranked policies only).
    runner: what the engine runs the model on (default: the model on this process; a tensor-parallel runner's
    tests pass theirs)."""
    kv = rng.choice(["paged", "paged", "contiguous"])
    block_size, slots = rng.randint(1, 16), rng.choice([1, 2, 3, 4, 4])
    budget = rng.choice([0, 1, rng.randint(2, 12), rng.randint(13, 64)])
    root = [rng.randrange(256) for _ in range(rng.randint(1, 40))]
    stems = [root[: rng.randint(1, len(root))] for _ in range(3)] + [[rng.randrange(256) for _ in range(5)]]
    requests = []
    for i in range(rng.randint(1, 10)):  # shared and nested prompts: a stem (maybe whole), then a few own tokens
        prompt = rng.choice(stems) + [rng.randrange(256) for _ in range(rng.randint(0, 6))]
        requests.append(Request(f"q{i}", prompt, rng.randint(1, 20), arrival_step=rng.randint(0, 8),
                                ignore_eos=rng.random() < 0.8))  # fmt: skip
    # n replies to a prompt (OpenAI's n), sharing its blocks: one in four requests asks for 2 or 3
    replies = {r.id: rng.choice([1, 1, 1, 1, 1, 1, 2, 3]) for r in requests}
    biggest = max(-(-(len(r.prompt_ids) + r.max_new_tokens - 1) // block_size) for r in requests)
    tight = [biggest, biggest, biggest + rng.randint(1, 4), biggest + rng.randint(1, 4)]  # preemption, eviction
    num_blocks = rng.choice(tight + [2 * biggest, 4 * biggest] + [max(1, biggest - 1)] * (rng.random() < 0.2))
    speculate, drafter = rng.choice([0, rng.randint(1, 8)]), rng.choice(["itself", "noisy", "stranger", "ngram"])
    caching = kv == "paged" and rng.random() < 0.75
    # a second KV tier in host memory under the prefix cache, now and then (one device only: ranks keep their own)
    host = rng.choice([0, 0, rng.randint(1, 3 * biggest)]) if caching and runner is None else 0
    cfg = EngineConfig(slots=slots, kv=kv, block_size=block_size, num_blocks=num_blocks if kv == "paged" else None,
                       max_len=256, prefix_caching=caching, debug=True, record_blocks=rng.random() < 0.3,
                       speculate=speculate, drafter="ngram" if drafter == "ngram" else "model", host_blocks=host,
                       swap_above=rng.choice([0, rng.randint(1, 60)]))  # fmt: skip
    policy = SCHEDULERS[rng.choice(["static", "continuous"])](token_budget=budget)
    aborts = sorted(rng.randint(0, 30) for _ in range(rng.choice([0, 0, 1, 2, 3])))  # steps to abort someone at
    resubmit = rng.randint(0, 20) if rng.random() < 0.2 else None
    promised = {}
    if policy.name == "continuous" and rng.random() < 0.5:  # who goes first: ranked, each request promised something
        policy = make_policy(rng.choice(["priority", "deadline"]), budget, rng.choice(VICTIMS))
        for r in requests:
            targets = {"ttft_s": rng.choice([None, 1e-4, 0.05]), "deadline_s": rng.choice([None, 1e-3, 5.0])}
            promised[r.id] = Service(rng.choice("ab"), rng.randint(0, 3), **targets)
    engine = LayeredEngine(runner or model(), policy, cfg, draft=drafts().get(drafter))
    return engine, requests, aborts, resubmit, promised, replies


def where(engine: LayeredEngine, r: Request) -> str:
    if r.seat is None:
        return "preempted" if r.preemptions else "queued"
    return "mid-reply" if r.output_ids else "mid-prompt"


def check_every_step(engine: LayeredEngine, requests: list[Request]) -> None:
    seated = engine.running()
    siblings = [r for _, held in engine.replies.waiting.values() for r, *_ in held]  # (not yet in the engine)
    places = [id(r) for r in list(engine.pending) + list(engine.waiting) + seated + siblings]
    live = [id(r) for r in requests if not r.is_finished]
    assert len(places) == len(set(places)) and set(places) == set(live), "a request was lost or is in two places"
    for r in seated:
        assert engine.seats[r.seat] is r and engine.cache.seat_tokens(r.seat) == r.num_computed, r.id
        assert not r.lookahead, f"{r.id}: a draft outlived its step"
        drafter = engine.speculation.drafter if engine.speculation else None  # (None: speculation off)
        if hasattr(drafter, "cache") and drafter.holder[r.seat] == r.admit_order:
            assert drafter.cache.lengths[r.seat] < r.num_tokens, f"{r.id}: the draft's cache holds its last token"


def check_the_end(engine: LayeredEngine, requests: list[Request], counts: Counter, tie: float = TIE) -> None:
    assert all(r.is_finished for r in requests), "the engine stopped with requests unfinished"
    if engine.cfg.kv == "paged":
        alloc = engine.cache.allocator
        assert alloc.num_free == alloc.num_blocks and not alloc.tables, "KV blocks leaked"
        counts["evictions"] += alloc.events["evicted_keyed"]
        counts["hit blocks"] += alloc.events["hit_blocks"]
        counts["blocks loaded from host"] += (engine.meta.get("tier_events") or {}).get("loaded", 0)
    assert engine.cache.stored_tokens == 0
    trace = engine.trace()
    assert summarize(trace)["prefix_hit_rate"] <= 1
    whys = [why for s in trace.steps for why in s.preempted_why.values()]
    assert len(whys) == sum(r.preemptions for r in requests), "a preemption without its reason"
    if engine.scheduler.name in ("priority", "deadline"):
        counts["ranked by " + engine.scheduler.name] += 1
    counts["displaced by a higher rank"] += sum("outranks" in why for why in whys)
    for r in requests:
        counts["requests"] += 1
        counts["preemptions"] += r.preemptions
        if r.id in engine.live or r in engine.requests:  # (a sibling aborted before it went in: never in the trace)
            counts["drafts checked"] += trace.request(r.id).drafts_verified
            counts["drafts kept"] += trace.request(r.id).drafts_accepted
        counts["replies sharing a prompt"] += "#" in r.id and r.finish_reason != "aborted"
        assert r.prompt_tokens_from_cache < len(r.prompt_ids), f"{r.id}: more prompt tokens from the cache than it has"
        if r.finish_reason.startswith("rejected"):
            counts["rejected"] += 1
            continue
        expected = reference(tuple(r.prompt_ids), r.max_new_tokens, r.ignore_eos)
        if r.finish_reason == "aborted":
            expected = expected[: len(r.output_ids)]  # as far as it got
        if r.output_ids != expected:
            part = next(i for i, (a, b) in enumerate(zip(r.output_ids + [None], expected + [None])) if a != b)
            assert tie_at(r.prompt_ids, expected[:part], r.ignore_eos, tie), (
                f"{r.id} ({r.finish_reason}) parts from the no-cache loop at reply token {part}: "
                f"{r.output_ids} vs {expected}"
            )
            counts["ties"] += 1


def run_workload(seed: int, counts: Counter, runner=None, tie: float = TIE) -> None:
    rng = random.Random(seed)
    engine, requests, aborts, resubmit, promised, replies = draw_workload(rng, runner)
    for r in list(requests):
        requests += engine.submit_replies(r, replies[r.id], promised.get(r.id))[1:]
    while engine.has_work():
        live = [r for r in requests if not r.is_finished]
        for _ in range(aborts.count(engine.step_no) if live else 0):  # someone live; a preempted one, half the time
            preempted = [r for r in live if r.seat is None and r.preemptions]
            r = rng.choice(preempted if preempted and rng.random() < 0.5 else live)
            kind = where(engine, r)
            assert engine.abort(r.id) and r.seat is None and r.finish_reason == "aborted"
            assert not engine.abort(r.id), "aborted twice"
            counts[f"aborted {kind}"] += 1
            live.remove(r)
            if not live:
                break
        in_engine = [r for r in live if r.id in engine.live]
        if resubmit == engine.step_no and in_engine:
            with pytest.raises(InputError, match="already queued or running"):
                engine.submit(Request(in_engine[0].id, [1, 2, 3], 2))
            counts["second submits refused"] += 1
        engine.step()
        check_every_step(engine, requests)
        assert engine.step_no < 5000, "the engine is going round in circles"
    check_the_end(engine, requests, counts, tie)
    counts["workloads"] += 1


def test_random_workloads_keep_the_books_and_the_replies_exact():
    counts: Counter = Counter(ties=0)  # (printed even when none)
    for seed in range(FIRST_SEED, FIRST_SEED + RUNS):
        try:
            run_workload(seed, counts)
        except AssertionError as e:
            raise AssertionError(f"workload seed {seed} (MINILLM_FUZZ_SEED={seed} MINILLM_FUZZ_RUNS=1): {e}") from None
    summary = ", ".join(f"{name} {n}" for name, n in sorted(counts.items()))
    print(f"\nengine fuzz, seeds {FIRST_SEED}..{FIRST_SEED + RUNS - 1}: {summary}")
    assert counts["workloads"] == RUNS and counts["requests"] > RUNS
