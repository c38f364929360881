"""One ragged forward per step under a token budget (chunked prefill), and prefix caching.

Token-exact against the plain no-cache loop under every budget, cache layout, policy and preemption;
the budget's rules checked on every step of the trace; prefix caching shares, evicts and never leaks.
"""

import functools
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm.config import EngineConfig, ModelConfig
from minillm.engine.blocks import BlockAllocator
from minillm.engine.generate import generate
from minillm.engine.kv_cache import ContiguousKVCache, PagedKVCache
from minillm.engine.request import Request
from minillm.engine.scheduler import ContinuousScheduler, StaticScheduler
from minillm.layers import LayeredEngine
from minillm.model.transformer import Transformer
from minillm.runs.metrics import summarize
from tests.conftest import random_model as conftest_random_model
from tests.lessons.harness import crowd


def serve(model, scheduler, requests, **cfg):
    cfg = EngineConfig(max_len=256, debug=True, **cfg)  # the KV books checked every step
    engine = LayeredEngine(model, scheduler, cfg)
    for r in requests:
        engine.submit(r)
    return engine, engine.run()


@functools.cache
def reference_reply(model, prompt_ids: tuple[int, ...], max_new_tokens: int, ignore_eos: bool) -> list[int]:
    return generate(model, list(prompt_ids), max_new_tokens, use_cache=False, ignore_eos=ignore_eos).tokens


def assert_token_exact(model, requests):
    for r in requests:
        expected = reference_reply(model, tuple(r.prompt_ids), r.max_new_tokens, r.ignore_eos)
        assert r.output_ids == expected, f"{r.id} differs from its own no-cache generation"


@functools.cache
def random_model(name):  # one model per shape for the whole module, so reference replies are computed once
    return conftest_random_model(name)


def assert_budget_rules(trace, requests, budget):
    by_id = {r.id: r for r in requests}
    for s in trace.steps:
        assert s.computed_tokens <= budget, f"step {s.step} ran {s.computed_tokens} tokens, over the budget {budget}"
        kinds = {rid: state for _, rid, state, _, _ in s.seats}
        if any(state in ("prefill", "stalled") for state in kinds.values()) and s.computed_tokens < budget:
            # budget left over, yet someone seated got nothing: only allowed if it had nothing to run
            assert "stalled" not in kinds.values(), f"step {s.step}: a seat stalled while budget was left"
    for r in requests:  # the first token comes in the step the prompt's last chunk runs
        first = next((s.step, state) for s in trace.steps for _, rid, state, _, made in s.seats if rid == r.id and made)
        assert first == (by_id[r.id].first_token_step, "prefill")


BUDGETS = [1, 7, 64]


@pytest.mark.parametrize("scheduler_cls", [StaticScheduler, ContinuousScheduler])
@pytest.mark.parametrize("kv,num_blocks", [("contiguous", None), ("paged", None), ("paged", 14)])
@pytest.mark.parametrize("budget", BUDGETS)
def test_any_token_budget_is_token_exact(scheduler_cls, kv, num_blocks, budget):
    model, requests = random_model("gqa"), crowd(12, seed=1)
    engine, trace = serve(model, scheduler_cls(token_budget=budget), requests, kv=kv, slots=4, block_size=4,
                          num_blocks=num_blocks)  # fmt: skip
    assert_token_exact(model, requests)
    assert_budget_rules(trace, requests, budget)
    assert engine.cache.stored_tokens == 0 and engine.cache.free_blocks == engine.cache.num_blocks
    if num_blocks and budget > 1:
        assert sum(r.preemptions for r in requests) > 0, "the small pool was meant to force preemption"


def test_chunks_split_a_long_prompt_and_decode_rows_go_first():
    model = random_model("gqa")
    short = Request("short", [257, 5, 6], 30, ignore_eos=True)
    long = Request("long", [257] + list(range(40)), 5, arrival_step=3, ignore_eos=True)
    engine, trace = serve(model, ContinuousScheduler(token_budget=8), [short, long], slots=2, block_size=4)
    chunks = [
        (s.step, n) for s in trace.steps for _, rid, state, n, _ in s.seats if rid == "long" and state == "prefill"
    ]
    assert [n for _, n in chunks] == [7, 7, 7, 7, 7, 6], "decode row first (1 token), the prompt gets the other 7"
    assert long.first_token_step == chunks[-1][0]
    assert_token_exact(model, [short, long])


def test_no_budget_prefills_whole_prompts_in_the_step_they_are_admitted():
    model, requests = random_model("gqa"), crowd(8)
    _, trace = serve(model, ContinuousScheduler(token_budget=0), requests, slots=3, kv="paged", block_size=4)
    for r in requests:
        prefills = [n for s in trace.steps for _, rid, state, n, _ in s.seats if rid == r.id and state == "prefill"]
        assert prefills == [len(r.prompt_ids)] and r.first_token_step == r.admit_step


@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_one_ragged_forward_equals_separate_forwards(layout):
    """Decode rows and a prompt chunk in ONE forward give the logits of running them one by one."""
    torch.manual_seed(0)
    model = random_model("mqa")
    prompts = [torch.randint(0, 256, (1, n)) for n in (5, 9, 3)]

    def fresh():
        if layout == "contiguous":
            return ContiguousKVCache(model.cfg, 4, max_len=64)
        return PagedKVCache(model.cfg, 40, block_size=4)

    caches = [fresh(), fresh()]
    for cache in caches:
        for seat, p in enumerate(prompts):
            model(p, cache.prepare([seat], p.shape[1]), cache)
    chunk = torch.randint(0, 256, (1, 6))
    decode_tokens = torch.tensor([[7], [8], [9]])
    # separately: one decode forward, then the new sequence's chunk
    apart = caches[0]
    decoded = model(decode_tokens, apart.prepare([0, 1, 2], 1), apart)[:, -1]  # (3, V)
    chunked = model(chunk, apart.prepare([3], 6), apart)[0]  # (6, V)
    # together: rows laid end to end, logits at each row's last token
    together = caches[1]
    tokens = torch.cat([decode_tokens.flatten(), chunk.flatten()])[None]  # (1, 9)
    positions = together.prepare([0, 1, 2, 3], [1, 1, 1, 6])
    logits = model(tokens, positions, together, logits_at=torch.tensor([0, 1, 2, 8]))  # (4, V)
    torch.testing.assert_close(logits[:3], decoded, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(logits[3], chunked[-1], rtol=1e-4, atol=1e-4)


# --- prefix caching -------------------------------------------------------------------------------
def shared_prefix_crowd(n: int, seed: int, arrivals: int = 30) -> list[Request]:
    rng = random.Random(seed)
    prefixes = [[257] + [rng.randrange(256) for _ in range(k)] for k in (30, 45)]
    return [
        Request(f"r{i}", prefixes[i % 2] + [rng.randrange(256) for _ in range(rng.randint(1, 12))],
                rng.randint(2, 20), arrival_step=rng.randint(0, arrivals), ignore_eos=True)
        for i in range(n)
    ]  # fmt: skip


@pytest.mark.parametrize("scheduler_cls", [StaticScheduler, ContinuousScheduler])
@pytest.mark.parametrize("budget,num_blocks", [(0, None), (7, None), (7, 30), (64, 30)])
def test_prefix_caching_is_token_exact_and_saves_prefill(scheduler_cls, budget, num_blocks):
    model = random_model("gqa")
    figures = {}
    for caching in (False, True):
        requests = shared_prefix_crowd(16, seed=1)
        engine, trace = serve(model, scheduler_cls(token_budget=budget), requests, slots=4,
                              kv="paged", block_size=4, num_blocks=num_blocks, prefix_caching=caching)  # fmt: skip
        assert_token_exact(model, requests)
        assert engine.cache.free_blocks == engine.cache.num_blocks
        figures[caching] = summarize(trace)
    assert figures[False]["prompt_tokens_from_cache"] == 0
    assert figures[True]["prompt_tokens_from_cache"] > 0 and 0.3 < figures[True]["prefix_hit_rate"] <= 1
    assert figures[True]["prefill_tokens"] < figures[False]["prefill_tokens"]
    assert figures[True]["prompt_tokens"] == figures[False]["prompt_tokens"] == sum(len(r.prompt_ids) for r in requests)


def test_a_newcomer_shares_the_blocks_another_request_is_still_prefilling():
    model = random_model("gqa")
    prefix = [257] + list(range(60))
    first = Request("first", prefix + [1, 2], 4, ignore_eos=True)
    second = Request("second", prefix + [3], 4, arrival_step=3, ignore_eos=True)  # first is mid-prompt at step 3
    engine, trace = serve(model, ContinuousScheduler(token_budget=8), [first, second], slots=2,
                          kv="paged", block_size=4, prefix_caching=True)  # fmt: skip
    assert first.first_token_step >= second.admit_step, "the newcomer was meant to come while first's prompt ran"
    done = sum(n for s in trace.steps[: second.admit_step] for _, rid, _, n, _ in s.seats if rid == "first")
    assert 0 < done < len(first.prompt_ids)
    assert second.prompt_tokens_from_cache == done // 4 * 4, "it takes every full block first had computed, no more"
    assert_token_exact(model, [first, second])


def test_a_preempted_request_counts_its_prompt_from_the_cache_once():
    """The issue's reproduction: b is preempted after computing its prompt, and its re-admission finds its own
    blocks (prompt and reply) again. The hit rate counts prompt tokens at a request's first admission only."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=128))
    a, b = Request("a", [5], 16, ignore_eos=True), Request("b", list(range(100, 125)), 16, ignore_eos=True)
    engine, trace = serve(model, ContinuousScheduler(token_budget=0), [a, b], slots=2, kv="paged", block_size=13,
                          num_blocks=5, prefix_caching=True)  # fmt: skip
    assert b.preemptions == 1 and trace.config["prefix_cache_events"]["hit_blocks"] == 3, "b found its 3 blocks again"
    assert b.prompt_tokens_from_cache == 0, "its first admission found nothing cached (it used to count 39 of 25)"
    figures = summarize(trace)
    assert figures["prompt_tokens"] == 26 and figures["prefix_hit_rate"] == 0.0
    assert_token_exact(model, [a, b])


def test_a_batch_mate_takes_the_blocks_another_computed_while_it_waited_for_the_budget():
    """Static batching seats the batch at once; under a token budget the second prompt waits for the first one's
    chunks. At each block boundary a waiting prompt takes the blocks cached since, instead of computing them."""
    model = random_model("gqa")
    prefix = [257] + list(range(40))  # 41 tokens: 10 full blocks of 4
    first, second = (
        Request("first", prefix + [1], 3, ignore_eos=True),
        Request("second", prefix + [2], 3, ignore_eos=True),
    )
    engine, trace = serve(model, StaticScheduler(token_budget=8), [first, second], slots=2, kv="paged", block_size=4,
                          prefix_caching=True)  # fmt: skip
    assert first.admit_step == second.admit_step == 0, "one batch, admitted together with nothing cached"
    assert second.prompt_tokens_from_cache == 40 and second.prefill_tokens == 2, "all but its own block's 2 tokens"
    assert_token_exact(model, [first, second])


def test_evicted_prefix_blocks_are_recomputed_correctly():
    """A pool too small to keep old prefixes: their blocks are handed to others, and a later hit must not
    find the overwritten contents."""
    model = random_model("gqa")
    requests = shared_prefix_crowd(12, seed=5, arrivals=200)
    engine, trace = serve(model, ContinuousScheduler(token_budget=16), requests, slots=2,
                          kv="paged", block_size=4, num_blocks=24, prefix_caching=True)  # fmt: skip
    assert_token_exact(model, requests)
    assert sum(r.prompt_tokens_from_cache for r in requests) > 0
    events = trace.config["prefix_cache_events"]
    assert events["evicted_keyed"] > 0 and events["hit_blocks"] > 0 and events["shared_writes"] == 0


@pytest.mark.parametrize("kv", ["contiguous", "paged"])
def test_abort_frees_the_seat_and_blocks_at_once(kv):
    model, requests = random_model("gqa"), crowd(6)
    engine = LayeredEngine(model, ContinuousScheduler(), EngineConfig(kv=kv, max_len=256, slots=2, block_size=4))
    for r in requests:
        engine.submit(r)
    for _ in range(3):
        engine.step()
    victim = next(r for r in engine.seats if r is not None)
    seat = victim.seat
    assert engine.abort(victim.id)
    assert victim.finish_reason == "aborted" and victim.seat is None and engine.seats[seat] is None
    assert engine.cache.seat_tokens(seat) == 0
    queued = engine.waiting[0] if engine.waiting else engine.pending[0]
    assert engine.abort(queued.id) and not engine.abort(queued.id)
    trace = engine.run()
    assert engine.cache.stored_tokens == 0
    assert summarize(trace)["aborted"] == 2 and summarize(trace)["finished"] == 4


# --- the allocator's books under random use, with prefix caching ----------------------------------
operations = st.lists(st.tuples(st.sampled_from(["admit", "grow", "free"]), st.integers(0, 5), st.integers(1, 30)),
                      max_size=50)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(st.integers(4, 30), st.sampled_from([1, 2, 4]), operations, st.integers(0, 3))
def test_prefix_cache_books_stay_consistent(num_blocks, block_size, ops, seed):
    """Admit (share the cached prefix, then append the rest), grow and free at random: after every operation
    ref counts equal holders, the free list and the key table agree, and every hit holds the right tokens."""
    alloc = BlockAllocator(num_blocks, block_size, prefix_caching=True)
    rng = random.Random(seed)
    prompts = [[rng.randrange(3) for _ in range(40)] for _ in range(3)]  # few distinct starts: many hits
    tokens: dict[int, list[int]] = {}
    contents: dict[int, list[int]] = {}  # block -> the tokens written into it (what the KV pool would hold)

    def write(seq, start):
        for p in range(start, len(tokens[seq])):
            block = alloc.tables[seq][p // block_size]
            contents.setdefault(block, [None] * block_size)[p % block_size] = tokens[seq][p]

    for op, seq, n in ops:
        try:
            if op == "admit" and seq not in alloc.tables:
                ids = prompts[seq % 3][: n + 1]
                hits = alloc.cached_prefix(ids)
                for i, block in enumerate(hits):  # a hit must hold exactly these tokens
                    assert contents[block] == ids[i * block_size : (i + 1) * block_size]
                alloc.share_prefix(seq, hits)
                tokens[seq] = ids
                alloc.append(seq, len(ids) - len(hits) * block_size)
                write(seq, len(hits) * block_size)
                alloc.cache_full_blocks(seq, ids)
            elif op == "grow" and seq in alloc.tables:
                start = len(tokens[seq])
                alloc.append(seq, n)
                tokens[seq] = tokens[seq] + [rng.randrange(3) for _ in range(n)]
                write(seq, start)
                alloc.cache_full_blocks(seq, tokens[seq])
            elif op == "free":
                alloc.free(seq)
                tokens.pop(seq, None)
        except Exception as e:  # running out of blocks is fine; it must change nothing
            assert type(e).__name__ == "BlockPoolExhausted"
            if seq in tokens and seq in alloc.tables and op == "admit":
                alloc.free(seq)
                tokens.pop(seq)
        alloc.check()
    for seq in list(alloc.tables):
        alloc.free(seq)
    alloc.check()
    assert alloc.num_free == num_blocks
