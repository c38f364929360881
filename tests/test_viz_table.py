"""The trace's table (viz/table.py) says what the trace's records say: seat states, token splits, statuses, KV
figures, the queue, the guesses and the masks' counts, on the runs the app shows; and once the table is built, a
frame of the step player reads no record of the trace."""

from dataclasses import replace

import numpy as np
import pytest

from minillm.card.hardware import get_device
from minillm.card.modelspec import load_spec
from minillm.card.simulate import SimulatedRunner
from minillm.grammar import compile_regex
from minillm.model.tokenizer import VOCAB_SIZE
from minillm.runs.run import run_workload, workload_engine
from minillm.runs.workload import ChatKnobs
from tests.conftest import one_torch_thread
from viz import TracePlayer, kv_memory, table_of
from viz.app.playback import figures
from viz.colors import STATE_CODES
from viz.html import replies_html, token_budget_html
from viz.table import build_table


@pytest.fixture(scope="module")
def runs(shipped_model):
    with one_torch_thread():  # (the tiny model's ops are too small to split)
        held = workload_engine(shipped_model, "seed-story", "continuous")
        for r in held.requests[1::2]:  # every other user held to numbers (lesson 14's pattern)
            r.sampling = replace(r.sampling, constraint=compile_regex(r"[0-9]+( [0-9]+)*"))
        card = SimulatedRunner(load_spec("llama-3.1-8b"), get_device("rtx-4090"))
        tiny = lambda workload, **settings: run_workload(shipped_model, workload, **settings)
        return {
            "static": tiny("seed-story", scheduler="static"),
            "continuous": tiny("seed-story"),
            "speculating": tiny("seed-story", speculate=4),
            "prefix caching": tiny("system-prompt", prefix_caching=True, knobs=ChatKnobs(10, rate=0.5, mean_reply=30)),
            "preempting": tiny("chat", num_blocks=42, knobs=ChatKnobs(10, rate=4, mean_reply=150, spread=0.3)),
            "simulated": run_workload(card, "azure-conv", "static", knobs=ChatKnobs(24, rate_per_s=4), slots=8),
            "constrained": held.run(),
        }


RUNS = ["static", "continuous", "speculating", "prefix caching", "preempting", "simulated", "constrained"]


def status_by_loop(trace, r, t: int) -> str:
    """Where request r stands at step t, by a plain walk over the records (what the table's status grid encodes)."""
    if t < r.arrival_step:
        return "not arrived"
    if (r.finish_reason or "").startswith("rejected"):
        return r.finish_reason
    seat = next((e for e in trace.steps[t].seats if e[1] == r.id), None)
    if seat is not None and seat[2] == "held":
        return "held"
    if r.finish_step is not None and t >= r.finish_step:
        return f"finished ({r.finish_reason})"
    if seat is not None:
        return "running"
    return "preempted" if any(r.id in s.preempted for s in trace.steps[: t + 1]) else "waiting"


@pytest.mark.parametrize("name", RUNS)
def test_the_tables_columns_are_the_records(runs, name):
    trace = runs[name]
    table = build_table(trace)
    assert table.states.shape == table.occupant.shape == (trace.config["slots"], len(trace.steps))
    assert table.status.shape == (len(trace.requests), len(trace.steps))
    made = np.zeros(len(trace.requests), dtype=int)
    for t, record in enumerate(trace.steps):
        for seat, slot in enumerate(record.slots):
            assert table.states[seat, t] == (STATE_CODES[slot["state"]] if slot else 0)
            assert table.ids[table.occupant[seat, t]] == slot["id"] if slot else table.occupant[seat, t] == -1
        decode = sum(e[3] for e in record.seats if e[2] == "decode")
        assert list(table.splits[t]) == [decode, record.prefill_tokens, record.padding_rows]
        assert table.kv_memory(t) == kv_memory(record, trace.config["block_size"])
        assert (table.tokens[t], table.time_s[t], table.wall_s[t]) == (record.tokens, record.time_s, record.wall_s)
        assert (table.waiting[t], table.admitted[t], table.preempted[t]) == (
            record.waiting, record.admitted, record.preempted)  # fmt: skip
        assert table.kv_tables[t] == record.kv_tables and table.allowed[t] == record.allowed
        assert table.guesses.get(t, {}) == {rid: (d, record.accepted[rid]) for rid, d in record.drafts.items()}
        for e in record.seats:
            made[table.ids.index(e[1])] += e[4]
        assert (table.produced(t) == made).all()
        assert [table.status_name(i, t) for i in range(len(trace.requests))] == [
            status_by_loop(trace, r, t) for r in trace.requests]  # fmt: skip
    assert table.constrained == {rid for record in trace.steps for rid in record.allowed}


def test_the_runs_show_what_they_are_meant_to(runs):
    """Each run has what its table is checked on: held seats, guesses, shared blocks, no block map, masks."""

    def statuses(name: str, requests: int, steps) -> set[str]:
        table = build_table(runs[name])  # (once: a comprehension would build it again for every cell)
        return {table.status_name(i, t) for i in range(requests) for t in steps}

    assert "held" in statuses("static", 8, (100, 400)) and "held" not in statuses("continuous", 8, (100, 400))
    assert build_table(runs["speculating"]).guesses
    assert build_table(runs["prefix caching"]).summary["prefix_hit_rate"] > 0
    assert "preempted" in statuses("preempting", 10, range(300))
    assert not build_table(runs["simulated"]).has_block_map
    held = build_table(runs["constrained"])
    assert held.constrained == {r.id for r in runs["constrained"].requests[1::2]}
    assert all(0 < n < VOCAB_SIZE for step in held.allowed for n in step.values())


def test_a_trace_gets_its_table_once(runs):
    trace = runs["continuous"]
    table = table_of(trace)
    assert table_of(trace) is table and table_of(table) is table
    grown = type(trace)(trace.config, trace.requests, trace.steps[:-1])  # another trace: its own table
    assert table_of(grown) is not table and table_of(grown).num_steps == len(trace.steps) - 1


class Unreadable(list):
    def __iter__(self):
        raise AssertionError("a frame read the trace's steps")

    __getitem__ = __len__ = __iter__


@pytest.mark.parametrize("name", ["static", "speculating", "simulated", "constrained"])
def test_a_frame_reads_the_table_not_the_trace(runs, name):
    """Built once, the player draws any step, its figures, bars and chat from the table alone."""
    trace = runs[name]
    copy = type(trace)(trace.config, trace.requests, list(trace.steps))
    player = TracePlayer(copy, 610, text_px=20, height=372)
    expected = player.frame(len(trace.steps) // 2)
    copy.steps = Unreadable(copy.steps)
    for step in (0, len(trace.steps) // 2, len(trace.steps) - 1):
        frame = player.frame(step)
        figures(player, frame.metrics)
        token_budget_html(frame.tokens, player.budget, player.bar_tokens, frame.metrics["tokens"])
        replies_html(frame.replies, frame.not_arrived)
    assert player.frame(len(trace.steps) // 2) == expected


def test_a_constrained_reply_says_how_many_tokens_its_mask_allowed(runs):
    trace = runs["constrained"]
    player = TracePlayer(trace, 610)
    t, counts = next((t, s.allowed) for t, s in enumerate(trace.steps) if len(s.allowed) >= 2)
    frame = player.frame(t)
    assert frame.allowed == counts
    chat = replies_html(frame.replies)
    for reply in frame.replies:
        if reply.id in counts:
            assert reply.allowed == (counts[reply.id], VOCAB_SIZE)
            assert f"{counts[reply.id]} of {VOCAB_SIZE} tokens allowed" in chat
        else:
            assert reply.allowed is None
    free = [r for r in frame.replies if r.id not in player.table.constrained]
    assert free and all(not r.constrained for r in free)
    assert chat.count("data-allowed") == sum(r.constrained for r in frame.replies)
