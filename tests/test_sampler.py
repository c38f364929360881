"""Sampling per request: greedy stays the default and token-exact; a seeded request gets the same reply alone, in any
batch, preempted or not, and the same as the one-user loop; top_k and top_p cut; logprobs are the model's own; bad
settings are refused with the field named."""

from dataclasses import replace

import pytest
import torch

from minillm.config import EngineConfig, Sampling
from minillm.engine.packing import pack
from minillm.engine.request import Request
from minillm.engine.scheduler import ContinuousScheduler
from minillm.errors import InputError
from minillm.layers import LayeredEngine, Sampler, generate
from minillm.runs.run import run_workload
from minillm.runs.workload import ChatKnobs
from tests.conftest import random_model
from tests.lessons.harness import crowd

WARM = Sampling(temperature=1.0, top_p=0.9, top_k=50, seed=7)


def serve(model, requests, **cfg) -> LayeredEngine:
    engine = LayeredEngine(model, ContinuousScheduler(), EngineConfig(max_len=256, **cfg))
    for r in requests:
        engine.submit(r)
    engine.run(max_steps=3000)
    return engine


def seeded(rid: str, sampling: Sampling = WARM, n: int = 40) -> Request:
    return Request(rid, [257, 5, 9, 200, 13], n, ignore_eos=True, sampling=sampling)


def test_a_seeded_request_gets_the_same_reply_alone_in_a_crowd_preempted_and_in_the_plain_loop():
    model = random_model("gqa")
    alone = seeded("s")
    serve(model, [alone], slots=1)
    others = [replace(r, sampling=replace(WARM, seed=i)) for i, r in enumerate(crowd(12, seed=2))]  # sampled too
    in_a_crowd = seeded("s")
    engine = serve(model, others + [in_a_crowd], slots=4, block_size=4, num_blocks=16)
    reference = generate(model, alone.prompt_ids, 40, temperature=1.0, top_k=50, top_p=0.9, seed=7, ignore_eos=True)
    assert sum(r.preemptions for r in engine.requests) > 0, "the pool was meant to force preemptions"
    assert in_a_crowd.output_ids == alone.output_ids == reference.tokens
    other_seed = seeded("t", replace(WARM, seed=8))
    serve(model, [other_seed], slots=1)
    assert other_seed.output_ids != alone.output_ids  # (the seed matters)
    assert engine.cache.free_blocks == engine.cache.num_blocks


def test_greedy_is_the_default_and_a_sampled_neighbour_does_not_change_it():
    model = random_model("mha")
    greedy, warm = crowd(2)
    warm.sampling = replace(WARM, seed=1)
    serve(model, [greedy, warm], slots=2)
    assert (
        greedy.sampling == Sampling()
        and greedy.output_ids
        == generate(model, greedy.prompt_ids, greedy.max_new_tokens, use_cache=False, ignore_eos=True).tokens
    )


def test_top_k_1_and_a_tiny_top_p_are_greedy_and_temperature_spreads_the_choice():
    model = random_model("gqa")
    prompt = [257, 40, 41, 42]
    greedy = generate(model, prompt, 30, ignore_eos=True).tokens
    assert generate(model, prompt, 30, temperature=2.0, top_k=1, seed=3, ignore_eos=True).tokens == greedy
    assert generate(model, prompt, 30, temperature=2.0, top_p=1e-6, seed=3, ignore_eos=True).tokens == greedy
    hot = generate(model, prompt, 30, temperature=2.0, seed=3, ignore_eos=True).tokens
    assert hot != greedy and len(set(hot)) > 10  # a random model's flat distribution, drawn from


def test_top_k_and_top_p_keep_only_the_likely_tokens():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0, -1.0]])  # (1, V)
    probs = logits.softmax(-1)[0]

    def pick(r: Request) -> int:  # the token the engine's pick seam gives a one-token row of r
        return Sampler().pick(logits, pack([(r, r.num_pending)]))[0]

    def drawn(**how):
        r = Request("x", [1], 5, sampling=Sampling(temperature=1.0, **how))
        return {pick(replace(r, sampling=replace(r.sampling, seed=s))) for s in range(300)}

    assert drawn(top_k=2) == {0, 1}
    enough = float(probs[:3].sum())  # the three likeliest reach this mass: the fourth is never drawn
    assert drawn(top_p=enough - 1e-4) == {0, 1, 2}
    assert drawn() == set(range(6))


def test_logprobs_are_the_models_log_softmax_at_each_token():
    model = random_model("gqa")
    r = Request("lp", [257, 3, 4, 5], 6, ignore_eos=True, sampling=Sampling(logprobs=3))
    logprobs = serve(model, [r], slots=1).sampler.logprobs[r.id]
    assert len(logprobs) == 6
    ids = torch.tensor([r.prompt_ids + r.output_ids])
    with torch.no_grad():
        want = model(ids)[0].float().log_softmax(-1)  # (T, V)
    for i, (chosen, top_ids, top_lps) in enumerate(logprobs):
        row = want[len(r.prompt_ids) - 1 + i]
        assert chosen == pytest.approx(row[r.output_ids[i]].item(), abs=1e-4)
        assert top_ids == row.topk(3).indices.tolist() and top_ids[0] == r.output_ids[i]  # greedy: the likeliest
        assert top_lps == pytest.approx(row.topk(3).values.tolist(), abs=1e-4)


@pytest.mark.parametrize(
    "how,needle",
    [({"temperature": -0.5}, "temperature must be a number >= 0"), ({"temperature": float("nan")}, "temperature"),
     ({"temperature": "hot"}, "got 'hot'"), ({"top_p": 0}, "top_p must be a number in (0, 1]"),
     ({"top_p": 1.5}, "top_p"), ({"top_k": -1}, "top_k must be a whole number >= 0"), ({"top_k": 2.5}, "top_k"),
     ({"seed": -3}, "seed must be a whole number >= 0"), ({"seed": True}, "seed"), ({"logprobs": 21}, "from 0 to 20")],
)  # fmt: skip
def test_bad_sampling_settings_are_refused_with_the_field_named(how, needle):
    with pytest.raises(InputError) as e:
        Sampling(**how)
    assert needle in str(e.value)
    if "logprobs" not in how:  # the one-user loop checks the same way
        with pytest.raises(InputError, match=next(iter(how))):
            generate(random_model("gqa"), [257, 1], 3, **how)


def test_a_sampled_run_is_reproducible_from_its_seed(shipped_model):
    """`run --temperature T`: each user draws with its own seed, taken from the run's, so a rerun gives the same."""
    knobs = ChatKnobs(requests=6, rate=1000)
    warm = Sampling(temperature=3.0)
    replies = lambda seed, sampling: [r.output_ids for r in run_workload(shipped_model, "chat", knobs=knobs, seed=seed,
                                                                         sampling=sampling).requests]  # fmt: skip
    first = replies(0, warm)
    assert replies(0, warm) == first != replies(0, None)
    assert replies(1, warm) != first  # another run's seed, other draws


@pytest.mark.parametrize("temperature", [5e-324, 1e-300, 1e-12, 1e300])
def test_extreme_temperatures_draw_a_token_never_a_nan(temperature):
    """A temperature near 0 is nearly greedy, a huge one nearly uniform: neither may crash the engine's step."""
    from minillm.config import Sampling
    from minillm.layers.sampling import draw

    logits = torch.tensor([3.0, 1.0, 3.0, -2.0, float("-inf")])
    for position in range(20):
        token = draw(logits, Sampling(temperature=temperature, seed=7), position)
        assert 0 <= token < 4
        if temperature < 1:
            assert token in (0, 2)  # the most likely tokens only
