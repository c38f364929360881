"""The vLLM paper, reproduced: a ShareGPT-like trace through FasterTransformer, Orca (Max, Pow2, Oracle) and vLLM on a
simulated A100 40GB serving OPT-13B, with minillm's own engine, schedulers and KV books.

Each system is a policy and a way to hold KV (vllm_setup.py, with sources). FasterTransformer: the static policy, its
batch the rows of 2,048 tokens the card's KV memory holds (the pool holds exactly those rows, as anyscale.py models
contiguous memory). Orca: the continuous policy admitting through a buddy allocator of contiguous chunks
(vllm_buddy.py). vLLM: the continuous policy on paged blocks. Two measurements, as the paper's:
- one run at Fig. 13a's rate: the requests batched per step and where the KV memory goes (vllm_memory.py);
- the highest request rate each system sustains at the same normalized latency (end-to-end seconds per output token,
  averaged over requests), found by bracketing and interpolating over the rate on the same trace, and vLLM's multiple
  of each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from minillm.card.hardware import Device, get_device
from minillm.card.modelspec import ModelSpec, load_spec
from minillm.config import EngineConfig
from minillm.engine.engine import Engine
from minillm.engine.request import Request
from minillm.engine.scheduler import ContinuousScheduler, StaticScheduler
from minillm.errors import ConfigError
from minillm.papers import vllm_setup as setup
from minillm.papers.anyscale_runner import Implementation, PricedRunner
from minillm.papers.traces import paper_engine
from minillm.papers.vllm_buddy import OrcaScheduler
from minillm.papers.vllm_memory import KVUsage
from minillm.papers.vllm_trace import Trace

PROMPT_TOKEN = 5  # every prompt token (the simulated card needs ids, not text)


@dataclass
class Run:
    """One system serving the trace at one rate."""

    system: str
    rate: float
    normalized_latency: float  # s/token: mean over requests of end-to-end latency / output tokens
    batched: float  # requests in the batch per step, over the steady part of the trace (vllm_memory.py)
    usage: dict  # percent of the KV pool by kind (vllm_memory.KINDS), over the same steps
    seconds: float  # simulated time to serve the trace
    steps: int
    preemptions: int
    seats: int
    step_ms: float = 0.0  # the mean step


@dataclass
class Capacity:
    """The highest rate a system sustains under the latency threshold, and the runs that found it."""

    system: str
    rate: float  # req/s
    tried: list = field(default_factory=list)  # (rate, normalized latency), in the order run


def engine_for(system: setup.System, runner: PricedRunner, name: str) -> tuple[Engine, object]:
    """The system's engine on the card, and how to read the slots each request holds. name: the run's (traces.py)."""
    meta = {"model": runner.spec.name, "gpu": runner.card.name}
    made = lambda policy, cfg: paper_engine(runner, policy, cfg, name, meta)
    pool = runner.pool_blocks(setup.BLOCK)
    row = setup.MAX_SEQUENCE // setup.BLOCK
    config = dict(kv="paged", block_size=setup.BLOCK, max_len=runner.max_len, record_blocks=False)
    if system.policy == "static":  # B rows of 2048, as many as the KV memory holds
        seats = pool // row
        engine = made(StaticScheduler(token_budget=None), EngineConfig(slots=seats, num_blocks=seats * row, **config))
        return engine, lambda e, r: setup.MAX_SEQUENCE
    if system.reserve == "paged":
        cfg = EngineConfig(slots=setup.MAX_SEQS, num_blocks=pool, **config)
        engine = made(ContinuousScheduler(setup.TOKEN_BUDGET), cfg)
        return engine, lambda e, r: -(-r.num_computed // setup.BLOCK) * setup.BLOCK  # whole blocks, no sharing
    orca = OrcaScheduler(system.reserve, pool * setup.BLOCK, setup.BLOCK, setup.TOKEN_BUDGET)
    engine = made(orca, EngineConfig(slots=setup.MAX_SEQS, num_blocks=pool, **config))
    return engine, lambda e, r: orca.chunks[r.id][2]


@dataclass(frozen=True)
class Bench:
    """Where every run happens: the model, the card, the trace, and what each step pays beyond the roofline."""

    spec: ModelSpec
    card: Device
    trace: Trace
    step_s: float = 0.0  # seconds added to every step (the measured account's cost; 0: a serving engine's step)


def run_system(system: setup.System, bench: Bench, rate: float) -> Run:
    """The trace at `rate` req/s through one system on the simulated card."""
    implementation = Implementation(pause_per_step_s=bench.step_s)
    runner = PricedRunner(bench.spec, bench.card, implementation, setup.DTYPE, setup.DTYPE)
    trace = bench.trace
    engine, reserved_of = engine_for(system, runner, f"vllm-paper-{system.key}-rate{rate:.3g}")
    arrivals = trace.arrivals(rate)
    steady = arrivals[len(arrivals) // 4], arrivals[-1]  # (vllm_memory.py: the warm-up and the drain left out)
    usage = KVUsage(runner.pool_blocks(setup.BLOCK) * setup.BLOCK, *steady, reserved_of)
    engine.observers.append(usage)
    for i, ((prompt, output), at) in enumerate(zip(trace.lengths, arrivals)):
        engine.submit(Request(f"r{i}", [PROMPT_TOKEN] * prompt, output, ignore_eos=True, arrival_s=at))
    engine.run()
    served = [r for r in engine.requests if r.finish_reason == "length"]
    if len(served) < len(engine.requests):
        raise ConfigError(f"{system.key} at {rate:g} req/s: {len(engine.requests) - len(served)} requests not served")
    latency = sum((r.finish_s - r.arrival_s) / r.max_new_tokens for r in served) / len(served)
    return Run(system.key, rate, latency, usage.batched, usage.shares(), runner.clock.now(), engine.step_no,
               sum(r.preemptions for r in served), engine.cfg.slots,
               1e3 * runner.busy_s / max(1, engine.step_no))  # fmt: skip


def capacity(system: setup.System, bench: Bench, slo: float, start: tuple[float, float | None], factor: float = 1.3,
             refinements: int = 1) -> Capacity:  # fmt: skip
    """The rate at which the normalized latency crosses `slo`: from `start` (a rate, and its latency if a run already
    measured it), step by `factor` up (or down) until the crossing is bracketed, narrow the bracket `refinements`
    times by interpolating log latency against log rate, and read the crossing off the last bracket the same way."""
    found = Capacity(system.key, 0.0)

    def latency(rate: float) -> float:
        value = run_system(system, bench, rate).normalized_latency
        found.tried.append((rate, value))
        return value

    lo = hi = (start[0], start[1] if start[1] is not None else latency(start[0]))
    while lo[1] > slo:  # not sustained: come down
        if lo[0] < 1e-3:
            raise ConfigError(f"{system.label} misses {slo} s/token even at {lo[0]:.4f} req/s")
        hi, lo = lo, (lo[0] / factor, latency(lo[0] / factor))
    while hi[1] <= slo:  # sustained: go up
        if hi[0] > len(bench.trace.gaps) * 10:  # (all of them at once, near enough)
            few = len(bench.trace.gaps)
            raise ConfigError(f"{system.label} stays under {slo} s/token even with the {few} requests all at once: "
                              "too few to load the card; ask for more --requests or a lower --slo")  # fmt: skip
        lo, hi = hi, (hi[0] * factor, latency(hi[0] * factor))
    for _ in range(refinements):
        mid = crossing(lo, hi, slo)
        point = (mid, latency(mid))
        lo, hi = (point, hi) if point[1] <= slo else (lo, point)
    found.rate = crossing(lo, hi, slo)
    return found


def crossing(lo: tuple[float, float], hi: tuple[float, float], slo: float) -> float:
    """Where the line through (log rate, log latency) of lo and hi meets `slo` (kept inside the bracket)."""
    (r0, l0), (r1, l1) = lo, hi
    t = (math.log(slo) - math.log(l0)) / (math.log(l1) - math.log(l0)) if l1 > l0 else 0.5
    t = min(0.9, max(0.1, t))  # (never the bracket's own ends: each refinement must narrow it)
    return math.exp(math.log(r0) + t * (math.log(r1) - math.log(r0)))


def bench_for(model: str, gpu: str, trace: Trace, step_s: float = 0.0) -> Bench:
    return Bench(load_spec(model), get_device(gpu), trace, step_s)  # (minillm/card/models/NAME.json, with sources)
