"""Lesson 06 exercise: latency metrics from a trace. Check your work: pytest -m lesson06"""

from __future__ import annotations

from minillm.trace import Trace


def ttft_tpot(trace: Trace) -> dict[str, dict[str, float | None]]:
    """Per finished request id: {"ttft_steps": ..., "tpot_steps": ...}, counted in engine steps.

    TTFT (time to first token) = first_token_step - arrival_step + 1: a request admitted in the
    step it arrives gets its first token in that same step, one step of waiting.
    TPOT (time per output token after the first) = (finish_step - first_token_step) / (n - 1),
    where n is the number of tokens it produced: len(output_ids), plus one if it stopped on EOS
    (producing the EOS took a step). None when n == 1.
    Skip requests that did not finish (finish_reason not "eos" or "length").
    """
    raise NotImplementedError("lesson 06: compute TTFT and TPOT per request from the trace")
