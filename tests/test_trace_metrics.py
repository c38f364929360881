"""Trace: round trip and validation. Metrics: figures that can be checked by hand on a small run."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from minillm.config import EngineConfig
from minillm.engine.request import Request
from minillm.engine.scheduler import ContinuousScheduler, StaticScheduler
from minillm.layers import LayeredEngine
from minillm.model.transformer import Transformer
from minillm.runs import trace_file
from minillm.runs.metrics import one_user_left, per_request, summarize, utilization_now
from minillm.runs.workload import SEED_STORY, SEED_STORY_SLOTS, ChatKnobs, chat, seed_story
from tests.conftest import SMALL_CONFIGS, random_model
from viz.replies import tokens_produced


@pytest.fixture(scope="module")
def story_traces():
    """The seed story under both policies. Each reply's cap is its length with its EOS, so any model takes the same
    steps (a random one ends by length where the shipped one says EOS: tests/test_shipped_model.py)."""
    torch.manual_seed(0)
    model = Transformer(replace(SMALL_CONFIGS["gqa"], max_seq_len=1024)).eval()
    traces = {}
    for policy in (StaticScheduler, ContinuousScheduler):
        engine = LayeredEngine(model, policy(), EngineConfig(slots=SEED_STORY_SLOTS, block_size=16))
        for r in seed_story():
            engine.submit(r)
        traces[policy.name] = engine.run()
    return traces


def admitted_at(trace):
    return {rid: s.step for s in trace.steps for rid in s.admitted}


STEPS = {rid: n for rid, _, n in SEED_STORY}  # each reply takes a step per token, its EOS included


def test_seed_story_events_happen_at_the_story_steps(story_traces):
    """Worked out on paper: static boards the next batch when the first batch's longest reply is done;
    continuous gives each seat to the head of the queue the step after its reply ends."""
    first, rest = SEED_STORY[:SEED_STORY_SLOTS], SEED_STORY[SEED_STORY_SLOTS:]
    longest = max(n for *_, n in first)
    static = admitted_at(story_traces["static"])
    assert static == {rid: 0 for rid, *_ in first} | {rid: longest for rid, *_ in rest}
    free_at, expected = [0] * SEED_STORY_SLOTS, {}
    for rid, _, n in SEED_STORY:
        seat = free_at.index(min(free_at))
        expected[rid], free_at[seat] = free_at[seat], free_at[seat] + n
    assert admitted_at(story_traces["continuous"]) == expected
    for trace in story_traces.values():
        for r in trace.requests:
            assert r.finish_step - r.admit_step + 1 == STEPS[r.id]
    # the story's shape: one long reply holds the static batch while the other three are done
    held = [
        s for s in story_traces["static"].steps if sum(slot["state"] == "held" for slot in filter(None, s.slots)) == 3
    ]
    assert len(held) > longest / 2


def test_seed_story_metrics(story_traces):
    cont, static = summarize(story_traces["continuous"]), summarize(story_traces["static"])
    assert cont["finished"] == static["finished"] == 8
    assert cont["output_tokens"] == static["output_tokens"] == sum(STEPS.values())  # (EOS steps count as tokens)
    assert cont["last_finish_step"] < static["last_finish_step"]
    assert cont["slot_utilization"] > static["slot_utilization"]
    # static: the first batch's useful seat-steps are exactly the four replies' lengths
    longest = max(n for *_, n in SEED_STORY[:SEED_STORY_SLOTS])
    first_batch = [s for s in story_traces["static"].steps if s.step < longest]
    busy = sum(1 for s in first_batch for slot in s.slots if slot and slot["state"] != "held")
    assert busy == sum(n for *_, n in SEED_STORY[:SEED_STORY_SLOTS])
    ttft = {rid: m["ttft_steps"] for rid, m in per_request(story_traces["static"]).items()}
    assert ttft["A"] == 1 and ttft["E"] == longest + 1


def test_one_user_left_is_the_stretch_where_the_longest_reply_holds_the_static_batch(story_traces):
    """Worked out on paper: C, the batch's second longest, ends at step 41 (its 42 steps), B alone runs to 499."""
    second, longest = sorted(n for *_, n in SEED_STORY[:SEED_STORY_SLOTS])[-2:]
    static, continuous = story_traces["static"], story_traces["continuous"]
    assert one_user_left(static) == (second, longest - 1)
    assert utilization_now(static, second) == 1 / SEED_STORY_SLOTS and utilization_now(continuous, second) == 1.0
    assert one_user_left(continuous) is None  # nobody holds a seat there


def test_trace_round_trips_through_json(story_traces, tmp_path):
    trace = story_traces["continuous"]
    trace.save(tmp_path / "t.json")
    again = trace_file.load(tmp_path / "t.json")
    assert again.to_dict() == json.loads(json.dumps(trace.to_dict()))
    assert summarize(again) == summarize(trace)


@pytest.mark.parametrize(
    "mutate,needle",
    [
        (lambda d: d.update(format="other"), '"format" must be'),
        (lambda d: d.update(version=99), "unsupported version"),
        (lambda d: d["config"].pop("slots"), "config lacks"),
        (lambda d: d["steps"][0].pop("tokens"), '"tokens" is missing'),
        (lambda d: d["steps"][0].update(num_seats=9), '"num_seats" must equal config slots'),
        (lambda d: d["steps"][3]["seats"][0].__setitem__(2, "napping"), "a seat must be"),
        (lambda d: d["steps"][3]["seats"][0].__setitem__(0, 4), "a seat must be"),
        (lambda d: d["steps"][3]["seats"][0].__setitem__(1, "nobody"), "unknown request"),
        (lambda d: d["requests"][0].update(id=5), '"id" is missing or not a str'),
    ],
)
def test_malformed_traces_are_a_clear_error(story_traces, mutate, needle):
    data = json.loads(json.dumps(story_traces["static"].to_dict()))
    mutate(data)
    with pytest.raises(trace_file.TraceError, match=needle):
        trace_file.from_dict(data)


@pytest.mark.parametrize("text", [b"not json", b"[1, 2]", b"\xff\xfe"])
def test_garbage_is_a_clear_error(text):
    with pytest.raises(trace_file.TraceError, match="not a JSON file|top level"):
        trace_file.loads(text)


def test_chat_workload_is_seeded_and_has_a_long_tail():
    a, b = chat(ChatKnobs(requests=200, rate=2.0), seed=3), chat(ChatKnobs(requests=200, rate=2.0), seed=3)
    assert [(r.prompt, r.arrival_step) for r in a] == [(r.prompt, r.arrival_step) for r in b]
    assert [r.prompt for r in chat(ChatKnobs(requests=200, rate=2.0), seed=4)] != [r.prompt for r in a]
    arrivals = [r.arrival_step for r in a]
    assert arrivals == sorted(arrivals) and 60 <= arrivals[-1] <= 140  # about requests / rate steps
    everyone_at_once = chat(ChatKnobs(requests=10, rate=10), seed=0)
    assert {r.arrival_step for r in everyone_at_once} == {0}
    from minillm.training import tasks

    lengths = sorted(len(tasks.solve(r.prompt)) for r in a)
    assert lengths[len(lengths) // 2] < 80 < lengths[-1] > 250  # median below the mean: a long tail


def test_utilization_counts_held_seats_as_idle():
    model = random_model("gqa")
    engine = LayeredEngine(model, StaticScheduler(), EngineConfig(slots=2, max_len=256))
    engine.submit(Request("short", [257, 1], 2, ignore_eos=True))
    engine.submit(Request("long", [257, 2], 6, ignore_eos=True))
    trace = engine.run()
    assert len(trace.steps) == 6
    assert summarize(trace)["slot_utilization"] == pytest.approx((2 + 6) / (2 * 6))


def test_version_1_files_still_load():
    """tests/data/trace_v1.json was written by minillm before traces recorded token counts (version 1)."""
    path = Path(__file__).parent / "data" / "trace_v1.json"
    raw = json.loads(path.read_text())
    assert raw["version"] == 1
    trace = trace_file.load(path)
    for old, new in zip(raw["steps"], trace.steps):
        assert [s and (s["id"], s["state"]) for s in old["slots"]] == [s and (s["id"], s["state"]) for s in new.slots]
        assert new.num_waiting == len(old["waiting"])
    for r in trace.requests:  # every reply token (and the EOS) was produced in some step
        assert tokens_produced(trace, r.id, len(trace.steps) - 1) == len(r.output_ids) + (r.finish_reason == "eos")
    busy = sum(1 for s in raw["steps"] for slot in s["slots"] if slot and slot["state"] != "held")
    assert summarize(trace)["slot_utilization"] == busy / (len(raw["steps"]) * raw["config"]["slots"])


def test_older_files_cached_prompt_tokens_read_as_prompt_tokens_from_cache():
    """Before prompt_tokens_from_cache, traces had cached_prompt_tokens: summed over a request's admissions, so it
    could pass the prompt after a preemption. It loads capped at the prompt, and the hit rate stays at most 1."""
    cfg = EngineConfig(slots=1, max_len=256, block_size=4, prefix_caching=True)
    engine = LayeredEngine(random_model("gqa"), ContinuousScheduler(), cfg)
    for i in range(3):
        engine.submit(Request(f"r{i}", [257] + list(range(20)) + [i], 2, ignore_eos=True))
    data = engine.run().to_dict()
    new = [r.pop("prompt_tokens_from_cache") for r in data["requests"]]
    assert new == [0, 20, 20]
    old = [0, 20, 39]  # r2 as a preempted request once counted it: both admissions, reply tokens too
    for r, value in zip(data["requests"], old):
        r["cached_prompt_tokens"] = value
    trace = trace_file.from_dict(data)
    assert [r.prompt_tokens_from_cache for r in trace.requests] == [0, 20, 22]
    assert summarize(trace)["prefix_hit_rate"] == pytest.approx(42 / 66)
