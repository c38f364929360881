"""DistServe's systems as minillm's engines, each run once over a crowd at one rate: every request's TTFT and TPOT.

vllm        colocated, the paper's baseline (vLLM 0.2, section 6.1): one engine on `vllm_tp` cards, prefill first
            (papers/sarathi_vllm.py: while prompts wait and fit, a step runs only whole prompts, up to 16,384 tokens;
            the running requests decode in steps with no prompt), 1,024 seats.
distserve   disaggregated: the placement's prefill instances (whole prompts, FCFS, batches up to 8,192 tokens and
            128 seats: the same prefill-first policy, which on an engine with nothing decoding is just that) and
            decoding instances (every running request decodes each step, 1,024 seats), the KV handed over on NVLink
            (distserve_fleet.py).
prefill     Figure 1's "system serving only the prefill phase": a prefill instance alone, each request done at its
            first token (TTFT only).
decode      Figure 1's decoding-only system: a decoding instance alone, each request arriving with its prompt's KV
            and its first token (TPOT only).

TTFT: arrival to first token; TPOT: (last token - first token) / (tokens - 1), the artifact's definitions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minillm.card.hardware import get_link
from minillm.config import EngineConfig
from minillm.engine.engine import Engine
from minillm.engine.request import Request
from minillm.engine.scheduler import ContinuousScheduler
from minillm.papers import distserve_setup as setup
from minillm.papers.distserve_cost import make_runner
from minillm.papers.distserve_fleet import PlacedFleet
from minillm.papers.sarathi import Watch
from minillm.papers.sarathi_crowd import Crowd
from minillm.papers.sarathi_vllm import PrefillFirstScheduler
from minillm.papers.traces import paper_engine

PROMPT_TOKEN = 5  # every prompt token (the simulated card needs ids, not text)
FIRST_TOKEN = 32  # a decoding-only request's first token, as if its prefill had made it
SYSTEMS = ("vllm", "distserve", "prefill", "decode")


@dataclass(frozen=True)
class Deployment:
    """What runs: the model, the colocated engine's cards, the placement, each step's prices and the KV's link."""

    model: str
    vllm_tp: int
    placement: setup.Placement
    prices: str = "roofline"  # or "paper" (distserve_cost.py)
    link: str = setup.LINK

    def gpus(self, system: str) -> int:
        p = self.placement
        return {"vllm": self.vllm_tp, "distserve": p.gpus, "prefill": p.prefill_tp, "decode": p.decode_tp}[system]


@dataclass(frozen=True)
class Outcome:
    """One request's latencies (tpot None: one token, nothing to average; ttft None: decoding-only)."""

    ttft_s: float | None
    tpot_s: float | None


def engine_on(deployment: Deployment, tp: int, kind: str, policy, seats: int, layered: bool = False) -> Engine:
    runner = make_runner(deployment.model, tp, kind, deployment.prices)
    cfg = EngineConfig(slots=seats, kv="paged", num_blocks=runner.pool_blocks(setup.BLOCK), block_size=setup.BLOCK,
                       max_len=min(runner.max_len, setup.MAX_LEN), record_blocks=False)  # fmt: skip
    name, meta = f"distserve-{kind}-{policy.name}-tp{tp}", {"model": deployment.model, "gpu": runner.card.name}
    return paper_engine(runner, policy, cfg, name, meta, layered)


def prefill_instance(d: Deployment, layered: bool = False) -> Engine:
    policy = PrefillFirstScheduler(max_batched_tokens=setup.CONTEXT.batch_tokens)
    return engine_on(d, d.placement.prefill_tp, "distserve", policy, setup.CONTEXT.seats, layered)


def decode_instance(d: Deployment, layered: bool = False) -> Engine:
    policy = ContinuousScheduler(token_budget=setup.DECODING.batch_tokens)
    return engine_on(d, d.placement.decode_tp, "distserve", policy, setup.DECODING.seats, layered)


def requests_of(crowd: Crowd, rate: float, system: str) -> list[Request]:
    """The crowd at `rate`: a prefill-only system makes one token each; a decoding-only one starts at the second."""
    out = []
    for i, (prompt, reply, t) in enumerate(zip(crowd.prompts, crowd.outputs, crowd.arrivals(rate))):
        made = [FIRST_TOKEN] if system == "decode" else []
        out.append(Request(f"r{i}", [PROMPT_TOKEN] * prompt, 1 if system == "prefill" else reply, ignore_eos=True,
                           arrival_s=t, output_ids=made))  # fmt: skip
    return out


def outcomes(requests: list[Request], times: dict[str, list[float]], system: str) -> list[Outcome]:
    found = []
    for r in requests:
        made = times.get(r.id, [])
        if system == "decode":  # (its first token came with it, at arrival)
            made = [r.arrival_s, *made]
        ttft = None if system == "decode" else made[0] - r.arrival_s
        tpot = (made[-1] - made[0]) / (len(made) - 1) if len(made) > 1 else None
        found.append(Outcome(ttft, tpot))
    return found


def serve(deployment: Deployment, system: str, crowd: Crowd, rate: float) -> list[Outcome]:
    """The crowd at `rate` (requests per second, all cards together) through one system."""
    requests, watch = requests_of(crowd, rate, system), Watch()
    if system == "distserve":
        p = deployment.placement
        prefill = [prefill_instance(deployment, layered=True) for _ in range(p.prefill)]
        decode = [decode_instance(deployment, layered=True) for _ in range(p.decode)]
        for engine in prefill + decode:
            engine.observers.append(watch)
        PlacedFleet(
            prefill[0].runner.spec, get_link(deployment.link), requests, prefill, decode, setup.DTYPE
        ).simulate()
        return outcomes(requests, watch.tokens, system)
    if system == "vllm":
        policy = PrefillFirstScheduler(max_batched_tokens=setup.VLLM.batch_tokens)
        engine = engine_on(deployment, deployment.vllm_tp, "vllm", policy, setup.VLLM.seats)
    else:
        engine = (prefill_instance if system == "prefill" else decode_instance)(deployment)
    engine.observers.append(watch)
    for r in requests:
        brought = len(r.prompt_ids) if system == "decode" else 0
        engine.submit(r, kv=(torch.empty(0, brought, 0, 0),) * 2 if brought else None)
    engine.run()
    return outcomes(requests, watch.tokens, system)
