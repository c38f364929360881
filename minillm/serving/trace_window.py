"""The last steps of a long run, as a trace of its own.

A live server keeps only its most recent steps. metrics.py and the app read a trace whose step
numbers start at 0 and index its list of steps, so a window of steps 5000..5299 is renumbered
0..299, and so are the step fields of its requests. The window's `config["first_step"]` keeps the
real number of its step 0 (the app asks for the steps after the last one it has seen).

A request that was already in flight when the window opens is shown arriving (or being admitted,
or making its first token) at step 0; its times in seconds (arrival_s, first_token_s, finish_s)
are its real ones, so TTFT, TPOT and latency in seconds stay right, while its step counts and
queue time only count from the window's start.
"""

from __future__ import annotations

from dataclasses import replace

from minillm.layers.trace import RequestRecord, StepRecord, Trace


def window(config: dict, requests: list[RequestRecord], steps: list[StepRecord], first: int) -> Trace:
    """A trace of `steps` (consecutive, the first numbered `first`; none yet: the next step's number) and the
    requests they concern."""
    config = config | {"first_step": first}
    if first == 0:
        return Trace(config=config, requests=list(requests), steps=list(steps))
    since = lambda n: None if n is None else max(0, n - first)
    requests = [
        replace(r, arrival_step=since(r.arrival_step), admit_step=since(r.admit_step),
                first_token_step=since(r.first_token_step), finish_step=since(r.finish_step))
        for r in requests
    ]  # fmt: skip
    return Trace(config=config, requests=requests, steps=[replace(s, step=s.step - first) for s in steps])
