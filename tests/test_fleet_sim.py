"""A fleet on simulated cards (card/fleet.py): the KV transfer by its formula, one replica is `run --simulate`, every
request ends once, and the split moves the latencies the way disaggregation says (fleet_figures.py)."""

import functools
import json

import pytest

from minillm.__main__ import main
from minillm.card.fleet import simulate_fleet
from minillm.card.fleet_figures import fleet_figures
from minillm.card.hardware import LINKS, get_device
from minillm.card.kv_transfer import kv_transfer
from minillm.card.modelspec import load_spec
from minillm.card.roofline import kv_bytes_per_token
from minillm.card.simulate import SimulatedRunner
from minillm.engine.request import Request
from minillm.runs.metrics import summarize
from minillm.runs.run import run_workload
from minillm.runs.workload import ChatKnobs, make_workload

LLAMA_8B = load_spec("llama-3.1-8b")
H100 = get_device("h100-sxm")


def crowd(workload="azure-conv", requests=60, rate_per_s=8.0, seed=0) -> list[Request]:
    return make_workload(workload, ChatKnobs(requests=requests, rate_per_s=rate_per_s), seed)


# --- the transfer, priced ------------------------------------------------------------------------------------------
def test_the_kv_transfer_is_keys_and_values_of_every_layer_over_the_links_one_way_rate():
    per_token = 2 * 32 * 8 * 128 * 2  # keys and values, 32 layers, 8 kv heads (not the 32 query heads) of 128, bf16
    assert kv_bytes_per_token(LLAMA_8B) == per_token == 128 * 1024
    ib = LINKS["ib-400"]
    assert ib.bandwidth == 400e9 / 8  # 400 Gb/s each way: 50 GB/s
    move = kv_transfer(LLAMA_8B, 1000, ib)
    assert move.bytes == 1000 * per_token
    assert move.seconds == pytest.approx(10e-6 + 1000 * per_token / 50e9)  # 2.63 ms
    nvlink = kv_transfer(LLAMA_8B, 1000, LINKS["nvlink-4"])
    assert nvlink.seconds == pytest.approx(5e-6 + 1000 * per_token / 450e9)  # 9 x faster than the network
    assert kv_transfer(LLAMA_8B, 1000, ib, tp=2).bytes == move.bytes / 2  # each card sends its own kv heads
    assert kv_transfer(LLAMA_8B, 1000, ib, kv_dtype="fp8").bytes == move.bytes / 2


# --- one replica, many, and a split --------------------------------------------------------------------------------
def test_a_fleet_of_one_replica_is_run_simulate():
    knobs = ChatKnobs(requests=40, rate_per_s=6.0)
    alone = run_workload(SimulatedRunner(LLAMA_8B, H100), "azure-conv", knobs=knobs)
    requests = make_workload("azure-conv", knobs)
    before = [(r.id, r.arrival_s, list(r.output_ids), r.state) for r in requests]
    run = simulate_fleet(LLAMA_8B, H100, requests, cards=1)
    assert [(r.id, r.arrival_s, r.output_ids, r.state) for r in requests] == before, "the caller's crowd was changed"
    (trace,) = run.traces()
    assert trace.steps == alone.steps and trace.requests == alone.requests
    assert trace.config["slots"] == alone.config["slots"] and trace.config["token_budget"] == 8192
    f, s = fleet_figures(run), summarize(alone)
    for name in ("ttft_p50_s", "ttft_p99_s", "tpot_p99_s", "itl_p50_s", "itl_p99_s"):
        assert f[name] == pytest.approx(s[name]), name
    assert f["output_tokens"] == s["output_tokens"] and f["finished"] == s["finished"] == 40


@functools.cache
def split_run(prefill: int, cards: int = 4):
    requests = crowd(requests=60, rate_per_s=20.0)
    requests += [Request("one-token", [257, 1, 2, 3], 1, arrival_s=0.5, planned_reply=1)]  # ends at its first token
    return simulate_fleet(LLAMA_8B, H100, requests, cards, prefill)


def test_every_request_ends_once_on_one_decode_engine_and_every_block_comes_back():
    run = split_run(2)
    decoders = [e for e, role in zip(run.engines, run.roles) if role == "decode"]
    assert run.roles == ["prefill", "prefill", "decode", "decode"]
    for first in run.requests:
        if first.id == "one-token":  # a reply of one token ends where it was made
            assert first.finish_reason == "length" and first.id not in run.copies
            continue
        assert first.finish_reason == "handed-over" and len(first.output_ids) == 1
        last = run.copies[first.id]
        assert last.finish_reason == "eos" and len(last.output_ids) == first.planned_reply
        assert sum(last in e.requests for e in decoders) == 1, f"{first.id} decoded on more than one engine"
    assert sorted(r.id for e in decoders for r in e.requests) == sorted(run.copies)  # nobody else decodes there
    for engine in run.engines:
        allocator = engine.cache.allocator
        assert allocator.num_free == allocator.num_blocks and not engine.held and not engine.live


def test_each_transfer_is_priced_by_the_formula_and_a_card_sends_one_at_a_time():
    run = split_run(2)
    assert len(run.transfers) == len(run.copies) == 60
    first = {r.id: r for r in run.requests}
    for move in run.transfers:
        assert move.tokens == len(first[move.request_id].prompt_ids)  # the prompt's KV: its first token's is not yet
        assert move.bytes == move.tokens * 128 * 1024
        assert move.done_s - move.start_s == pytest.approx(5e-6 + move.bytes / 450e9)  # NVLink 4, one way
        assert move.start_s >= move.ready_s == first[move.request_id].first_token_s
        assert run.copies[move.request_id].arrival_s == move.done_s  # the decode engine has it when it has landed
    for card in range(4):  # transfers out of (or into) one card queue behind each other
        using = sorted((m.start_s, m.done_s) for m in run.transfers if card in (m.prefill, m.decode))
        assert all(done <= start + 1e-12 for (_, done), (start, _) in zip(using, using[1:])), card


def test_ttft_runs_to_the_first_token_on_the_prefill_engine_and_tpot_spans_both():
    run = split_run(2)
    f = fleet_figures(run)
    r = next(r for r in run.requests if r.id == "r5")
    last = run.copies["r5"]
    ttft, tpot = r.first_token_s - r.arrival_s, (last.finish_s - r.first_token_s) / len(last.output_ids)
    assert 0 < ttft <= f["ttft_p99_s"] and tpot > 0  # (planned reply + EOS tokens: len(output) gaps after the first)
    assert f["goodput"] == 1.0 and f["finished"] == 61 and f["transfers"] == 60
    strict = fleet_figures(run, ttft_target_s=1e-9)
    assert strict["goodput"] == 0.0  # nobody's first token comes in a nanosecond


def test_more_prefill_cards_cut_ttft_and_more_decode_cards_cut_itl_on_a_prompt_heavy_crowd():
    requests = crowd("azure-code", requests=200, rate_per_s=60.0)  # long prompts, short replies
    figures = {p: fleet_figures(simulate_fleet(LLAMA_8B, H100, requests, 4, p)) for p in (1, 2, 3)}
    ttft = [figures[p]["ttft_p99_s"] for p in (1, 2, 3)]
    assert ttft[0] > ttft[1] > ttft[2], f"TTFT p99 at 1:3, 2:2, 3:1: {ttft}"
    for name in ("itl_p50_s", "tpot_p50_s", "tpot_p99_s"):  # (a decode card's batch: fewer cards, bigger batches)
        got = [figures[p][name] for p in (1, 2, 3)]
        assert got[0] < got[1] < got[2], f"{name} at 1:3, 2:2, 3:1: {got}"


def test_replicas_stall_decode_behind_prompts_and_a_split_does_not():
    """The long-prompt stall of lesson 08, between cards: a replica prefills a newcomer's prompt in its users' step."""
    requests = crowd("azure-code", requests=200, rate_per_s=60.0)
    replicas, split = (fleet_figures(simulate_fleet(LLAMA_8B, H100, requests, 4, p)) for p in (0, 3))
    assert replicas["itl_p99_s"] > 3 * split["itl_p99_s"]


def test_round_robin_takes_each_replica_in_turn():
    run = simulate_fleet(LLAMA_8B, H100, crowd(requests=9), 3, route="round-robin")
    assert [[r.id for r in e.requests] for e in run.engines] == [[f"r{i}" for i in range(k, 9, 3)] for k in range(3)]


# --- the command line ----------------------------------------------------------------------------------------------
def test_whatif_fleet_prints_the_table_of_splits(capsys):
    argv = ["whatif", "--fleet", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--cards", "4", "--split", "1:3,2:2",
            "--requests", "60", "--rate-per-s", "20"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    for needle in ("4 replicas", "1:3", "2:2", "TTFT p99", "ITL p99", "goodput", "NVLink 4", "128 KiB a token"):
        assert needle in out, needle
    assert main([*argv, "--json", "--link", "ib-400"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["split"] for r in rows] == ["4 replicas", "1:3", "2:2"] and rows[1]["link"] == "ib-400"
    assert rows[0]["transfers"] == 0 and rows[2]["transfers"] == 60


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--split", "2:5"], "--split 2:5 is 7 cards, but the fleet has --cards 8"),
        (["--split", "0:8"], "--split takes prefill:decode card counts"),
        (["--tp", "2"], "--fleet runs one engine per card"),
        (["--link", "ib-9"], "unknown link 'ib-9'"),
    ],
)
def test_fleet_mistakes_are_one_clear_line(capsys, argv, needle):
    assert main(["whatif", "--fleet", "--gpu", "h100-sxm", "--requests", "5", *argv]) == 2
    assert needle in capsys.readouterr().err
