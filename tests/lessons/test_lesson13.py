"""Lesson 13: a router that knows the caches, and the KV a hand-over sends. Run: pytest -m lesson13

Your prompt_keys must give the keys the replicas' allocators give a prompt's full blocks (chained, the partial last
block left out); your matched_blocks the run of leading keys a replica holds; your route the replica the server's
cache-aware router picks (serving/routing.py), in situations named one by one: the longest run, the fallback to least
loaded under min_match and when overloaded, ties by load then index. kv_bytes and transfer_s must give the cost
model's numbers (card/kv_transfer.py) for Llama-3.1-8B and -70B and a toy model at several tp and precisions. The lists
and sets you are given must come back unchanged. A failing check's first line names the situation, then the likely
mistake: WRONG (below) lists the mistakes a room makes, each caught and named; RIGHT, correct versions written
differently that must pass.

Then the differential checks (tests/lessons/drawn/lesson13.py): each function against the reference on drawn cases
(seeded: the same every run; MINILLM_CHECK_EXAMPLES=N draws N; 80 each, route 160), through the same checks, the
smallest case that differs shown first. Strategies: prompt_keys on 0 to 40 ids (0, 255 and the special ids 256 to 259
among them) in blocks of 1 to 8 (prompts ending on a boundary, one short, one past); matched_blocks on a drawn
prompt's keys and a cache holding a run of them with holes and other prompts' keys; route on a 6-block prompt and 1
to 4 replicas holding runs of 0 to 6 of its blocks (holes too), loads from 0, 5, 10, 20, 35, 40, 100 (ties of load
and of run, a load exactly at the overload limit), cost 0, 10 or 20, min_match 0 to 3, overload_factor 1, 1.5 or 3;
kv_bytes on 1 to 128 layers, 1 to 16 kv heads read by 1 to 8 query heads each, head_dim 1 to 256, 0 to 10**6
tokens, 32/16/8/4-bit KV, tp any divisor of the kv heads; transfer_s on 0 to 10**11 bytes, 1 to 800 Gb/s, 0 to 100 us.
DRAWN_ONLY names the wrong versions only the drawn cases catch.
"""

from __future__ import annotations

import ast
import itertools
import random
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from minillm.engine.blocks import BlockAllocator, block_key
from tests.lessons.drawn.lesson13 import check_drawn
from tests.lessons.harness import CHECKS, case, failure_of, implementations, stub
from tests.lessons.harness import check_numbers as harness_check_numbers
from tests.lessons.harness import student_module as student

lesson = pytest.mark.lesson13  # your code's checks: pytest -m lesson13


# --- the reference -------------------------------------------------------------------------------------------------
def prompt_keys(token_ids, block_size):
    keys, key = [], b""
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        key = block_key(key, token_ids[start : start + block_size])
        keys.append(key)
    return keys


def matched_blocks(keys, held):
    for n, key in enumerate(keys):
        if key not in held:
            return n
    return len(keys)


def route(keys, loads, caches, cost, min_match=2, overload_factor=1.5):
    replicas = range(len(loads))
    run = [matched_blocks(keys, held) for held in caches]
    best = min(replicas, key=lambda i: (-run[i], loads[i], i))
    least = min(replicas, key=lambda i: (loads[i], i))
    if run[best] < min_match or loads[best] > overload_factor * loads[least] + cost:
        return least
    return best


def kv_bytes(layers, heads, kv_heads, head_dim, tokens, kv_bits=16, tp=1):
    return 2 * layers * kv_heads / tp * head_dim * kv_bits / 8 * tokens


def transfer_s(nbytes, link_gbit_per_s, latency_s):
    return latency_s + nbytes * 8 / (link_gbit_per_s * 1e9)


REFERENCE = SimpleNamespace(prompt_keys=prompt_keys, matched_blocks=matched_blocks, route=route, kv_bytes=kv_bytes,
                            transfer_s=transfer_s)  # fmt: skip
BORROWED = ("minillm.serving.routing", "minillm.serving.router", "minillm.card.kv_transfer", "minillm.card.roofline")


def assert_writes_its_own(module) -> None:
    """Your file may take block_key from minillm; the router's and the cost model's functions are the answer."""
    path = Path(module.__file__)
    for node in ast.walk(ast.parse(path.read_text())):
        names = [node.module] if isinstance(node, ast.ImportFrom) else []
        names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
        taken = [n for n in names if n and n.startswith(BORROWED)]
        assert not taken, f"{path.name}, line {node.lineno}: you import from {taken[0]}; write it yourself"


@pytest.fixture(params=implementations(lesson))
def impl(request):
    if request.param == "reference":
        return REFERENCE
    module = student("lesson13_fleet")
    assert_writes_its_own(module)
    return module


def numbered(n: int, start: int = 100) -> list[int]:
    return [start + 7 * i % 251 for i in range(n)]


# --- prompt_keys -------------------------------------------------------------------------------------------------
KEY_CASES = [(9, 4), (12, 4), (3, 4), (4, 4), (0, 4), (40, 16), (3, 1), (33, 16)]  # (prompt tokens, block size)


def diagnose_keys(got, tokens, block_size) -> str:
    want, full = prompt_keys(tokens, block_size), len(tokens) // block_size
    blocks = [tokens[i * block_size : (i + 1) * block_size] for i in range(full)]
    if not isinstance(got, list) or not all(isinstance(k, bytes) for k in got):
        return f"return a list of keys, block_key's bytes, one per full block; got {type(got).__name__}"
    if len(got) == full + 1 and got[:full] == want:
        return (
            f"a partial last block keyed: {len(tokens)} tokens in blocks of {block_size} fill {full} block(s); the "
            "tokens after them are a block its owner still writes into, which no allocator keys and nobody can share"
        )
    if full >= 1 and got == want[:-1]:
        return (
            f"the last full block is missing: {len(tokens)} tokens in blocks of {block_size} fill {full} block(s) "
            "(a block that ends exactly at the prompt's end is full too: go up to len - block_size, inclusive)"
        )
    if full >= 2 and got == [block_key(b"", b) for b in blocks]:
        return (
            "blocks keyed without their predecessor: block i's key is block_key(key of block i - 1, its tokens), so "
            "equal keys mean equal tokens from the prompt's start; a block keyed alone would match any prompt with "
            "the same tokens there, and never the allocator's keys"
        )
    if full >= 2 and got == [block_key(b"", tokens[: (i + 1) * block_size]) for i in range(full)]:
        return (
            "each block keyed by the whole prefix's tokens: unique, but not the allocator's keys (block_key of the "
            "previous KEY and this block's tokens), so no replica's cache would ever match them"
        )
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            return f"block {i}'s key differs from the allocator's: block_key(key of block {i - 1}, its tokens)"
    return f"{len(got)} key(s) for {full} full block(s)"


def check_keys(impl) -> None:
    for n, block_size in KEY_CASES:
        check_keys_case(impl, numbered(n), block_size, f"prompt_keys, a {n}-token prompt")


def check_keys_case(impl, tokens: list[int], block_size: int, prompt: str) -> None:
    where = f"{prompt} in blocks of {block_size}"
    given = list(tokens)
    with case(where):
        got = impl.prompt_keys(given, block_size)
    assert given == tokens, f"{where}: a side effect: your code changed the token list it was given"
    if got != prompt_keys(tokens, block_size):
        raise AssertionError(f"{where}: {diagnose_keys(got, tokens, block_size)}")


# --- matched_blocks ------------------------------------------------------------------------------------------------
K = prompt_keys(numbered(20), 4)  # five chained keys


def held(*blocks) -> set[bytes]:
    return {K[b] for b in blocks}


MATCH_CASES = [
    ("holds all 5 blocks", K, held(0, 1, 2, 3, 4) | {b"other"}),
    ("holds the first 2 of 5", K, held(0, 1)),
    ("holds blocks 1-4 but not block 0 (evicted)", K, held(1, 2, 3, 4)),
    ("holds blocks 0, 2 and 3 (block 1 evicted)", K, held(0, 2, 3)),
    ("holds none", K, set()),
    ("a prompt with no full block", [], held(0, 1)),
]


def check_matched(impl) -> None:
    for label, keys, cache in MATCH_CASES:
        check_matched_case(impl, keys, cache, label)


def check_matched_case(impl, keys: list[bytes], cache: set[bytes], label: str) -> None:
    where = f"matched_blocks, a replica that {label}"
    given_keys, given_cache = list(keys), set(cache)
    with case(where):
        got = impl.matched_blocks(given_keys, given_cache)
    assert given_keys == keys and given_cache == cache, (
        f"{where}: a side effect: your code changed the keys or the set it was given"
    )
    want = matched_blocks(keys, cache)
    if got == want:
        return
    if got == sum(k in cache for k in keys):
        why = (
            "matches counted past the first miss: a block is only useful after all of its predecessors (its keys "
            "and values were computed on theirs), so the run stops at the first key the replica lacks"
        )
    elif got == (len(keys) if all(k in cache for k in keys) else 0):
        why = "all or nothing: a replica holding the first blocks gives those, however many follow"
    else:
        why = "count the leading keys it holds, in a run from the first"
    raise AssertionError(f"{where}: yours gives {got!r}, the answer is {want}: {why}")


# --- route ---------------------------------------------------------------------------------------------------------
# (situation, loads, caches, cost, min_match, overload_factor, answer, {a wrong answer: the likely mistake})
ROUTE_CASES = [
    ("replica 1 holds the first 3 of 5 blocks, replica 0 the first 1; loads 10 and 12", [10, 12],
     [held(0), held(0, 1, 2)], 20, 2, 1.5, 1,
     {0: "the fallback inverted: a run of 3 blocks (at least min_match 2) on a replica that is not overloaded "
         "(12 <= 1.5 x 10 + 20) takes the request; least loaded is only for short runs and overloaded replicas"}),
    ("the longest run is 1 block, under min_match 2; loads 30, 5, 20", [30, 5, 20], [held(0), set(), set()], 10, 2,
     1.5, 1,
     {0: "a run under min_match blocks steers nothing (a shared template's first block would send everyone to one "
         "replica): fall back to the least loaded"}),
    ("a run of exactly min_match 2 blocks on replica 1; loads 25 and 30", [25, 30], [set(), held(0, 1)], 40, 2, 1.5,
     1,
     {0: "min_match blocks are enough: fall back only when the run is SHORTER than min_match (<, not <=)"}),
    ("replicas 0 and 2 hold the same 3 blocks, replica 2 less loaded; loads 24, 20, 22", [24, 20, 22],
     [held(0, 1, 2), set(), held(0, 1, 2)], 10, 2, 1.5, 2,
     {0: "ties not broken by load: among equally long runs, the less loaded replica"}),
    ("replicas 1 and 2 hold the same 2 blocks with the same load 9; replica 0 none, load 8", [8, 9, 9],
     [set(), held(0, 1), held(0, 1)], 10, 2, 1.5, 1,
     {2: "ties not broken stably: equal runs and loads go to the lower index (replacing the best on >=, or max() over "
         "reversed candidates, keeps the last)"}),
    ("nobody holds a block; replicas 1 and 2 share the least load 4", [7, 4, 4], [set(), set(), set()], 10, 2, 1.5, 1,
     {2: "ties not broken stably: least loaded ties go to the lower index"}),
    ("replica 0 holds all 5 blocks, load 100; replica 1 none, load 10", [100, 10, 20], [set(K), set(), set()], 20, 2,
     1.5, 1,
     {0: "the overloaded replica kept its hit: a load of 100 is over 1.5 x 10 (the least loaded's) + 20 (the "
         "request's own tokens): send it to the least loaded"}),
    ("replica 0 holds all 5 blocks, load 40; replica 1 load 10; the request's cost 30", [40, 10], [set(K), set()], 30,
     2, 1.5, 0,
     {1: "the request's own tokens (cost) left out of the limit: 40 is under 1.5 x 10 + 30 = 45, so replica 0 is not "
         "overloaded"}),
    ("replica 0 holds all 5 blocks, its load 35 exactly 1.5 x 10 + 20", [35, 10], [set(K), set()], 20, 2, 1.5, 0,
     {1: "overloaded means OVER the limit (>): a load of exactly 1.5 x 10 + 20 = 35 keeps its hit"}),
    ("replica 0 holds blocks 1-4 but not block 0, replica 1 block 0; min_match 1; loads 5 and 9", [5, 9],
     [held(1, 2, 3, 4), held(0)], 10, 1, 1.5, 1,
     {0: "replica 0's run counted past its first miss: it lacks block 0, so its run is 0 blocks (matched_blocks)"}),
    ("one replica, holding nothing", [50], [set()], 10, 2, 1.5, 0, {}),
    ("a wider fallback: overload_factor 3; replica 2 holds 4 blocks, load 60; loads 20, 30", [20, 30, 60],
     [held(0), set(), held(0, 1, 2, 3)], 5, 2, 3.0, 2,
     {0: "overload_factor is the given one, not always 1.5: 60 is under 3 x 20 + 5 = 65"}),
]  # fmt: skip


def check_route(impl) -> None:
    for label, loads, caches, cost, min_match, factor, answer, hints in ROUTE_CASES:
        where = f"route, {label}" + (f" (min_match {min_match})" if min_match != 2 else "")
        check_route_case(impl, K, loads, caches, cost, min_match, factor, answer, hints, where)


def check_route_case(impl, keys, loads, caches, cost, min_match, factor, answer, hints, where) -> None:
    given_loads, given_caches = list(loads), [set(c) for c in caches]
    with case(where):
        got = impl.route(list(keys), given_loads, given_caches, cost, min_match, factor)
    assert given_loads == loads and given_caches == caches, (
        f"{where}: a side effect: your code changed the loads or the caches it was given"
    )
    assert isinstance(got, int) and not isinstance(got, bool), f"{where}: return a replica's index, got {got!r}"
    if got != answer:
        why = hints.get(got, f"the answer is replica {answer}")
        raise AssertionError(f"{where}: you chose replica {got}: {why}{route_hint(keys, loads, caches, got, answer)}")


def route_hint(keys, loads, caches, got, answer) -> str:
    """A likely mistake that explains a drawn fleet's wrong choice, when one does."""
    runs = [matched_blocks(keys, held) for held in caches]
    least = [i for i, load in enumerate(loads) if load == min(loads)]
    if answer == least[0] and got in least and len(least) > 1:
        return (
            f" (replicas {least} share the least load {min(loads)}: the fallback's ties go to the lower index, "
            "whatever they hold)"
        )
    if runs[got] == runs[answer] and loads[got] == loads[answer] and got > answer:
        return " (equal runs and loads: the lower index)"
    return ""


# --- kv_bytes and transfer_s: the answer, and what a room gets wrong ---------------------------------------------
KNOWN_MISTAKES = {
    "bits": "kv_bits are bits: a number takes kv_bits / 8 bytes",
    "floor-bits": "4 // 8 is 0: divide bits by 8 with /, not //",
    "keys-only": "keys only: each token keeps a key AND a value per layer and kv head (the 2)",
    "one-layer": "one layer only: every layer keeps its own keys and values (x layers)",
    "query-heads": "query heads counted: only the key/value heads are cached (GQA: Llama-3.1-8B has 32 query heads but "
    "8 kv heads)",
    "tp-not-divided": "each card of tp holds and sends only its own kv heads: kv_heads / tp of them",
    "transfer-bits": "a link's rate is in bits: nbytes x 8 bits go over it",
    "transfer-gib": "a gigabit is 10**9 bits (network rates are decimal), not 2**30",
    "transfer-no-latency": "the fixed latency_s comes on top of the bytes' time",
    "transfer-halved": "a network's rate is per direction already (400 Gb/s each way): do not halve it as NVLink's "
    "both-ways headline",
}


def answer(mistake: str | None = None) -> SimpleNamespace:
    """The reference arithmetic; with `mistake` (a KNOWN_MISTAKES key), the same with that one mistake."""

    def kv_bytes(layers, heads, kv_heads, head_dim, tokens, kv_bits=16, tp=1):
        per_number = kv_bits // 8 if mistake == "floor-bits" else kv_bits / (1 if mistake == "bits" else 8)
        heads_cached = heads if mistake == "query-heads" else kv_heads
        return ((1 if mistake == "keys-only" else 2) * (1 if mistake == "one-layer" else layers) * heads_cached
                / (1 if mistake == "tp-not-divided" else tp) * head_dim * per_number * tokens)  # fmt: skip

    def transfer_s(nbytes, link_gbit_per_s, latency_s):
        bits = nbytes * (1 if mistake == "transfer-bits" else 8)
        rate = link_gbit_per_s * (2**30 if mistake == "transfer-gib" else 1e9) / (2 if mistake == "transfer-halved"
                                                                                   else 1)  # fmt: skip
        return (0 if mistake == "transfer-no-latency" else latency_s) + bits / rate

    return SimpleNamespace(kv_bytes=kv_bytes, transfer_s=transfer_s)


MODELS = {"llama-3.1-8b": (32, 32, 8, 128), "llama-3.1-70b": (80, 64, 8, 128), "a toy model": (2, 4, 2, 8)}


def kv_cases():
    cases = []
    for name, (layers, heads, kv_heads, head_dim) in MODELS.items():
        for tokens, bits, tp in ((1000, 16, 1), (4096, 8, 2), (1, 16, 8 if kv_heads >= 8 else 2), (2048, 4, 1)):
            cases.append((f"{name}, a {tokens:,}-token prompt, {bits}-bit KV, on {tp} card(s)",
                          (layers, heads, kv_heads, head_dim, tokens, bits, tp)))  # fmt: skip
    return cases


def transfer_cases():
    return [(f"{nbytes / 1e6:g} MB over {gbit} Gb/s, {latency * 1e6:g} us latency", (nbytes, gbit, latency))
            for nbytes, gbit, latency in ((131_072_000, 400, 10e-6), (2_147_483_648, 200, 5e-6), (1e3, 100, 0.0),
                                          (536_870_912, 400, 25e-6))]  # fmt: skip


def check_numbers(function: str, yours, cases) -> None:
    harness_check_numbers(function, yours, cases, answer, KNOWN_MISTAKES, abs_tol=1e-15)


def check_kv(impl) -> None:
    check_numbers("kv_bytes", impl.kv_bytes, kv_cases())


def check_transfer(impl) -> None:
    check_numbers("transfer_s", impl.transfer_s, transfer_cases())


def check_drawn_inputs(impl) -> None:
    check_drawn(impl, sys.modules[__name__])


def check_cases(impl) -> None:
    check_keys(impl)
    check_matched(impl)
    check_route(impl)
    check_kv(impl)
    check_transfer(impl)


def check_all(impl) -> None:
    check_cases(impl)
    check_drawn_inputs(impl)


# --- your code ----------------------------------------------------------------------------------------------------
def test_prompt_keys(impl):
    check_keys(impl)


def test_matched_blocks(impl):
    check_matched(impl)


def test_route(impl):
    check_route(impl)


def test_kv_bytes(impl):
    check_kv(impl)


def test_transfer_s(impl):
    check_transfer(impl)


def test_all_five_equal_the_reference_on_drawn_prompts_fleets_and_numbers(impl):
    check_drawn_inputs(impl)


# --- the answer agrees with minillm -------------------------------------------------------------------------------
@CHECKS
def test_the_reference_keys_are_the_allocators():
    for n, block_size in KEY_CASES:
        tokens = numbered(n)
        allocator = BlockAllocator(16, block_size, prefix_caching=True)
        allocator.append(0, max(n, 1))
        allocator.cache_full_blocks(0, tokens)
        keyed = [allocator.key_of[b] for b in allocator.tables[0] if b in allocator.key_of]
        assert prompt_keys(tokens, block_size) == keyed, (n, block_size)


@CHECKS
def test_the_reference_routes_as_the_servers_router():
    from minillm.serving.routing import CacheAware, ReplicaView

    rng, router = random.Random(13), CacheAware()
    for _ in range(2000):
        n = rng.randint(1, 4)
        loads = [rng.choice((0, 5, 10, 20, 40)) for _ in range(n)]
        caches = [set(K[: rng.randint(0, 5)]) - ({K[0]} if rng.random() < 0.2 else set()) for _ in range(n)]
        cost = rng.choice((0, 10, 30))
        views = [ReplicaView(i, loads[i], caches[i]) for i in range(n)]
        assert route(K, loads, caches, cost) == router.choose(K, cost, views).replica, (loads, caches, cost)


@CHECKS
def test_the_reference_prices_as_the_cost_model():
    from minillm.card.hardware import LINKS
    from minillm.card.kv_transfer import kv_transfer
    from minillm.card.modelspec import load_spec

    for name in ("llama-3.1-8b", "llama-3.1-70b"):
        spec = load_spec(name)
        for tp, kv_dtype, bits in ((1, "bf16", 16), (2, "fp8", 8), (8, "bf16", 16)):
            move = kv_transfer(spec, 3000, LINKS["ib-400"], kv_dtype, tp)
            ours = kv_bytes(spec.layers, spec.heads, spec.kv_heads, spec.head_dim, 3000, bits, tp)
            assert ours == move.bytes
            assert transfer_s(ours, 400, 10e-6) == pytest.approx(move.seconds, rel=1e-12)


# --- the checks catch plausible mistakes, and accept correct solutions written differently ----------------------
def keys_written(no_predecessor=False, partial=False, short=False, whole_prefix=False):
    def prompt_keys(token_ids, block_size):
        keys, key = [], b""
        end = len(token_ids) if partial else len(token_ids) - block_size + (0 if short else 1)
        for start in range(0, end, block_size):
            block = token_ids[start : start + block_size]
            if whole_prefix:
                key = block_key(b"", token_ids[: start + block_size])
            else:
                key = block_key(b"" if no_predecessor else key, block)
            keys.append(key)
        return keys

    return prompt_keys


def matched_past_the_miss(keys, held):
    return sum(k in held for k in keys)


def matched_all_or_nothing(keys, held):
    return len(keys) if all(k in held for k in keys) else 0


def route_written(inverted=False, at_most=False, no_load_tie=False, last_index=False, no_overload=False,
                  at_limit=False, no_cost=False, fixed_factor=False, matches_past_miss=False, pops=False,
                  least_by_run=False):  # fmt: skip
    def route(keys, loads, caches, cost, min_match=2, overload_factor=1.5):
        count = matched_past_the_miss if matches_past_miss else matched_blocks
        run = [count(keys, held) for held in caches]
        order = list(range(len(loads)))[::-1] if last_index else list(range(len(loads)))
        best = min(order, key=lambda i: (-run[i],) + (() if no_load_tie else (loads[i],)))
        least = min(order, key=lambda i: loads[i])
        if least_by_run:  # the best's key reused: least loaded ties go to the longest run (wrong: the lower index)
            least = min(order, key=lambda i: (loads[i], -run[i]))
        limit = (1.5 if fixed_factor else overload_factor) * loads[least] + (0 if no_cost else cost)
        overloaded = not no_overload and (loads[best] >= limit if at_limit else loads[best] > limit)
        short = run[best] <= min_match if at_most else run[best] < min_match
        if pops:
            caches.pop()  # a side effect
        if short or overloaded:
            return best if inverted and short else least
        return least if inverted else best

    return route


def with_(**parts):
    return SimpleNamespace(**{**vars(REFERENCE), **parts})


WRONG = {
    "keys-without-their-predecessor": (with_(prompt_keys=keys_written(no_predecessor=True)),
                                       "blocks keyed without their predecessor"),
    "a-partial-last-block-keyed": (with_(prompt_keys=keys_written(partial=True)), "a partial last block keyed"),
    "the-last-full-block-missing": (with_(prompt_keys=keys_written(short=True)), "the last full block is missing"),
    "keyed-by-the-whole-prefix": (with_(prompt_keys=keys_written(whole_prefix=True)), "by the whole prefix's tokens"),
    "matches-counted-past-the-first-miss": (with_(matched_blocks=matched_past_the_miss), "past the first miss"),
    "matches-all-or-nothing": (with_(matched_blocks=matched_all_or_nothing), "all or nothing"),
    "the-fallback-inverted": (with_(route=route_written(inverted=True)), "the fallback inverted"),
    "min-match-by-at-most": (with_(route=route_written(at_most=True)), "SHORTER than min_match"),
    "ties-not-broken-by-load": (with_(route=route_written(no_load_tie=True)), "ties not broken by load"),
    "ties-to-the-last-index": (with_(route=route_written(last_index=True)), "ties not broken stably"),
    "no-overload-check": (with_(route=route_written(no_overload=True)), "the overloaded replica kept its hit"),
    "overloaded-at-the-limit": (with_(route=route_written(at_limit=True)), "OVER the limit"),
    "cost-left-out": (with_(route=route_written(no_cost=True)), "the request's own tokens (cost) left out"),
    "a-fixed-overload-factor": (with_(route=route_written(fixed_factor=True)), "overload_factor is the given one"),
    "route-counts-past-the-miss": (with_(route=route_written(matches_past_miss=True)), "counted past its first miss"),
    "route-changes-the-caches": (with_(route=route_written(pops=True)), "a side effect"),
    # right on every hand-built fleet (where the least loaded tie, nobody holds a block); the drawn fleets catch it
    "least-loaded-ties-to-the-longest-run": (with_(route=route_written(least_by_run=True)), "share the least load"),
    **{f"kv-{m}": (with_(kv_bytes=answer(m).kv_bytes), f"likely mistake: {KNOWN_MISTAKES[m]}")
       for m in ("bits", "floor-bits", "keys-only", "one-layer", "query-heads", "tp-not-divided")},
    **{m: (with_(transfer_s=answer(m).transfer_s), f"likely mistake: {KNOWN_MISTAKES[m]}")
       for m in ("transfer-bits", "transfer-gib", "transfer-no-latency", "transfer-halved")},
}  # fmt: skip
DRAWN_ONLY = ["least-loaded-ties-to-the-longest-run"]  # only the drawn fleets catch these


def keys_by_accumulate(token_ids, block_size):
    """Right, written differently: the chain as an accumulation over the full blocks."""
    full = len(token_ids) // block_size
    blocks = [token_ids[i * block_size : (i + 1) * block_size] for i in range(full)]
    return list(itertools.accumulate(blocks, block_key, initial=b""))[1:]


def matched_by_takewhile(keys, held):
    return sum(1 for _ in itertools.takewhile(held.__contains__, keys))


def route_by_sorting(keys, loads, caches, cost, min_match=2, overload_factor=1.5):
    """Right, written differently: every replica ranked once, candidates as tuples."""
    ranked = sorted((-matched_by_takewhile(keys, held), load, i) for i, (load, held) in enumerate(zip(loads, caches)))
    least_load, least = min((load, i) for i, load in enumerate(loads))
    run, load, best = -ranked[0][0], ranked[0][1], ranked[0][2]
    hit = run >= min_match and load <= overload_factor * least_load + cost
    return best if hit else least


def kv_bytes_per_number_first(layers, heads, kv_heads, head_dim, tokens, kv_bits=16, tp=1):
    per_token_per_card = 2 * layers * (kv_heads // tp) * head_dim * (kv_bits / 8)
    return per_token_per_card * tokens


def transfer_in_gb_per_s(nbytes, link_gbit_per_s, latency_s):
    gb_per_s = link_gbit_per_s / 8  # 400 Gb/s = 50 GB/s
    return nbytes / (gb_per_s * 1e9) + latency_s


RIGHT = {
    "the-reference": REFERENCE,
    "accumulate-takewhile-and-sorting": SimpleNamespace(prompt_keys=keys_by_accumulate,
                                                        matched_blocks=matched_by_takewhile, route=route_by_sorting,
                                                        kv_bytes=kv_bytes_per_number_first,
                                                        transfer_s=transfer_in_gb_per_s),
}  # fmt: skip


@CHECKS
@pytest.mark.parametrize("right", RIGHT.values(), ids=RIGHT.keys())
def test_a_correct_version_passes(right):
    check_all(right)


@CHECKS
@pytest.mark.parametrize("name", WRONG)
def test_the_checks_catch_a_wrong_version_and_name_the_mistake_first(name):
    wrong, hint = WRONG[name]
    first, message = failure_of(check_all, wrong)
    assert hint in first, message
    if not hint.startswith("likely mistake"):  # the situation comes first: which function, in which case
        assert first.startswith(("prompt_keys, ", "matched_blocks, ", "route, ")), first


@CHECKS
@pytest.mark.parametrize("name", DRAWN_ONLY)
def test_the_drawn_fleets_catch_what_the_cases_miss(name):
    wrong, hint = WRONG[name]
    check_cases(wrong)  # every hand-built case passes it
    first, message = failure_of(check_drawn_inputs, wrong)
    assert first.startswith("route, ") and hint in first, message


@CHECKS
def test_two_mistakes_at_once_get_the_plain_line():
    both = answer("bits")
    wrong = with_(kv_bytes=lambda *a: both.kv_bytes(*a) * 2)
    first, _ = failure_of(check_all, wrong)
    assert first.startswith("kv_bytes, ") and "yours gives" in first, first


@CHECKS
def test_the_stub_is_rejected():
    stubs = SimpleNamespace(**{name: stub for name in vars(REFERENCE)})
    for part in (check_keys, check_matched, check_route, check_kv, check_transfer):
        with pytest.raises(NotImplementedError):
            part(stubs)


@CHECKS
def test_the_routers_own_functions_are_refused(tmp_path):
    path = tmp_path / "lesson13_fleet.py"
    path.write_text("from minillm.serving.routing import matched_blocks\n")
    with pytest.raises(AssertionError, match="you import from minillm.serving.routing; write it yourself"):
        assert_writes_its_own(SimpleNamespace(__file__=str(path)))
