"""The multi-turn workload: every turn is the whole conversation so far, sent a think after the last reply ended, so
a prefix cache serves the history; the same driver on a simulated card; conversations end at the context."""

import pytest

from minillm.card.hardware import get_device
from minillm.card.modelspec import load_spec
from minillm.card.simulate import SimulatedRunner
from minillm.errors import ConfigError
from minillm.runs.conversations import (
    LMSYS_PROMPT_TOKENS,
    LMSYS_REPLY_TOKENS,
    ConversationKnobs,
    Conversations,
    conversation_engine,
    run_conversations,
)
from minillm.runs.metrics import summarize
from tests.conftest import random_model

# A small crowd that talks a lot, at 0.15 of the published lengths (the tiny scale is 0.25: fast), its thinks fixed.
CROWD = dict(users=5, rate_per_s=100.0, think_s=0.02, think_spread=0.0, mean_turns=3.0, turns=4, scale=0.15)


def turns_of(trace) -> dict[tuple[int, int], object]:
    """(user, turn) -> its request record, from ids like "u3t1"."""
    return {tuple(int(x) for x in r.id[1:].split("t")): r for r in trace.requests}


def check_conversations(engine, driver, trace):
    """Every turn extends the previous one token for token, arrives its think after that reply ended, runs to its
    drawn length; every user's script is played to its end (or to the context); every block comes back."""
    turns = turns_of(trace)
    for (user, t), r in turns.items():
        script = driver.scripts[user][t]
        assert r.finish_reason == "length" and len(r.output_ids) == script.reply, f"{r.id} did not run to its length"
        if t == 0:
            continue
        before = turns[user, t - 1]
        assert r.prompt_ids == before.prompt_ids + before.output_ids + script.message, f"{r.id} is not the history"
        assert r.arrival_s == pytest.approx(before.finish_s + script.think)
        assert r.arrival_s >= before.finish_s + driver.knobs.think_s * (1 - driver.knobs.think_spread) - 1e-9
        assert r.first_token_s >= r.arrival_s, f"{r.id} was served before it arrived"
    for user, script in enumerate(driver.scripts):
        played = sum(1 for u, _ in turns if u == user)
        ended = driver.ended[user]
        assert played == len(script) if ended == "done" else ended == "context" and played < len(script)
    assert engine.cache.allocator.num_free == engine.cache.num_blocks, "KV blocks leaked"
    assert not engine.has_work()


def serve(model, **cfg):
    engine, driver = conversation_engine(model, ConversationKnobs(**CROWD), slots=4, **cfg)
    return engine, driver, engine.run()


@pytest.fixture(scope="module")
def served(shipped_model):
    """The crowd on the shipped model, prefix caching on and off."""
    return {on: serve(shipped_model, prefix_caching=on) for on in (True, False)}


@pytest.mark.parametrize("caching", [True, False])
def test_each_turn_is_the_whole_conversation_sent_a_think_after_the_last_reply(served, caching):
    engine, driver, trace = served[caching]
    check_conversations(engine, driver, trace)
    assert any(t > 0 for _, t in turns_of(trace)), "no one came back: the crowd tests nothing"
    assert all(reason == "done" for reason in driver.ended.values())  # (these short ones all fit)


def test_a_prefix_cache_serves_the_history(served):
    on, off = (summarize(served[caching][2])["prefix_hit_rate"] for caching in (True, False))
    assert on > 0.4 and off == 0.0, f"hit rate {on:.2f} with prefix caching, {off:.2f} without"
    engine, _, trace = served[True]
    turns, block = turns_of(trace), engine.cfg.block_size
    for (user, t), r in turns.items():  # the pool holds everyone: a later turn finds every full block of the last
        if t:
            before = turns[user, t - 1]
            kept = (len(before.prompt_ids) + len(before.output_ids) - 1) // block * block  # (its last token never ran)
            assert r.prompt_tokens_from_cache >= kept, f"{r.id} recomputed history the cache held"


def test_the_same_driver_runs_on_a_simulated_card():
    runner = SimulatedRunner(load_spec("llama-3.1-8b"), get_device("h100-sxm"))
    knobs = ConversationKnobs(users=12, rate_per_s=4.0, think_s=2.0, mean_turns=3.0, seed=1)
    engine, driver = conversation_engine(runner, knobs, prefix_caching=True, num_blocks=4096)
    trace = engine.run()
    check_conversations(engine, driver, trace)
    figures = summarize(trace)
    assert trace.config["clock"] == "simulated" and trace.config["workload"] == "multi-turn"
    assert figures["prefix_hit_rate"] > 0.5 and engine.clock.now() > knobs.think_s
    # the published lengths, unscaled: the drawn means are near them
    turns = [t for script in driver.scripts for t in script]
    assert 0.5 < sum(t.reply for t in turns) / len(turns) / LMSYS_REPLY_TOKENS < 1.6
    assert 0.5 < sum(len(t.message) for t in turns) / len(turns) / LMSYS_PROMPT_TOKENS < 1.6
    # placeholders: no two users' first blocks alike, so no hit comes from another user
    firsts = [r.prompt_ids[:16] for r in trace.requests if r.id.endswith("t0")]
    assert len({tuple(ids) for ids in firsts}) == len(firsts)


def test_a_conversation_that_would_outgrow_the_context_ends_early():
    model = random_model("gqa")  # a context of 256 tokens
    knobs = ConversationKnobs(users=6, rate_per_s=100.0, think_s=0.0, mean_turns=6.0, scale=0.6)
    engine, driver = conversation_engine(model, knobs, slots=4)
    trace = engine.run()
    check_conversations(engine, driver, trace)
    assert "context" in driver.ended.values()
    assert not any((r.finish_reason or "").startswith("rejected") for r in trace.requests)
    assert all(len(r.prompt_ids) + r.max_new_tokens <= engine.max_len for r in trace.requests)


def test_an_aborted_turn_ends_its_conversation():
    model = random_model("gqa")
    knobs = ConversationKnobs(users=3, rate_per_s=100.0, think_s=0.0, mean_turns=50.0, turns=3, scale=0.1)
    engine, driver = conversation_engine(model, knobs, slots=4)
    assert [len(s) for s in driver.scripts] == [3, 3, 3]
    while not any(r.id == "u0t0" for r in engine.running()):
        engine.step()
    engine.abort("u0t0")
    engine.run()
    ids = {r.id for r in engine.requests}
    assert "u0t1" not in ids and {"u1t2", "u2t2"} <= ids
    assert engine.cache.allocator.num_free == engine.cache.num_blocks


def test_a_seed_draws_the_same_script_and_run_conversations_plays_it():
    knobs = ConversationKnobs(users=3, rate_per_s=100.0, think_s=0.0, mean_turns=2.0, scale=0.1, seed=3)
    script = lambda k: [[(t.message, t.reply, t.think) for t in s] for s in Conversations(k).scripts]
    assert script(knobs) == script(knobs) != script(ConversationKnobs(users=3, scale=0.1, seed=4))
    trace = run_conversations(random_model("gqa"), knobs, slots=2)
    firsts = {r.id: r.prompt_ids for r in trace.requests if r.id.endswith("t0")}
    assert firsts == {f"u{u}t0": s[0][0] for u, s in enumerate(script(knobs))}
    assert trace.config["workload"] == "multi-turn" and trace.config["seed"] == 3


@pytest.mark.parametrize(
    "knobs, words",
    [
        (dict(users=0), "users must be"),
        (dict(users=70_000), "users must be"),
        (dict(rate_per_s=0), "rate_per_s must be positive"),
        (dict(think_s=-1), "think_s must be >= 0"),
        (dict(think_spread=1.5), "think_spread must lie in [0, 1]"),
        (dict(turns=0), "turns (the cap per conversation)"),
        (dict(turns=2.5), "turns (the cap per conversation)"),
        (dict(mean_turns=0.5), "mean_turns must be at least 1"),
        (dict(scale=0), "scale must be positive"),
    ],
)
def test_bad_knobs_say_what_is_wrong(knobs, words):
    with pytest.raises(ConfigError) as error:
        ConversationKnobs(**knobs)
    assert words in str(error.value)
