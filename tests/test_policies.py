"""Who goes first (issue 42): the priority and deadline policies, the victim rules, a request's service and goodput.

Token-exactness under every policy and victim rule is checked by the engine fuzz (tests/test_engine_fuzz.py draws
them with random promises); here each rule's own decisions are checked, step by step where they happen."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import pytest

from minillm.config import EngineConfig
from minillm.engine.generate import generate
from minillm.engine.request import Request, State
from minillm.errors import ConfigError, InputError
from minillm.layers import LayeredEngine
from minillm.layers.policies import VICTIMS, DeadlinePolicy, PriorityPolicy, due, make_policy
from minillm.layers.service import Service, judge
from minillm.model.tokenizer import encode_prompt
from minillm.runs import trace_file
from minillm.runs.metrics import goodput_figures, per_request, summarize


def engine_with(model, policy, slots=1, **cfg) -> LayeredEngine:
    return LayeredEngine(model, policy, EngineConfig(slots=slots, **cfg))


def ask(rid: str, text: str = "count down from 9", n: int = 8, step: int = 0, arrival_s=None) -> Request:
    return Request(rid, encode_prompt(text), n, arrival_step=step, arrival_s=arrival_s, ignore_eos=True)


def admissions(trace) -> list[str]:
    return [rid for s in trace.steps for rid in s.admitted]


# --- priority ---------------------------------------------------------------------------------------------------------
def test_priority_seats_the_lowest_number_first_and_equal_ones_in_queue_order(shipped_model):
    engine = engine_with(shipped_model, PriorityPolicy())
    for rid, priority in [("a", 1), ("b", 0), ("c", 1), ("d", 0)]:
        engine.submit(ask(rid, n=3), service=Service(priority=priority))
    trace = engine.run()
    assert admissions(trace) == ["b", "d", "a", "c"]
    assert [trace.request(rid).service["priority"] for rid in "abcd"] == [1, 0, 1, 0]


def test_a_higher_priority_newcomer_takes_a_lower_ones_seat_and_the_trace_says_why(shipped_model):
    engine = engine_with(shipped_model, PriorityPolicy())
    engine.submit(ask("batch", "count down from 30", n=40), service=Service("batch", priority=2))
    engine.submit(ask("same", n=3, step=2), service=Service("batch", priority=2))  # equal: it waits its turn
    engine.submit(ask("chat", n=3, step=5), service=Service("chat", priority=0))
    trace = engine.run()
    step = next(s for s in trace.steps if s.preempted)
    assert step.step == 5 and step.preempted == ["batch"] and step.admitted == ["chat"]
    assert step.preempted_why["batch"].startswith("chat outranks it (priority 0)")
    assert admissions(trace) == ["batch", "chat", "batch", "same"]  # back at the front of its own rank
    for r in engine.requests:  # the preempted one recomputed its way back to the same reply
        assert r.output_ids == generate(shipped_model, r.prompt_ids, r.max_new_tokens, ignore_eos=True).tokens


def test_a_newcomer_that_cannot_sit_even_so_displaces_nobody(shipped_model):
    """A higher-priority request needing more blocks than the lower one would free: nobody is preempted for it."""
    engine = engine_with(shipped_model, PriorityPolicy(), slots=2, num_blocks=10, block_size=4)  # 40 tokens
    engine.submit(ask("low", "spell 1", n=6), service=Service(priority=1))  # 9 + 6 tokens: 4 blocks at most
    engine.submit(ask("mid", "spell 2", n=6), service=Service(priority=0))
    engine.step()
    big = ask("big", "x" * 28, n=2, step=1)  # a 30-token prompt: 8 blocks, more than low's 3 and the 4 free
    engine.submit(big, service=Service(priority=0))
    assert big.state is State.WAITING and not engine.step().preempted
    trace = engine.run()  # once mid leaves, low's seat and blocks are enough: then big takes them
    assert admissions(trace) == ["mid", "low", "big", "low"]
    assert next(s.step for s in trace.steps if s.preempted) > trace.request("mid").finish_step


# --- deadline ---------------------------------------------------------------------------------------------------------
class Clock:
    def __init__(self, t: float = 0.0):
        self.t = t

    def now(self) -> float:
        return self.t


@dataclass
class Books:
    services: dict
    clock: Clock


def test_due_is_the_ttft_target_until_the_first_token_then_the_deadline_and_aging_without_targets():
    policy = DeadlinePolicy(aging_s=30.0)
    promised = {"chat": Service(ttft_s=1.0), "batch": Service(deadline_s=60.0), "both": Service(ttft_s=2, deadline_s=9)}
    policy.attach(Books(promised, Clock(5.0)))
    requests = {rid: ask(rid, arrival_s=1.5) for rid in ["chat", "batch", "both", "none"]}
    assert [due(policy, requests[rid]) for rid in ["chat", "batch", "both", "none"]] == [2.5, 61.5, 3.5, 31.5]
    for r in requests.values():
        r.first_token_step = 3
    assert [due(policy, requests[rid]) for rid in ["chat", "batch", "both"]] == [
        2.5,
        61.5,
        10.5,
    ]  # chat: keeps its seat
    by_step = ask("by-step")  # arrivals by step: the clock when the policy first sees it, remembered
    assert due(policy, by_step) == 35.0
    policy.attach(Books({}, Clock(9.0)))
    assert due(policy, by_step) == 35.0


def test_deadline_seats_the_earliest_due_first_and_a_batch_job_is_not_starved(shipped_model):
    policy = DeadlinePolicy(aging_s=0.5)
    engine = engine_with(shipped_model, policy)
    engine.submit(ask("batch", n=3, arrival_s=0.0), service=Service("batch", deadline_s=100.0))
    engine.submit(ask("anyone", n=3, arrival_s=0.0))  # no target: due 0.5 s after it came (aging)
    engine.submit(ask("chat", n=3, arrival_s=0.0), service=Service("chat", ttft_s=0.2))
    trace = engine.run()
    assert admissions(trace) == ["chat", "anyone", "batch"]
    assert summarize(trace)["longest_wait_s"] == per_request(trace)["batch"]["queue_s"] > 0


# --- victim rules -----------------------------------------------------------------------------------------------------
class ShortKV:
    """A pool with nothing free: every running request needs one more block, and holds `held` of them."""

    def __init__(self, held: dict[int, int]):
        self.held = held

    free_blocks = 0

    def blocks_to_admit(self, num_tokens, token_ids=None, leaving=()):
        return 1

    def blocks_to_grow(self, seat, num_new=1):
        return 1 if num_new else 0

    def blocks_held(self, seat):
        return self.held[seat]

    def cached_prefix(self, token_ids):
        return 0


def running(rid: str, seat: int, order: int, computed: int) -> Request:
    r = ask(rid, n=50)
    r.state, r.seat, r.admit_order, r.num_computed = State.RUNNING, seat, order, computed
    r.output_ids = [1] * (computed - len(r.prompt_ids) + 1)  # decoding: one token to run
    return r


@pytest.mark.parametrize("rule, victim", [("newest", "c"), ("least-computed", "a"), ("lowest-priority", "b"),
                                          ("latest-due", "b")])  # fmt: skip
def test_each_victim_rule_preempts_its_own_choice_and_names_it(rule, victim):
    seats = [running("a", 0, 0, 30), running("b", 1, 1, 60), running("c", 2, 2, 45)]
    policy = make_policy("deadline" if rule == "latest-due" else "priority", victim=rule)
    promised = {"a": Service(priority=0, ttft_s=1), "b": Service(priority=3, deadline_s=50), "c": Service(priority=1)}
    policy.attach(Books(promised, Clock(0.0)))
    for r in seats:
        r.arrival_s = 0.0
    plan = policy.schedule([], seats, ShortKV({0: 3, 1: 3, 2: 3}))
    assert [r.id for r in plan.preempt] == [victim]
    assert plan.why == {victim: f"the KV cache was full: {rule}"}


# --- the service, judged ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad, named", [({"priority": 1.5}, "priority"), ({"priority": True}, "priority"),
                                        ({"ttft_s": -1}, "ttft_s"), ({"deadline_s": math.inf}, "deadline_s"),
                                        ({"cls": ""}, "class")])  # fmt: skip
def test_a_bad_service_is_refused_naming_the_field(bad, named):
    with pytest.raises(InputError, match=named):
        Service(**bad)


def test_targets_are_met_at_equality_missed_past_it_and_never_by_an_unfinished_request():
    s = Service(ttft_s=1.0, tpot_s=0.1, deadline_s=5.0)
    assert judge(s, {"ttft_s": 1.0, "tpot_s": 0.1, "latency_s": 5.0}, True) == dict.fromkeys(s.targets, True)
    assert judge(s, {"ttft_s": 1.0001, "tpot_s": 0.1, "latency_s": 5.0}, True)["ttft_s"] is False
    assert judge(s, {"ttft_s": 0.5, "latency_s": 1.0}, True)["tpot_s"] is True  # a one-token reply: no TPOT to miss
    assert not any(judge(s, {"ttft_s": 0.5}, False).values())  # aborted or cut short
    assert judge(Service(), {}, True) == {}


def test_goodput_counts_requests_that_met_all_their_targets_per_second_and_per_class(shipped_model):
    engine = engine_with(shipped_model, make_policy("priority"), slots=2)
    engine.submit(ask("c0", n=4), service=Service("chat", ttft_s=1e-9))  # impossible: missed
    engine.submit(ask("c1", n=4), service=Service("chat", ttft_s=60.0))
    engine.submit(ask("b0", n=4), service=Service("batch", priority=1, deadline_s=60.0))
    trace = engine.run()
    g = goodput_figures(trace)
    assert (g["targets_met"], g["chat_targets_met"], g["batch_targets_met"]) == (2, 1, 1)
    assert g["goodput_per_s"] == pytest.approx(2 / trace.steps[-1].time_s)
    assert g["chat_targets_met_share"] == 0.5 and g["requests_judged"] == 3


def test_make_policy_refuses_unknown_names_and_a_victim_rule_the_core_policies_lack():
    with pytest.raises(ConfigError, match="unknown policy 'fifo'"):
        make_policy("fifo")
    with pytest.raises(ConfigError, match="preempts the newest"):
        make_policy("static", victim="least-computed")
    with pytest.raises(ConfigError, match="unknown victim rule"):
        make_policy("priority", victim="oldest")
    assert {make_policy("deadline", victim=v).victim for v in VICTIMS} == set(VICTIMS)


def test_the_trace_keeps_the_service_and_the_reasons_and_an_upload_with_a_bad_service_is_refused(shipped_model):
    engine = engine_with(shipped_model, PriorityPolicy())
    engine.submit(ask("low", n=12), service=Service("batch", priority=1, deadline_s=9.0))
    engine.submit(ask("high", n=2, step=3), service=Service("chat", ttft_s=1.0))
    data = engine.run().to_dict()
    back = trace_file.from_dict(json.loads(json.dumps(data)))
    assert back.request("low").service == {"cls": "batch", "priority": 1, "deadline_s": 9.0}
    assert any("outranks" in why for s in back.steps for why in s.preempted_why.values())
    data["requests"][0]["service"] = {"priority": "high"}
    with pytest.raises(trace_file.TraceError, match='request 0: "service"'):
        trace_file.from_dict(data)


def test_run_serves_the_mixed_crowd_by_deadline_and_reports_goodput_per_class(capsys):
    from minillm.__main__ import main

    argv = ["run", "--workload", "mixed", "--requests", "6", "--rate", "1000", "--scheduler", "deadline"]
    assert main([*argv, "--chat-ttft-s", "30", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["chat_requests_judged"] + summary["batch_requests_judged"] == 6
    assert summary["chat_targets_met_share"] == 1.0 and summary["longest_wait_s"] >= 0
    assert main([*argv, "--victim", "least-computed"]) == 0
    out = capsys.readouterr().out
    assert "continuous batching, deadline first" in out and "requests/s met all their targets (batch" in out
    assert main(["run", "--scheduler", "static", "--victim", "latest-due"]) == 2
    assert "a victim rule goes with the priority or deadline policy" in capsys.readouterr().err
