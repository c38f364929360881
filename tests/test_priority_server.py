"""Who goes first, on the server (issue 42): vLLM's `priority` field in the request body reaches the engine as the
request's Service, the priority policy seats by it (sent with the official `openai` client's extra_body), a priority
that is not a whole number gets a 400 naming it, every policy's /trace keeps it, and a long-running server keeps no
Service of a request it has forgotten. The replies stay token for token the plain loop's.
"""

from __future__ import annotations

import pytest

from minillm.__main__ import main
from minillm.engine.request import Request
from minillm.layers import generate
from minillm.layers.service import Service
from minillm.model.tokenizer import encode_prompt
from minillm.runs import trace_file
from minillm.serving.loadgen import Job, Outcome, jobs_from_workload, request_body, summarize_load
from minillm.serving.router import Router
from minillm.serving.server import ServerThread, build_loop
from minillm.serving.token_stream import Event, TokenStream

openai = pytest.importorskip("openai")

LOW, HIGH = 5, 0
BAD = [1.5, "1", True, None, [0], 2**70]  # a float, a string, a bool, null, a list, past vLLM's 64-bit range


@pytest.fixture(scope="module")
def one_seat(shipped_model):
    """One seat, the priority policy, the engine in a process of its own (as `serve --scheduler priority` runs it):
    the priority crosses the pipe with its request."""
    from minillm.bench.peer import forward_of

    served = forward_of(shipped_model, "prepacked")
    with ServerThread(build_loop(served, scheduler="priority", slots=1, process=True)) as running:
        yield running


@pytest.fixture(scope="module")
def api(one_seat):
    with openai.OpenAI(base_url=one_seat.url, api_key="none", max_retries=0, timeout=60) as client:
        yield client


def chat(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


def request_id(response_id: str) -> str:
    return response_id.split("-", 1)[1]  # chatcmpl-r7 -> r7 (the engine's id)


def test_a_high_priority_request_is_seated_before_the_low_ones_queued_first(one_seat, api, client, shipped_model):
    """A long low-priority reply holds the only seat, two more wait behind it; a high-priority one comes last. It
    takes the seat at once (the running one is preempted, the trace says why), then the rest are served. Each
    create() returns once the server has accepted the request, so they reach the engine in this order."""
    asks = [("count down from 120", LOW, 400), ("spell 42", LOW, 20), ("count down from 9", LOW, 30),
            ("spell 305", HIGH, 30)]  # fmt: skip
    streams = [api.chat.completions.create(model="minillm", messages=chat(prompt), max_tokens=n, stream=True,
                                           extra_body={"priority": p, "return_token_ids": True})
               for prompt, p, n in asks]  # fmt: skip
    replies = []
    for stream in streams:
        chunks = list(stream)
        tokens = [t for c in chunks for choice in c.choices for t in (choice.model_extra.get("token_ids") or [])]
        replies.append((request_id(chunks[0].id), tokens))
    for (_, tokens), (prompt, _, n) in zip(replies, asks):
        assert tokens == generate(shipped_model, encode_prompt(prompt), n).tokens, prompt
    trace = trace_file.loads(client.get(f"{one_seat.base}/trace").content)
    (running, _), (low1, _), (low2, _), (high, _) = replies
    records = {rid: trace.request(rid) for rid, _ in replies}
    assert [records[rid].service for rid, _ in replies] == [{"cls": "default", "priority": p} for _, p, _ in asks]
    assert records[high].admit_step < min(records[low1].admit_step, records[low2].admit_step)
    assert records[running].preemptions >= 1  # it gave its seat to the high-priority request
    why = [s.preempted_why[running] for s in trace.steps if running in s.preempted_why]
    assert why and high in why[0] and "priority 0" in why[0] and "lowest-priority" in why[0]


def test_a_priority_that_is_not_a_whole_number_gets_400_naming_it(one_seat, api, client):
    with pytest.raises(openai.BadRequestError) as refused:
        api.chat.completions.create(model="minillm", messages=chat("spell 4"), max_tokens=3,
                                    extra_body={"priority": 1.5})  # fmt: skip
    assert refused.value.status_code == 400 and "priority must be a whole number" in refused.value.message
    assert "got 1.5" in refused.value.message
    for endpoint, ask in [("completions", {"prompt": "spell 4"}), ("chat/completions", {"messages": chat("spell 4")})]:
        for value in BAD:
            response = client.post(f"{one_seat.url}/{endpoint}", json=ask | {"max_tokens": 3, "priority": value})
            assert response.status_code == 400, (endpoint, value, response.text)
            error = response.json()["error"]
            assert error["param"] == "priority" and error["type"] == "invalid_request_error"
            assert "priority must be a whole number, lower first" in error["message"]
    served = api.completions.create(model="minillm", prompt="spell 4", max_tokens=3, extra_body={"priority": -3})
    assert served.choices[0].text  # a negative priority is a whole number too (vLLM takes it), and it still serves


def test_every_policys_trace_keeps_the_priority_and_a_long_server_forgets_the_services_too(shipped_model, client):
    """The continuous policy ignores priorities but its trace keeps them (absent: 0). A server that forgets old
    steps (keep_steps) forgets their requests' services with them, in the dict the policy reads."""
    with ServerThread(build_loop(shipped_model, slots=2)) as fcfs:
        ask = {"prompt": "count down from 6", "max_tokens": 20}
        ids = [client.post(f"{fcfs.url}/completions", json=ask | extra).json()["id"].removeprefix("cmpl-")
               for extra in ({"priority": 7}, {})]  # fmt: skip
        trace = trace_file.loads(client.get(f"{fcfs.base}/trace").content)
    assert [trace.request(rid).service for rid in ids] == [{"cls": "default", "priority": p} for p in (7, 0)]
    with ServerThread(build_loop(shipped_model, scheduler="priority", slots=1, keep_steps=5)) as short:
        for n in (12, 10, 9):
            client.post(f"{short.url}/completions", json={"prompt": f"count down from {n}", "priority": n})
        kept, services, same = short.loop.ask(
            lambda engine: (
                [r.id for r in engine.requests],
                list(engine.services),
                engine.scheduler.services is engine.services,
            )  # fmt: skip
        ).result(10)
    assert set(services) == set(kept) and len(kept) < 3 and same  # pruned in place: the policy's book is the same


class StandIn:
    """A replica's engine process as the router sees it: it notes what it was sent."""

    alive, steps, error = True, 0, None

    def __init__(self):
        self.sent = []

    def submit(self, request, stream, service=None, follows=None):  # (LoopHandle.submit's arguments)
        self.sent.append((request.id, service))


def test_the_router_sends_the_service_with_the_request_and_with_its_retry():
    first, second = StandIn(), StandIn()
    router = Router([first, second], route="round-robin")
    service = Service(priority=2)
    router.submit(Request("r0", encode_prompt("spell 4"), 3), TokenStream(), service)
    failed, other = (first, second) if first.sent else (second, first)
    assert failed.sent == [("r0", service)]
    router.flights["r0"].stream.put(Event("done", detail="error: its process died"))  # nothing streamed: a retry
    assert other.sent == [("r0", service)]


def test_the_mixed_crowd_sends_its_classes_priorities_and_the_summary_gives_each_class_its_ttft():
    jobs = jobs_from_workload("mixed", 24, seed=2)
    assert {(j.cls, j.priority) for j in jobs} == {("chat", 0), ("batch", 1)}
    assert [request_body(j, "m", "chat")["priority"] for j in jobs] == [j.priority for j in jobs]
    assert "priority" not in request_body(jobs_from_workload("chat", 1)[0], "m", "chat")  # (the server's 0)
    outcomes = [Outcome(Job("p", 9, cls=cls), sent_s=0.0, chunk_s=[t, 1.0], end_s=1.0, output_tokens=2)
                for cls, t in [("chat", 0.1), ("chat", 0.3), ("batch", 0.9)]]  # fmt: skip
    by_class = summarize_load(outcomes)["by_class"]
    assert by_class["chat"]["requests"] == 2 and by_class["chat"]["ttft_p50_s"] == pytest.approx(0.2)
    assert by_class["batch"]["ttft_p99_s"] == pytest.approx(0.9)
    assert "by_class" not in summarize_load([Outcome(Job("p", 9))])  # (a crowd without classes)


def test_serve_takes_the_policies_and_refuses_a_victim_the_policy_cannot_use(capsys):
    from minillm.cli import build_parser

    args = build_parser().parse_args(["serve", "--scheduler", "deadline", "--victim", "least-computed"])
    assert (args.scheduler, args.victim) == ("deadline", "least-computed")
    assert build_parser().parse_args(["load", "--workload", "mixed"]).workload == "mixed"
    code = main(["serve", "--scheduler", "continuous", "--victim", "lowest-priority", "--port", "0"])
    err = capsys.readouterr().err
    assert code == 2 and "a victim rule goes with the priority or deadline policy" in err and err.count("\n") == 1
