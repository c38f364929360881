"""`bench --only fleet`'s colocated-against-disaggregated part, at a tiny size: the client's figures of a server, and
the report's table."""

from __future__ import annotations

from minillm.bench.disaggregation import markdown, measure
from minillm.serving.loadgen import Job
from minillm.serving.server import build_loop


def test_a_server_is_measured_from_the_clients_side(shipped_model):
    figures = measure(build_loop(shipped_model, slots=2), [Job("count down from 5", 20), Job("spell 42", 20, 0.1)])
    assert figures["finished"] == 2 and figures["errors"] == 0
    assert figures["tokens_per_s"] > 0 and figures["ttft_p99_s"] >= figures["ttft_p50_s"] > 0


def test_the_report_sets_the_two_side_by_side():
    side = lambda ttft, itl: {"ttft_p50_s": ttft, "ttft_p99_s": 2 * ttft, "itl_p99_s": itl, "tpot_p50_s": itl / 2,
                              "tokens_per_s": 200.0, "errors": 0, "finished": 24}  # fmt: skip
    r = {"requests": 24, "rate_per_s": 3.0, "slots": 8, "workload": "long-prompts", "colocated": side(0.1, 0.18),
         "disaggregated": side(0.16, 0.15)}  # fmt: skip
    text = "\n".join(markdown(r))
    assert "| TTFT p50 | 100 ms | 160 ms |" in text and "| ITL p99 | 180 ms | 150 ms |" in text
