"""The plain core on its own: greedy, token-exact, knowing no layer; and each seam engine.py names, used by a toy layer.

The layers that ship (minillm/layers/) are tested through LayeredEngine everywhere else; here each seam is shown to
carry exactly what engine.py says it does, so a new layer can rely on it.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from minillm.config import EngineConfig, Sampling
from minillm.engine import ContinuousScheduler, Engine, Request, StaticScheduler, Step, generate
from minillm.model.tokenizer import EOS
from tests.conftest import random_model
from tests.lessons.harness import crowd

COMBOS = [(s, kv) for s in (StaticScheduler, ContinuousScheduler) for kv in ("contiguous", "paged")]


def plain(model, scheduler=ContinuousScheduler, kv="paged", **cfg) -> Engine:
    return Engine(model, scheduler(token_budget=16), EngineConfig(kv=kv, max_len=256, **({"slots": 3} | cfg)))


@pytest.mark.parametrize("scheduler, kv", COMBOS)
def test_the_plain_core_is_token_exact_on_its_own(scheduler, kv):
    model, requests = random_model("gqa"), crowd(7, seed=4)
    engine = plain(model, scheduler, kv, block_size=4)
    for r in requests:
        engine.submit(r)
    assert engine.run() is None and engine.step_no > 0
    for r in requests:
        expected = generate(model, r.prompt_ids, r.max_new_tokens, use_cache=False, ignore_eos=r.ignore_eos)
        assert r.output_ids == expected.tokens, r.id
    if kv == "paged":
        assert engine.cache.allocator.num_free == engine.cache.num_blocks  # every block back


def test_the_plain_core_refuses_what_only_a_layer_can_pick():
    engine = plain(random_model("gqa"))
    asks = [Sampling(temperature=0.7), Sampling(logprobs=2), Sampling(constraint=object())]
    for i, sampling in enumerate(asks):
        r = Request(f"r{i}", [257, 5, 6], 4, sampling=sampling)
        assert not engine.submit(r) and "pick seam" in r.finish_reason, r.finish_reason
    assert engine.submit(Request("greedy", [257, 5, 6], 4, sampling=Sampling(seed=3)))  # a seed alone is greedy


def test_importing_the_core_imports_no_layer():
    code = "import sys, minillm.engine, minillm.model; print(sorted(m for m in sys.modules if 'layers' in m))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


class FirstToken:
    """A toy picker: every row's pick is token 65 ('A'), whatever the logits say."""

    def on_submit(self, request):
        return "no odd ids" if request.id.endswith("odd") else None

    def pick(self, logits, batch):
        assert logits.shape[0] == len(batch.logit_index) == len(batch.pickers)
        return [65] * logits.shape[0]


def test_the_pick_seam_picks_and_may_refuse():
    engine = plain(random_model("mqa"))
    engine.picker = FirstToken()
    ok, odd = Request("ok", [257, 1, 2], 5), Request("odd", [257, 1, 2], 5)
    assert engine.submit(ok) and not engine.submit(odd) and odd.finish_reason == "rejected: no odd ids"
    engine.run()
    assert ok.output_ids == [65] * 5 and ok.finish_reason == "length"


def test_the_token_seam_ends_replies_and_a_held_reason_keeps_the_kv():
    model = random_model("gqa")
    engine = plain(model, block_size=4)
    engine.token_hooks.append(lambda r, token: "enough" if len(r.output_ids) == 2 else None)
    engine.held_reasons.add("enough")
    requests = [Request(f"r{i}", [257, *range(10 + i)], 8, ignore_eos=True) for i in range(2)]
    for r in requests:
        engine.submit(r)
    engine.run()
    assert [r.finish_reason for r in requests] == ["enough", "enough"] and engine.held == requests
    assert all(len(r.output_ids) == 2 and engine.cache.seat_tokens(r.seat) > 0 for r in requests)  # kept
    for r in requests:
        engine.release(r)
    assert engine.cache.allocator.num_free == engine.cache.num_blocks and engine.seats == [None] * 3


def test_the_observers_see_every_step_before_its_kv_is_freed():
    engine, seen = plain(random_model("gqa")), []
    engine.observers.append(lambda e, step: seen.append((step, [e.cache.seat_tokens(r.seat) for r in step.finished])))
    for r in crowd(4, seed=1):
        engine.submit(r)
    engine.run()
    assert [s.number for s, _ in seen] == list(range(engine.step_no)) and all(isinstance(s, Step) for s, _ in seen)
    assert all(all(n > 0 for n in held) for _, held in seen)  # a finished reply's KV is still there
    assert sum(s.tokens for s, _ in seen) == sum(
        len(r.output_ids) + (r.finish_reason == "eos") for r in engine.requests
    )


@pytest.mark.parametrize("kv", ["paged", "contiguous"])
def test_admitting_with_kv_brought_from_elsewhere_is_token_exact(kv):
    """A request submitted with its prompt's keys and values (computed by another engine) runs only its last token."""
    model = random_model("gqa")
    prompt = [257, *range(30, 60)]
    first = plain(model, kv=kv)
    first.submit(donor := Request("donor", prompt, 5, ignore_eos=True))
    while not donor.output_ids:  # (the prompt in chunks of the token budget, then its first token)
        first.step()
    k, v = first.cache.read_tokens(donor.seat, len(prompt))  # (L, n, Hkv, D) each
    second = plain(model, kv=kv)
    copy = Request("copy", prompt, 13, ignore_eos=True, output_ids=list(donor.output_ids))
    assert second.submit(copy, kv=(k, v))
    step = second.step()
    assert step.rows == [(copy, 1)] and step.kinds == {"copy": "decode"}  # nothing recomputed
    second.run()
    assert copy.output_ids == generate(model, prompt, 13, use_cache=False, ignore_eos=True).tokens


class RepeatLast:
    """A toy lookahead: each decoding row guesses its last token twice more; settle keeps what the model agrees with."""

    def propose(self, running):
        for r in running:
            r.lookahead = []
            if r.is_decoding and r.max_new_tokens - len(r.output_ids) > 2:
                r.lookahead = [r.output_ids[-1]] * 2

    def settle(self, batch, picks, cache):
        replies, kept, at = [], [], 0
        for r, n, samples, ahead in zip(batch.requests, batch.counts, batch.samples, batch.lookahead):
            if samples:
                mine, at = picks[at : at + ahead + 1], at + ahead + 1
                good = next((i for i in range(ahead) if r.lookahead[i] != mine[i]), ahead)
                new = r.lookahead[:good] + [mine[good]]
                if EOS in new:
                    new = new[: new.index(EOS) + 1]
                cache.truncate(r.seat, r.num_computed + n - ahead + good)
                replies.append(new)
                n -= ahead - good
            kept.append(n)
            r.lookahead = []
        return replies, kept


def test_the_lookahead_seam_runs_guesses_in_the_same_forward_and_keeps_only_right_ones():
    model = random_model("mha")
    torch.manual_seed(0)
    engine = plain(model, block_size=4)
    engine.lookahead = RepeatLast()
    requests = crowd(5, seed=3)
    for r in requests:
        engine.submit(r)
    steps = []
    while engine.has_work():
        steps.append(engine.step())
    assert any(n > 1 for s in steps for r, n in s.rows if s.kinds[r.id] == "decode")  # rows ran guesses
    for r in requests:
        expected = generate(model, r.prompt_ids, r.max_new_tokens, use_cache=False, ignore_eos=r.ignore_eos).tokens
        assert r.output_ids == expected, r.id
    assert engine.cache.allocator.num_free == engine.cache.num_blocks
