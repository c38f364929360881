"""Orca, reproduced: a sampled crowd of the paper's synthetic trace through iteration-level scheduling (Orca) and
request-level batching (FasterTransformer under its dynamic batcher) on simulated A100-40GBs, with minillm's own
engine and KV books; each system's capacity (the highest Poisson rate whose median normalized latency, end-to-end
latency over generated tokens, stays within the bound) found by a search over rate, and the ratio set beside the
paper's 36.9x.

orca_setup.py gives every fact with its source; orca_ft.py FasterTransformer's first iteration (an account's cost).
Pipeline stages: a stage is the model's layers / pp on tp cards (card/simulate.py prices it), and an iteration runs
the stages one after another (pp x a stage's time). Neither system pipelines in the mechanism: FasterTransformer's
best configurations, (1, 1) and (8, 8), make one microbatch a batch, so its stages take turns; Orca's batches in
flight (one per stage, Figure 8a) are an account's cost (orca_report.py).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

from minillm.card.hardware import get_device
from minillm.card.modelspec import load_spec
from minillm.card.simulate import SimulatedRunner
from minillm.config import EngineConfig
from minillm.engine.request import Request
from minillm.engine.scheduler import ContinuousScheduler, StaticScheduler
from minillm.errors import ConfigError
from minillm.papers import orca_setup as setup
from minillm.papers.orca_ft import ShortestFirstScheduler
from minillm.papers.sarathi import search_capacity
from minillm.papers.sarathi_crowd import Crowd, median
from minillm.papers.traces import paper_engine

BLOCK = 16  # tokens per KV block (books only: Orca reserves max_tokens, and no request here outgrows its own)
PROMPT_TOKEN = 5
REQUESTS = 400  # ASSUMPTION: the paper does not say how many requests a trace holds; the default run samples 400
MICRO = (128, 32)
# ASSUMPTION: a rate is sustained only if the system keeps up with it (throughput >= 85% of the rate): a finite crowd
# under overload still meets a per-token median bound of 190 ms (12 s for a median reply) before its queue is long
KEEP_UP = 0.85  # Figure 9's orca(128): 128 input tokens, 32 generated


@dataclass(frozen=True)
class Costs:
    """What the paper's systems do beyond the mechanism, each off by default (the accounts turn them on)."""

    shortest_first: bool = False  # FasterTransformer's first iteration at the batch's shortest input (orca_ft.py)
    pipelined: bool = False  # Orca keeps one batch in flight per pipeline stage


def draw_crowd(requests: int, seed: int = 0) -> Crowd:
    """The paper's synthetic trace: input and output lengths uniform over their ranges, Poisson gaps (the crowd of
    sarathi_crowd.py: a rate divides its gaps)."""
    rng = random.Random(seed)
    inputs = tuple(rng.randint(*setup.INPUT_TOKENS) for _ in range(requests))
    gens = tuple(rng.randint(*setup.GEN_TOKENS) for _ in range(requests))
    return Crowd(inputs, gens, tuple(rng.expovariate(1.0) for _ in range(requests)))


@dataclass
class Point:
    rate: float
    median_ms: float  # median normalized latency, ms per generated token
    throughput: float  # requests / (last result - first arrival)

    def meets(self, bound_ms: float) -> bool:
        return self.median_ms <= bound_ms and self.throughput >= KEEP_UP * self.rate


@dataclass
class Capacity:
    system: str
    max_bs: int
    rate: float  # the highest rate tried that met the bound (0: none did)
    points: list[Point] = field(default_factory=list)
    bounded: bool = True  # False: every rate tried met it (a floor only)


def make_runner(deployment: setup.Deployment) -> SimulatedRunner:
    """One pipeline stage (layers / pp on tp cards); each step pays every stage in turn."""
    spec = load_spec(deployment.model)
    stage = replace(spec, layers=spec.layers // deployment.pp)
    runner = SimulatedRunner(stage, get_device(deployment.gpu), "fp16", "fp16", tp=deployment.tp)
    if deployment.pp > 1:
        run = runner.run

        def run_stages(batch, cache, picker=None):
            before = runner.clock.now()
            out = run(batch, cache, picker)
            runner.clock.advance((runner.clock.now() - before) * (deployment.pp - 1))
            return out

        runner.run = run_stages
    return runner


def scheduler_of(system: str, costs: Costs):
    if system == "orca":
        return ContinuousScheduler(token_budget=None)
    return ShortestFirstScheduler() if costs.shortest_first else StaticScheduler(token_budget=None)


def serve(deployment, system, max_bs, items, lanes=1, costs=Costs(), name="") -> dict[str, float]:
    """items: (id, input, gen, arrival). Each request's result time: its last token (Orca), its batch's end
    (FasterTransformer returns a batch whole). lanes > 1: batches in flight, requests dealt round robin, the KV
    pool shared out."""
    done: dict[str, float] = {}
    for lane in range(lanes):
        runner = make_runner(deployment)
        blocks = runner.pool_blocks(BLOCK) // lanes
        cfg = EngineConfig(slots=max_bs, kv="paged", num_blocks=blocks, block_size=BLOCK, max_len=runner.max_len,
                           record_blocks=False)  # fmt: skip
        meta = {"model": deployment.model, "gpu": deployment.gpu}
        engine = paper_engine(runner, scheduler_of(system, costs), cfg, f"orca-{system}{max_bs}-{name}-{lane}", meta)
        batches, finish = [], {}
        engine.observers.append(
            lambda e, step, batches=batches: step.plan.admit and batches.append([r.id for r in step.plan.admit])
        )
        engine.observers.append(
            lambda e, step, finish=finish: finish.update({r.id: e.clock.now() for r in step.finished})
        )
        for rid, prompt, gen, t in items[lane::lanes]:
            engine.submit(Request(rid, [PROMPT_TOKEN] * prompt, gen, ignore_eos=True, arrival_s=t))
        engine.run()
        if system == "ft":
            for batch in batches:
                end = max(finish[rid] for rid in batch)
                finish.update({rid: end for rid in batch})
        done |= finish
    return done


def run_point(deployment, system, max_bs, crowd: Crowd, rate: float, costs=Costs()) -> Point:
    arrivals = crowd.arrivals(rate)
    items = [(f"r{i}", p, g, t) for i, (p, g, t) in enumerate(zip(crowd.prompts, crowd.outputs, arrivals))]
    lanes = deployment.pp if costs.pipelined and system == "orca" else 1
    done = serve(deployment, system, max_bs, items, lanes, costs, f"rate{rate:.3g}")
    normalized = [(done[rid] - t) / g * 1e3 for rid, _, g, t in items]
    return Point(rate, median(normalized), len(items) / (max(done.values()) - arrivals[0]))


def micro_ms(deployment: setup.Deployment, batch: int = 1) -> float:
    """Figure 9's orca(128) on the simulated cards: a batch of `batch` requests of 128 input tokens generating 32,
    its execution time / 32 (ms per generated token)."""
    prompt, gen = MICRO
    done = serve(deployment, "orca", batch, [(f"m{i}", prompt, gen, 0.0) for i in range(batch)], name="micro")
    return max(done.values()) / gen * 1e3


@dataclass
class Options:
    model: str = "gpt3-175b"
    requests: int = REQUESTS
    seed: int = 0
    systems: tuple[str, ...] = tuple(setup.SYSTEMS)
    orca_batch: int = setup.ORCA_MAX_BS
    ft_batches: tuple[int, ...] | None = None  # None: the deployment's (the best one counts)
    bound_ms: float | None = None  # None: the paper's (or 2 x the simulated orca(128))
    rates: tuple[float, ...] = ()  # given: only these rates, no search
    start_rate: float = 1.0
    costs: Costs = Costs()


def deployment_of(options: Options) -> setup.Deployment:
    if options.model not in setup.DEPLOYMENTS:
        raise ConfigError(f"unknown model {options.model!r}; choose from {', '.join(setup.DEPLOYMENTS)}")
    return setup.DEPLOYMENTS[options.model]


def bound_of(options: Options) -> float:
    deployment = deployment_of(options)
    return options.bound_ms or deployment.bound_ms or 2 * micro_ms(deployment)


def check(options: Options) -> None:
    unknown = [s for s in options.systems if s not in setup.SYSTEMS]
    if unknown:
        raise ConfigError(f"unknown system {unknown[0]!r}; choose from {', '.join(setup.SYSTEMS)}")
    if options.requests < 8:
        raise ConfigError(f"--requests must be at least 8 (a median needs a crowd), got {options.requests}")
    if any(not r > 0 for r in (*options.rates, options.start_rate)):
        raise ConfigError("rates must be above 0 requests per second")
    if options.bound_ms is not None and not options.bound_ms > 0:
        raise ConfigError(f"--bound-ms must be above 0, got {options.bound_ms}")
    deployment_of(options)


def batches_of(options: Options, system: str) -> tuple[int, ...]:
    if system == "orca":
        return (options.orca_batch,)
    return options.ft_batches or deployment_of(options).ft_batches


def capacities(options: Options, costs: Costs | None = None) -> dict[str, Capacity]:
    """Each system's capacity at the bound; FasterTransformer's best max_bs. {system: Capacity}."""
    check(options)
    deployment, costs = deployment_of(options), costs or options.costs
    crowd, bound, found = draw_crowd(options.requests, options.seed), bound_of(options), {}
    for system in options.systems:
        best = None
        for max_bs in batches_of(options, system):

            def meets_at(rate, max_bs=max_bs, system=system):
                point = run_point(deployment, system, max_bs, crowd, rate, costs)
                return point, point.meets(bound)

            if options.rates:
                points = [meets_at(r)[0] for r in options.rates]
                met = [p.rate for p in points if p.meets(bound)]
                cap = Capacity(system, max_bs, max(met, default=0.0), points, len(met) < len(points))
            else:
                cap = Capacity(system, max_bs, *search_capacity(meets_at, options.start_rate))
            best = cap if best is None or cap.rate > best.rate else best
        found[system] = best
    return found
