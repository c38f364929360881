"""DistServe's crowds: prompt and reply lengths, Poisson arrivals (section 6.1) at any rate.

fixed-512-64  Figure 1's synthetic workload: every prompt 512 tokens, every reply 64.
sharegpt      the chatbot's ShareGPT. DistServe's prepared data set is not published, nor Figure 7's numbers
              (distserve_setup.py), so an assumption, named: the lengths of the ShareGPT trace Sarathi-Serve's
              repository publishes (its quantiles, sarathi_setup.TRACES["openchat_sharegpt4"]: multi-turn prompts,
              as DistServe builds them), kept where prompt + reply < 2048 tokens as DistServe's preparation keeps
              them (0-prepare-dataset.py). Kept that way: prompt mean about 610 tokens, reply mean about 410.

The lengths and the gaps between arrivals at 1 request per second are drawn once per seed: a run at rate r divides
the gaps by r, so every rate a search tries serves the same requests in the same order (sarathi_crowd.py's rule).
"""

from __future__ import annotations

import random

from minillm.errors import ConfigError
from minillm.papers.distserve_setup import MAX_LEN
from minillm.papers.sarathi_crowd import Crowd, from_quantiles
from minillm.papers.sarathi_setup import TRACES as SARATHI_TRACES

TRACES = {
    "sharegpt": "ShareGPT lengths from Sarathi-Serve's published trace quantiles, prompt + reply < 2048 (assumed)",
    "fixed-512-64": "every prompt 512 tokens, every reply 64 (Figure 1)",
}


def draw(trace: str, requests: int, seed: int = 0) -> Crowd:
    """`requests` requests of `trace`, and their Poisson gaps at 1 request per second."""
    if trace not in TRACES:
        raise ConfigError(f"unknown trace {trace!r}; choose from {', '.join(TRACES)}")
    rng = random.Random(seed)
    if trace == "fixed-512-64":
        prompts, outputs = [512] * requests, [64] * requests
    else:
        table, prompts, outputs = SARATHI_TRACES["openchat_sharegpt4"], [], []
        while len(prompts) < requests:
            prompt = from_quantiles(table.prompt_quantiles, rng.random())
            output = from_quantiles(table.output_quantiles, rng.random())
            if prompt + output < MAX_LEN:  # (0-prepare-dataset.py drops prompt_len + output_len >= 2048)
                prompts.append(prompt)
                outputs.append(output)
    gaps = tuple(rng.expovariate(1.0) for _ in range(requests))
    return Crowd(tuple(prompts), tuple(outputs), gaps)
