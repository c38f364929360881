"""The same engine on a simulated card: nothing lost, no block leaked, and step times that obey the roofline."""

import inspect
import io
import json
import tokenize

import pytest

import minillm.engine.engine
import minillm.engine.scheduler
from minillm.__main__ import main
from minillm.card.hardware import get_device
from minillm.card.modelspec import load_spec
from minillm.card.roofline import decode_cost, kv_blocks, weight_bytes
from minillm.card.simulate import SimulatedRunner
from minillm.runs import trace_file
from minillm.runs.metrics import per_request, summarize
from minillm.runs.run import run_workload
from minillm.runs.workload import AZURE, ChatKnobs, azure


def simulate(workload="azure-conv", gpu="rtx-4090", model="llama-3.1-8b", requests=60, rate_per_s=4.0, **kw):
    runner = SimulatedRunner(load_spec(model), get_device(gpu))
    knobs = ChatKnobs(requests=requests, rate_per_s=rate_per_s, force_lengths=workload == "chat")
    return runner, run_workload(runner, workload, knobs=knobs, **kw)


@pytest.mark.parametrize("scheduler", ["static", "continuous"])
@pytest.mark.parametrize("budget", [0, 256])
def test_every_request_gets_its_planned_reply_and_every_block_comes_back(scheduler, budget):
    runner, trace = simulate(scheduler=scheduler, token_budget=budget)
    planned = {r.id: r.planned_reply for r in azure("azure-conv", ChatKnobs(requests=60, rate_per_s=4.0))}
    for r in trace.requests:
        assert r.finish_reason == "eos" and len(r.output_ids) == planned[r.id]
    last, block = trace.steps[-1], trace.config["block_size"]
    ending = [r for r in trace.requests if r.id in last.finished]  # the last step's record still shows their KV
    stored = [len(r.prompt_ids) + len(r.output_ids) for r in ending]  # (EOS: the last reply token was fed)
    assert last.kv_tokens_stored == sum(stored)  # nobody else holds a token: every block comes back after it
    assert last.kv_blocks_used == sum(-(-n // block) for n in stored)
    still = [rid for _, rid, state, _, _ in last.seats if state != "held" and rid not in last.finished]
    assert not still, "someone is still running after the run"
    assert trace.config["num_blocks"] == kv_blocks(runner.spec, runner.card)
    assert trace.config["clock"] == "simulated" and trace.config["gpu"] == "rtx-4090"


def test_arrivals_in_seconds_are_honoured_and_the_clock_waits_for_them():
    _, trace = simulate(requests=30, rate_per_s=0.5)  # sparse: the card is often idle
    starts = {s.step: s.time_s - s.wall_s for s in trace.steps}
    for r in trace.requests:
        assert starts[r.admit_step] >= r.arrival_s - 1e-9, f"{r.id} was admitted before it arrived"
    gaps = [b.time_s - b.wall_s - a.time_s for a, b in zip(trace.steps, trace.steps[1:])]
    assert max(gaps) > 0.5, "idle time between arrivals was skipped, not stepped through"
    assert summarize(trace)["ttft_p50_s"] < 1.0


def test_a_lone_user_decodes_at_the_roofline_step_time():
    """One request at a time: every decode step costs what the cost model says for batch 1 at that context."""
    runner, trace = simulate(workload="chat", requests=3, rate_per_s=0.01, token_budget=0)
    spec, card = runner.spec, runner.card
    for r in trace.requests:
        context = len(r.prompt_ids) + len(r.output_ids) // 2
        tpot = per_request(trace)[r.id]["tpot_s"]
        assert tpot == pytest.approx(decode_cost(spec, card, 1, context).time_s, rel=0.02)
        assert tpot > weight_bytes(spec) / card.bandwidth, "faster than streaming the weights once per token"


def test_a_faster_card_serves_the_same_crowd_with_lower_latency():
    figures = {gpu: summarize(simulate(gpu=gpu, requests=80, rate_per_s=3.0)[1]) for gpu in ("rtx-4090", "h100-sxm")}
    assert figures["h100-sxm"]["tpot_p50_s"] < figures["rtx-4090"]["tpot_p50_s"] / 2
    assert figures["h100-sxm"]["finished"] == figures["rtx-4090"]["finished"] == 80


def test_a_simulated_trace_round_trips_and_stays_small(tmp_path):
    _, trace = simulate(requests=100)
    trace.save(tmp_path / "sim.json")
    size = (tmp_path / "sim.json").stat().st_size
    assert size < 100 * 50e6 / 2000, f"{size} bytes for 100 requests: 2000 would pass 50 MB"
    again = trace_file.load(tmp_path / "sim.json")
    assert summarize(again) == summarize(trace)


def test_azure_lengths_follow_the_published_quantiles():
    requests = azure("azure-code", ChatKnobs(requests=2000), seed=3)
    prompts = sorted(len(r.prompt_ids) for r in requests)
    replies = sorted(r.planned_reply for r in requests)
    assert prompts[1000] == pytest.approx(AZURE["azure-code"]["prompt"][11], rel=0.1)  # the median
    assert replies[1000] == pytest.approx(AZURE["azure-code"]["reply"][11], rel=0.15)


def test_the_engine_and_schedulers_never_ask_whether_they_are_simulated():
    for module in (minillm.engine.engine, minillm.engine.scheduler):
        source = io.StringIO(inspect.getsource(module))
        names = [t.string.lower() for t in tokenize.generate_tokens(source.readline) if t.type == tokenize.NAME]
        assert not [n for n in names if "simulat" in n or "virtual" in n], f"{module.__name__} knows it is simulated"


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--simulate", "gpt-5"], "unknown model"),
        (["--simulate", "llama-3.1-8b", "--gpu", "abacus"], "unknown"),
        (["--simulate", "llama-3.1-70b", "--gpu", "rtx-4090"], "does not fit"),
        (["--workload", "azure-conv"], "--simulate"),
        (["--simulate", "llama-3.1-8b", "--kv", "contiguous"], "--kv paged"),
    ],
)
def test_simulation_mistakes_are_one_clear_line(capsys, argv, needle):
    assert main(["run", "--requests", "4", "--json", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and needle in err and "\n" not in err


def test_fixed_prompt_and_reply_lengths_as_published_tables_state_them(capsys):
    argv = ["run", "--simulate", "llama-3.1-8b", "--gpu", "h100-sxm", "--workload", "azure-conv", "--requests", "6",
            "--prompt-len", "300", "--reply-len", "40", "--json"]  # fmt: skip
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["prefill_tokens"] == 6 * 300 and summary["output_tokens"] == 6 * (40 + 1)  # each reply, then EOS
    # the seconds are the simulated clock's, and say so; a trace keeps wall_s per step (the same format)
    assert "wall_s" not in summary and summary["simulated_s"] > 0
    assert summary["tokens_per_s"] == pytest.approx(summary["output_tokens"] / summary["simulated_s"])


def test_fixed_lengths_need_a_simulated_workload(capsys):
    assert main(["run", "--workload", "chat", "--prompt-len", "10", "--json"]) == 2
    err = capsys.readouterr().err
    assert "--prompt-len" in err and "azure-conv" in err and err.count("\n") == 1


def test_more_seats_than_the_documented_256_are_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--simulate", "llama-3.1-8b", "--slots", "1000", "--json"])
    assert exit_.value.code == 2 and "at most 256 seats, got 1000" in capsys.readouterr().err
