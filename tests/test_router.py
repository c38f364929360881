"""Replicas behind a router (serving/routing.py, serving/router.py): the policies on hand-made views, block keys as the
allocator makes them, the fleet's metrics text, and the router's books under random crowds with a replica killed
mid-run (every request ends exactly once, on one replica or retried once elsewhere when nothing was streamed, with
the plain loop's tokens; the dead replica is never chosen again). The server with --replicas: test_router_server.py.

Each test that starts engine processes stops them, even when it fails.
"""

from __future__ import annotations

import os
import random
import signal
import time

import pytest

from minillm.engine.blocks import BlockAllocator
from minillm.engine.generate import generate
from minillm.engine.request import Request
from minillm.errors import ConfigError
from minillm.model.tokenizer import encode_prompt
from minillm.serving.engine_process import EngineProcess
from minillm.serving.live_metrics import fleet_text
from minillm.serving.router import Router
from minillm.serving.routing import (
    CacheAware,
    LeastLoaded,
    ReplicaView,
    RoundRobin,
    matched_blocks,
    prompt_keys,
    shareable,
)
from minillm.serving.server import build_fleet, build_loop
from minillm.serving.token_stream import TokenStream
from minillm.training import tasks

KEYS = [bytes([i]) * 4 for i in range(6)]  # a prompt's block keys, hand-made


# --- policies ------------------------------------------------------------------------------------
def test_round_robin_cycles_and_skips_a_replica_out_of_rotation():
    views = [ReplicaView(i) for i in range(3)]
    policy = RoundRobin()
    assert [policy.choose(KEYS, 10, views).replica for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    without_1 = [views[0], views[2]]  # replica 1 left the rotation: the order goes on without it
    assert [policy.choose(KEYS, 10, without_1).replica for _ in range(3)] == [2, 0, 2]
    assert policy.choose(KEYS, 10, views).reason == "round_robin"


def test_least_loaded_picks_the_least_and_breaks_ties_by_index():
    views = [ReplicaView(0, load=50), ReplicaView(1, load=20), ReplicaView(2, load=20)]
    assert LeastLoaded().choose(KEYS, 10, views).replica == 1
    assert LeastLoaded().choose(KEYS, 10, views[::-1]).replica == 1  # the order of the view does not matter
    assert LeastLoaded().choose(KEYS, 10, [ReplicaView(2, 5), ReplicaView(0, 9)]).replica == 2


def test_cache_aware_picks_the_longest_run_of_cached_blocks():
    views = [ReplicaView(0, 0, set(KEYS[:2])), ReplicaView(1, 100, set(KEYS[:4])), ReplicaView(2, 0, set(KEYS[1:]))]
    choice = CacheAware().choose(KEYS, 200, views)
    assert (choice.replica, choice.reason, choice.matched_blocks) == (1, "prefix_hit", 4)  # (2 holds 5, not a run)


def test_cache_aware_falls_back_to_least_loaded_when_the_match_is_short():
    views = [ReplicaView(0, 30, set(KEYS[:1])), ReplicaView(1, 10)]
    choice = CacheAware(min_match_blocks=2).choose(KEYS, 20, views)
    assert (choice.replica, choice.reason, choice.matched_blocks) == (1, "short_match", 1)
    assert CacheAware(min_match_blocks=1).choose(KEYS, 20, views).reason == "prefix_hit"


def test_cache_aware_falls_back_to_least_loaded_when_the_best_is_overloaded():
    cost = 40  # the request's own tokens: the bound is 1.5 x the least loaded's load + cost
    held = set(KEYS)
    at_bound = [ReplicaView(0, int(1.5 * 100) + cost, held), ReplicaView(1, 100)]
    assert CacheAware().choose(KEYS, cost, at_bound).replica == 0  # at the bound: still the cached one
    over = [ReplicaView(0, int(1.5 * 100) + cost + 1, held), ReplicaView(1, 100)]
    choice = CacheAware().choose(KEYS, cost, over)
    assert (choice.replica, choice.reason) == (1, "overloaded")


def test_cache_aware_ties_go_to_the_less_loaded_then_the_lower_index():
    held = set(KEYS[:3])
    views = [ReplicaView(0, 20, held), ReplicaView(1, 10, held), ReplicaView(2, 10, held)]
    assert CacheAware().choose(KEYS, 5, views).replica == 1
    assert CacheAware().choose(KEYS, 5, views[::-1]).replica == 1
    assert CacheAware().choose([], 5, views).reason == "short_match"  # a prompt shorter than a block


def test_a_match_is_a_run_from_the_first_block():
    assert matched_blocks(KEYS, set(KEYS[1:])) == 0
    assert matched_blocks(KEYS, set(KEYS[:3]) | {KEYS[4]}) == 3
    assert matched_blocks(KEYS, set(KEYS)) == len(KEYS)


def test_prompt_keys_are_the_allocators_keys():
    """The router names a prompt's blocks as the allocator does, and a hit covers as many blocks as it says."""
    block = 4
    allocator = BlockAllocator(16, block, prefix_caching=True)
    prompt = list(range(1, 15))  # 3 full blocks and 2 tokens
    allocator.allocate(0, len(prompt))
    allocator.cache_full_blocks(0, prompt)
    keys = prompt_keys(prompt, block)
    assert len(keys) == 3 and set(keys) == set(allocator.key_of.values())
    for length in (12, 13, 14, 16):  # the allocator leaves the last token to compute: 12 tokens share 2 blocks
        newcomer = prompt[:length] + [99] * max(0, length - len(prompt))
        hit = allocator.cached_prefix(newcomer)
        assert len(hit) == matched_blocks(shareable(prompt_keys(newcomer, block), length, block), allocator.block_of)
    assert prompt_keys(prompt[:3], block) == []


def test_fleet_text_labels_every_sample_with_its_replica():
    one = (
        "# HELP minillm_a An a.\n# TYPE minillm_a gauge\nminillm_a 3\n# HELP minillm_b A b.\n# TYPE minillm_b counter\n"
    )
    one += 'minillm_b{outcome="eos"} 7\n'
    rows = [{"replica": i, "state": s, "in_flight": 1, "load_tokens": 9, "prompt_tokens": 20, "hit_tokens": 16,
             "routed": {"prefix_hit": 2}} for i, s in enumerate(["ok", "failed"])]  # fmt: skip
    text = fleet_text({0: one, 1: one.replace(" 3\n", " 4\n")}, rows, {"retried": 1, "failed": 2})
    lines = text.splitlines()
    assert lines.count("# HELP minillm_a An a.") == 1 and lines.count("# TYPE minillm_b counter") == 1
    assert 'minillm_a{replica="0"} 3' in lines and 'minillm_a{replica="1"} 4' in lines
    assert 'minillm_b{replica="1",outcome="eos"} 7' in lines
    assert lines.index('minillm_a{replica="1"} 4') < lines.index("# HELP minillm_b A b.")  # a metric's samples together
    assert 'minillm_replica_up{replica="0"} 1' in lines and 'minillm_replica_up{replica="1"} 0' in lines
    assert 'minillm_router_routed_total{replica="1",reason="prefix_hit"} 2' in lines
    assert "minillm_router_retried_total 1" in lines and "minillm_router_failed_total 2" in lines


# --- the books, with processes ---------------------------------------------------------------------------
def events_of(stream: TokenStream, timeout: float = 60.0) -> list:
    events = []
    while not events or events[-1].kind not in ("done", "refused"):
        events.append(stream.get(timeout=timeout))
    return events


def random_request(rng: random.Random, rid: str) -> Request:
    preamble = rng.choice([None, *tasks.PREAMBLES.values()])
    prompt = rng.choice(["count down from", "spell"]) + f" {rng.randint(3, 40)}"
    return Request(rid, encode_prompt(prompt, preamble), rng.randint(3, 40), ignore_eos=rng.random() < 0.5)


@pytest.mark.parametrize("route, seed", [("cache-aware", 0), ("round-robin", 1)])
def test_the_books_stay_exact_when_a_replica_dies_mid_run(shipped_model, route, seed):
    rng = random.Random(seed)
    requests = [random_request(rng, f"q{i}") for i in range(24)]
    router = build_fleet(shipped_model, 2, route, slots=2, prefix_caching=True)
    try:
        router.start()
        streams, victim = {}, None
        for i, request in enumerate(requests):
            streams[request.id] = TokenStream()
            router.submit(request, streams[request.id])
            time.sleep(rng.uniform(0, 0.03))
            if victim is None and i >= 6:
                victim = kill_a_busy_replica(router, first=router.flights.get(request.id))
        deadline = time.monotonic() + 120  # (a bound for a hang: the moment comes once the replicas make tokens)
        while victim is None and router.flights and time.monotonic() < deadline:
            victim = kill_a_busy_replica(router)
        assert victim is not None, "every request ended before a replica was busy: no moment to kill one came"
        after_kill = len(router.log)  # (the victim is out of rotation: its requests were failed or placed again)
        ends = {rid: events_of(stream) for rid, stream in streams.items()}
        time.sleep(0.3)  # (anything sent after an end would have arrived by now)
        assert all(stream._events.empty() for stream in streams.values()), "events after a request's end"
    finally:
        router.stop()
    assert all(not r.loop.process.is_alive() for r in router.replicas)
    routes = {}
    for rid, replica, _ in router.log:
        routes.setdefault(rid, []).append(replica)
    assert all(replica != victim for _, replica, _ in list(router.log)[after_kill:]), "the dead replica was chosen"
    assert router.flights == {} and all(r.flights == {} for r in router.replicas), "the books kept a request"
    failed = retried = 0
    for request in requests:
        events, path = ends[request.id], routes[request.id]
        kinds = [e.kind for e in events]
        assert kinds[0] == "accepted" and kinds.count("accepted") == 1 and kinds.count("done") == 1, kinds
        tokens = [t for e in events for t in e.tokens]
        if events[-1].detail.startswith("error"):  # it was mid-reply on the replica that died
            failed += 1
            assert path == [victim] and tokens and f"replica {victim} failed" in events[-1].detail
            continue
        assert len(path) in (1, 2) and (len(path) == 1 or (path[0] == victim and path[1] != victim)), path
        retried += len(path) == 2
        want = generate(shipped_model, request.prompt_ids, request.max_new_tokens, ignore_eos=request.ignore_eos)
        assert tokens == want.tokens, f"{request.id} on {path}: not the plain loop's reply"
    # it died with a reply under way (failed) and a request without a token yet (retried), as die_if_busy saw it
    assert (router.failed, router.retried) == (failed, retried) and failed >= 1 and retried >= 1


def kill_a_busy_replica(router: Router, first=None) -> int | None:
    """Ask each serving replica in turn (`first`'s, a flight's, first) to die if it is busy (die_if_busy); the one
    that died, or None. Asked between two of its steps, its death falls where the books, once its pipe is read to
    the end, say exactly what it had streamed: no race between a kill and the replica's next step."""
    replicas = [r for r in router.replicas if r.serving]
    replicas.sort(key=lambda r: first is None or r.index != first.replica)
    for replica in replicas:
        try:
            replica.loop.ask(die_if_busy).result(timeout=60)  # (it answers only when it is not busy)
        except RuntimeError:  # its process stopped, and the answer with it
            replica.loop.process.join(10)  # (its pipe closes a moment before it can be reaped)
            assert replica.loop.process.exitcode == -signal.SIGKILL, replica.loop.error  # killed, not crashed
            return replica.index
    return None


def die_if_busy(engine) -> bool:
    """(Run in a replica's process, between two steps.) With a reply under way and a request without a token yet,
    end this process as a kill would; otherwise say it is not busy. (Its tokens go out at every step, stream_interval
    1: what it made is what the books hear. It crosses the pipe by name: the replica imports this module to run it.)"""
    unfinished = [r for r in engine.requests if not r.is_finished]
    if any(r.output_ids for r in unfinished) and any(not r.output_ids for r in unfinished):
        os.kill(os.getpid(), signal.SIGKILL)
    return False


def test_a_replica_that_cannot_start_stops_them_all(shipped_model):
    from minillm.config import EngineConfig

    good = build_loop(shipped_model, slots=2, process=True)
    bad = EngineProcess(shipped_model, "no-such-scheduler", 256, EngineConfig(slots=2))
    router = Router([good, bad])
    try:
        with pytest.raises(ConfigError, match="replica 1 of 2 could not start"):
            router.start()
    finally:
        router.stop()
    assert not good.process.is_alive() and not bad.process.is_alive() and not router.alive


# --- the bench entry -------------------------------------------------------------------------------------
def test_the_fleet_bench_reads_the_fleets_metrics_and_reports_every_policy():
    from minillm.bench import fleet
    from minillm.bench.suite import BENCHES

    assert BENCHES["fleet"] is fleet.bench_fleet
    rows = [{"replica": i, "state": "ok", "in_flight": 0, "load_tokens": 0, "prompt_tokens": 400 * (i + 1),
             "hit_tokens": 100 * (i + 1), "routed": {"prefix_hit": 3, "short_match": i}} for i in range(2)]  # fmt: skip
    replica = "# HELP minillm_prefill_tokens_total P.\n# TYPE minillm_prefill_tokens_total counter\n"
    figures = fleet.fleet_figures(
        fleet_text({0: replica + "minillm_prefill_tokens_total 300\n"}, rows, {"retried": 0, "failed": 0})
    )
    assert figures["prompt_tokens"] == 1200 and figures["prompt_tokens_from_cache"] == 300
    assert figures["prefix_hit_rate"] == 0.25 and figures["prompt_tokens_computed"] == 300
    assert figures["routed"] == {"prefix_hit": 6, "short_match": 1}
    jobs = fleet.tenant_jobs(40, 6.0, fleet.TENANTS)
    assert len({job.preamble for job in jobs}) == fleet.TENANTS
    assert all(len(encode_prompt(job.prompt, job.preamble)) + job.max_tokens < tasks.CONTEXT for job in jobs)
    row = figures | {"finished": 40, "errors": 0, "tokens_per_s": 300.0, "ttft_p50_s": 0.02, "ttft_p99_s": 0.2}
    result = {"requests": 40, "rate_per_s": 6.0, "tenants": 8, "slots": 8, "rounds": 1, "num_blocks": 128,
              "tenant_blocks": 169, "rows": dict.fromkeys(fleet.ROUTES, row), "runs": {k: [row] for k in fleet.ROUTES},
              "hit_ratio": 1.0, "ttft_p99_ratio": 1.0, "met": False, "disaggregated": None}  # fmt: skip
    text = "\n".join(fleet.markdown(result))
    assert all(f"| {route} | 25.0% | 300 |" in text for route in fleet.ROUTES) and "**not met**" in text
