"""Replay (minillm/runs/replay.py, viz/app/replays.py): a setting served from recorded replies is the run the model
itself gives, step for step: the same seats, tokens, queue, KV blocks and block tables, guesses kept, masks, and the
same replies. Only the seconds differ (priced, not measured)."""

from __future__ import annotations

import pytest
import torch

from minillm.engine.request import Request
from minillm.errors import ConfigError
from minillm.runs.replay import (
    SHIPPED_BOOK,
    DraftBook,
    ReplayRunner,
    ReplyBook,
    compute_replies,
    fit_price,
    reply_key,
    weights_fingerprint,
)
from minillm.runs.run import workload_engine
from viz.app import replays

TIMES = {"wall_s", "time_s", "first_token_s", "finish_s", "clock"}
SMALL = {"requests": 6, "rate": 0.5, "mean_reply": 24, "spread": 1.0}
BASE = {"workload": "seed-story", "knobs": None, "seed": 0, "slots": 4, "kv": "paged", "block_size": 16,
        "num_blocks": None, "token_budget": 256, "prefix_caching": False, "speculate": 0}  # fmt: skip
SETTINGS = {  # each a setting the step player offers, chosen to exercise one path of the engine
    "static contiguous": ("static", BASE | {"kv": "contiguous"}),
    "continuous, small blocks, chunked prompts": ("continuous", BASE | {"block_size": 4, "token_budget": 8}),
    "preempted (a pool too small)": ("continuous", BASE | {"num_blocks": 40, "block_size": 8}),
    "prefix caching": ("continuous", BASE | {"workload": "system-prompt", "knobs": SMALL, "prefix_caching": True}),
    "speculation": ("continuous", BASE | {"workload": "bursty", "knobs": SMALL, "speculate": 2}),
    "constrained": ("static", BASE | {"workload": "chat", "knobs": SMALL, "constrained": True}),
    "long prompts, no budget": ("continuous", BASE | {"workload": "long-prompts", "knobs": SMALL, "token_budget": 0}),
}


def untimed(value):
    """A trace's dict without its seconds (a replay prices them)."""
    if isinstance(value, dict):
        return {k: untimed(v) for k, v in value.items() if k not in TIMES}
    if isinstance(value, list):
        return [untimed(v) for v in value]
    return value


@pytest.fixture(autouse=True)
def replies_in_memory(monkeypatch):
    monkeypatch.setenv("MINILLM_APP_REPLIES", "off")


@pytest.mark.parametrize("name", SETTINGS)
def test_a_replayed_run_is_the_models_own_step_for_step(name, shipped_model):
    scheduler, settings = SETTINGS[name]
    real = replays.run(scheduler, settings, shipped_model, replay=False)
    replayed = replays.run(scheduler, settings, shipped_model)
    assert replayed.config["clock"] == "replayed"
    assert untimed(replayed.to_dict()) == untimed(real.to_dict())
    assert len(real.steps) > 10 and any(r.output_ids for r in real.requests)


def test_a_fleet_replayed_hands_over_as_the_real_one(shipped_model):
    pair = BASE | {"workload": "long-prompts", "knobs": SMALL | {"force_lengths": True}, "fleet": "pair"}
    real = replays.run("fleet", pair, shipped_model, replay=False)
    replayed = replays.run("fleet", pair, shipped_model)
    assert [untimed(t.to_dict()) for t in replayed] == [untimed(t.to_dict()) for t in real]


def test_the_shipped_replies_are_the_shipped_models():
    """minillm/weights/replies.json was written for these weights (else: python -m viz.app.replays), and holds
    every default crowd of the app, so it opens without running the model."""
    book = ReplyBook.load(SHIPPED_BOOK, weights_fingerprint())
    assert book.replies, "replies.json is missing or was written for other weights: run python -m viz.app.replays"
    for crowd in replays.default_crowds():
        assert not book.missing(replays.requests_of(crowd)), crowd
    assert not book.missing(replays.every_countdown())


def test_a_shipped_reply_equals_the_models_greedy_reply(shipped_model):
    book = ReplyBook.load(SHIPPED_BOOK, weights_fingerprint())
    requests = replays.requests_of({"workload": "chat", "knobs": SMALL | {"requests": 3}, "seed": 0})
    requests += replays.requests_of({"workload": "seed-story", "knobs": None, "seed": 0})[:2]
    requests += replays.every_countdown()[-2:]  # (after the longest system prompt)
    fresh = ReplyBook(book.fingerprint)
    compute_replies(fresh, requests, shipped_model)
    for r in requests:
        shipped = book.reply(r)
        if shipped is not None:
            assert shipped == fresh.reply(r)
    assert any(book.reply(r) is not None for r in requests)


def test_a_book_for_other_weights_is_not_read(tmp_path):
    path = tmp_path / "book.json"
    ReplyBook("other-weights", {"k": {"tokens": [1], "ended": True}}).save(path)
    assert ReplyBook.load(path, "these-weights").replies == {}
    assert ReplyBook.load(path, "other-weights").replies == {"k": {"tokens": [1], "ended": True}}


def test_a_reply_cut_by_its_cap_serves_only_shorter_caps():
    book = ReplyBook("w")
    short = Request("a", [257, 50, 259], 3)
    short.output_ids, short.finish_reason = [1, 2, 3], "length"
    book.add(short)
    assert book.reply(Request("b", [257, 50, 259], 2)) == [1, 2, 3]
    assert book.reply(Request("c", [257, 50, 259], 4)) is None  # it may go on past 3 tokens: not recorded
    assert book.reply(Request("d", [257, 50, 259], 4, ignore_eos=True)) is None  # another reply altogether


def test_a_replay_refuses_what_it_has_no_reply_for(shipped_model):
    engine = workload_engine(ReplayRunner(shipped_model, ReplyBook("w")), "seed-story")
    with pytest.raises(ConfigError, match="no recorded reply"):
        engine.run()


def test_replayed_seconds_are_priced_by_a_line_fitted_to_real_steps():
    price = fit_price([(1, 0.002), (9, 0.010), (17, 0.018)])
    assert price == pytest.approx({"per_step_s": 0.001, "per_token_s": 0.001})
    assert fit_price([(4, 0.01), (4, 0.02)]) is None  # one size of step: no line


def test_the_draft_book_asks_the_draft_model_once_per_context():
    class Counting:
        name, calls = "model", 0

        def propose(self, requests, ks, sampler):
            self.calls += len(requests)
            return [[7] * k for k in ks], [[] for _ in requests]

        def rollback(self, request, keep):
            pass

    inner = Counting()
    drafts = DraftBook(inner)
    r = Request("a", [257, 50, 259], 8)
    assert drafts.propose([r], [2], None)[0] == [[7, 7]] and inner.calls == 1
    assert drafts.propose([r], [2], None)[0] == [[7, 7]] and inner.calls == 1  # the same context: remembered
    r.output_ids.append(5)
    drafts.propose([r], [2], None)
    assert inner.calls == 2 and reply_key(r) in next(iter(drafts.guesses))


def test_a_setting_change_in_the_app_runs_no_forward(shipped_model, monkeypatch):
    """Every run the step player shows is replayed: once its replies are known, no setting runs the model."""
    calls = []
    for settings in (BASE, BASE | {"slots": 6}, BASE | {"kv": "contiguous"}, BASE | {"prefix_caching": True}):
        replays.ensure_replies(settings, shipped_model)
        handle = shipped_model.register_forward_hook(lambda *_: calls.append(1))
        try:
            for scheduler in ("static", "continuous"):
                assert replays.run(scheduler, settings, shipped_model).steps
        finally:
            handle.remove()
    assert calls == []
    assert torch.is_grad_enabled()  # (nothing left switched off)
