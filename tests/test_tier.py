"""A second KV tier in host memory (layers/tier.py): returning users find their history there when the device has let
it go, the preempted come back by copy above a length, the host pool's own evictions cost only recomputation, and
every token is the one-user loop's; on a simulated card the copies are charged at the host link's bandwidth."""

from __future__ import annotations

import random
import re

import pytest

from minillm.card import whatif
from minillm.card.hardware import get_device
from minillm.card.host_link import host_copy_seconds
from minillm.card.modelspec import load_spec
from minillm.card.simulate import SimulatedRunner
from minillm.card.swap_cost import crossover, recompute_seconds, swap_seconds
from minillm.config import EngineConfig
from minillm.engine.generate import generate
from minillm.engine.request import Request
from minillm.engine.scheduler import ContinuousScheduler
from minillm.errors import ConfigError
from minillm.layers import LayeredEngine
from minillm.runs.metrics import summarize
from tests.conftest import random_model

MODEL = random_model("gqa")  # (a context of 256)


def returning_users(users: int = 6, turns: int = 3, history: int = 100, reply: int = 8) -> list[Request]:
    """Each user asks again every 40 steps on the same long history (a conversation's prefix), in turn."""
    rng = random.Random(0)
    histories = [[rng.randrange(256) for _ in range(history)] for _ in range(users)]
    return [Request(f"u{u}t{t}", h + [t, u, 7], reply, ignore_eos=True, arrival_step=t * 40 + u * 3)
            for t in range(turns) for u, h in enumerate(histories)]  # fmt: skip


def serve(requests: list[Request], model=MODEL, **how) -> LayeredEngine:
    cfg = EngineConfig(**{"slots": 2, "block_size": 16, "num_blocks": 20, "prefix_caching": True, "max_len": 256,
                          "debug": True} | how)  # fmt: skip
    engine = LayeredEngine(model, ContinuousScheduler(token_budget=None), cfg)
    for r in requests:
        engine.submit(r)
    engine.run()
    return engine


def exact(requests: list[Request]) -> bool:
    return all(r.output_ids == generate(MODEL, r.prompt_ids, r.max_new_tokens, use_cache=False, ignore_eos=True).tokens
               for r in requests)  # fmt: skip


def test_returning_users_find_their_history_in_host_memory():
    """20 device blocks cannot keep six users' 7-block histories between their turns; 64 host blocks can."""
    alone, tiered = returning_users(), returning_users()
    device_only, with_tier = serve(alone), serve(tiered, host_blocks=64)
    hit = lambda e: summarize(e.trace())["prefix_hit_rate"]
    assert hit(with_tier) >= 2 * hit(device_only) and hit(with_tier) > 0.5, (hit(device_only), hit(with_tier))
    events = with_tier.trace().config["tier_events"]
    assert events["loaded"] > 0 and events["written"] > 0
    assert sum(r.prefill_tokens for r in tiered) < sum(r.prefill_tokens for r in alone) / 2
    assert exact(alone) and exact(tiered)
    assert with_tier.cache.allocator.num_free == 20


def test_a_small_host_pool_forgets_the_least_recently_used_and_stays_exact():
    requests = returning_users()
    engine = serve(requests, host_blocks=8)  # (one history and a bit)
    assert len(engine.tier.host.slot_of) == 8 and exact(requests)


@pytest.mark.parametrize("swap_above", [0, 10_000], ids=["swap", "recompute"])
def test_the_preempted_come_back_by_copy_above_a_length(swap_above):
    rng = random.Random(1)
    requests = [Request(f"r{i}", [rng.randrange(256) for _ in range(40)], 60, ignore_eos=True) for i in range(4)]
    engine = serve(requests, slots=4, num_blocks=16, host_blocks=64, swap_above=swap_above)
    events = engine.trace().config["tier_events"]
    preempted = sum(r.preemptions for r in requests)
    assert preempted > 0, "the pool was meant to run short"
    assert events["swapped" if swap_above == 0 else "recomputed"] == preempted
    recomputed = sum(r.prefill_tokens for r in requests) - 4 * 40
    assert (recomputed < preempted * 16) if swap_above == 0 else (recomputed >= preempted * 40)
    assert exact(requests) and engine.cache.allocator.num_free == 16


def test_a_simulated_card_charges_the_copies_at_the_host_links_bandwidth():
    spec, card = load_spec("llama-3.1-8b"), get_device("h100-sxm")
    runner = lambda: SimulatedRunner(spec, card)  # noqa: E731
    requests = lambda: [replace_ids(r) for r in returning_users(users=4, history=512, reply=32)]  # noqa: E731
    plain = serve(requests(), runner(), num_blocks=48, max_len=2048)
    tiered = serve(requests(), runner(), num_blocks=48, max_len=2048, host_blocks=512)
    assert tiered.trace().config["tier_events"]["loaded"] > 0
    # 512 tokens of 128 KiB (32 layers x 8 kv heads x 128 x 2 x bf16) over PCIe 5.0's 63 GB/s each way, + 20 us
    assert host_copy_seconds(spec, card, 512) == pytest.approx(20e-6 + 512 * 131_072 / 63e9)
    busy = lambda e: e.runner.busy_s
    assert busy(tiered) < busy(plain)  # (copying a history back is cheaper than computing it again)


def replace_ids(r: Request) -> Request:
    r.planned_reply = r.max_new_tokens  # (a simulated model replies this long)
    return r


def test_a_tier_needs_prefix_caching_and_whole_numbers():
    with pytest.raises(ConfigError, match="prefix caching"):
        EngineConfig(host_blocks=8)
    with pytest.raises(ConfigError, match="host_blocks must be a whole number"):
        EngineConfig(prefix_caching=True, host_blocks=-1)


@pytest.mark.parametrize("gpu", ["h100-sxm", "a100-80gb-sxm"])
def test_recompute_below_a_length_copy_back_above_it(gpu):
    """The crossover is one crossing: recomputing is cheaper below it (the chunk rides in a memory-bound step), copying
    back at and above it (the chunk has made the step compute-bound), at every length sampled."""
    spec, card = load_spec("llama-3.1-8b"), get_device(gpu)
    cross = crossover(spec, card, batch=16, context=2048)
    assert cross is not None and 16 < cross < 1024
    cheaper = lambda n: swap_seconds(spec, card, n) < recompute_seconds(spec, card, n, 16, 2048)  # noqa: E731
    assert not any(cheaper(n) for n in range(1, cross, 7)) and all(cheaper(n) for n in range(cross, 8192, 97))
    plan = whatif.plan(spec, card, context=2048, batch=16)
    assert plan["preempted"]["crossover_tokens"] == cross and f"below {cross:,} tokens" in whatif.summary(plan)
    assert whatif.plan(spec, get_device("apple-m2-ultra"), context=2048)["preempted"] is None  # (one memory)


def test_run_serves_returning_users_with_a_host_tier_from_the_command_line(capsys):
    from minillm.__main__ import main

    argv = ["run", "--workload", "multi-turn", "--requests", "8", "--rate-per-s", "100", "--think-s", "0.02",
            "--prefix-caching", "--num-blocks", "16", "--slots", "2", "--seed", "3"]  # fmt: skip
    assert main([*argv, "--host-blocks", "256"]) == 0
    lines = capsys.readouterr().out.splitlines()
    tier = next(line for line in lines if line.strip().startswith("host tier"))
    written, loaded = map(int, re.search(r"(\d+) blocks written to host memory, (\d+) loaded back", tier).groups())
    assert written > 0 and loaded > 0, tier
    assert main(["run", "--workload", "chat", "--host-blocks", "8"]) == 2  # (without --prefix-caching)
    assert "--prefix-caching" in capsys.readouterr().err


def test_the_tier_bench_entry_runs_small_and_reports(shipped_model, monkeypatch):
    from types import SimpleNamespace

    from minillm.bench import tier
    from minillm.bench.report import markdown
    from minillm.bench.suite import BENCHES

    assert BENCHES["tier"] is tier.bench_tier
    monkeypatch.setattr(tier, "TINY_CROWDS", ((4, 12),))  # (the entry at a small size: a few seconds)
    monkeypatch.setattr(tier, "CARD_POOLS", (256,))
    monkeypatch.setattr(tier, "THINK_S", 0.02)
    monkeypatch.setattr(tier, "SWAP_USERS", 24)  # (12 users on 8 seats and 40 blocks: still preempting)
    r = tier.bench_tier(shipped_model, SimpleNamespace(quick=True))
    alone, tiered = r["cards"][0]["rows"]
    assert tiered["hit_rate"] > alone["hit_rate"] and tiered["prefill_tokens"] < alone["prefill_tokens"]
    copy, again = r["swap"]
    assert copy["tier"]["swapped"] == copy["preemptions"] > 0 and again["tier"]["recomputed"] == again["preemptions"]
    assert copy["recomputed_tokens"] < again["recomputed_tokens"]
    assert [x["crossover_tokens"] for x in r["priced"]] == sorted(
        (x["crossover_tokens"] for x in r["priced"]), reverse=True
    )  # (busier steps, slower cards: sooner)
    text = markdown({"machine": "m", "device": "cpu", "date": "d", "tier": r}, "python -m minillm bench", "plots")
    assert "## 22. A second KV tier" in text and "recompute below" in text
