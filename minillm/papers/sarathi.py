"""Sarathi-Serve, reproduced: a sampled openchat_sharegpt4 crowd through vLLM's prefill-prioritizing scheduler and
Sarathi-Serve's stall-free one with chunked prefills, on a simulated A100 80GB serving Mistral-7B, with minillm's own
engine and KV books; each system's capacity (the highest Poisson rate whose P99 time-between-tokens meets the SLO,
with the median scheduling delay at most 2 s) found by a short search over rate, and the ratio set beside the paper's.

sarathi_setup.py gives every fact with its source; sarathi_vllm.py the baseline's scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minillm.card.hardware import get_device
from minillm.card.modelspec import load_spec
from minillm.card.simulate import SimulatedRunner
from minillm.config import EngineConfig
from minillm.engine.engine import Engine
from minillm.engine.request import Request
from minillm.engine.scheduler import ContinuousScheduler
from minillm.errors import ConfigError
from minillm.papers import sarathi_setup as setup
from minillm.papers.sarathi_crowd import Crowd, draw_crowd, median, percentile
from minillm.papers.sarathi_vllm import PrefillFirstScheduler
from minillm.papers.traces import paper_engine

BLOCK = 16  # tokens per KV block (vLLM's default)
PROMPT_TOKEN = 5  # every prompt token (the simulated card needs ids, not text)
REQUESTS = 256  # the default sample of the paper's 2,048 requests a run (the whole run in under 60 s here)
GRANULARITY = 0.05  # the search stops when the bracket is this close (the paper's search: 2.5%)
MAX_DOUBLINGS = 6  # rates tried up or down from the start before the search gives up bracketing


@dataclass
class Point:
    """One system at one rate: the figures the capacity is judged by."""

    rate: float
    p99_tbt_s: float
    median_delay_s: float  # arrival to first scheduled
    median_ttft_s: float
    served_s: float  # simulated seconds to serve the crowd
    stalls: int = 0  # gaps between two tokens longer than the SLO

    def meets(self, slo_s: float) -> bool:
        return self.p99_tbt_s <= slo_s and self.median_delay_s <= setup.SCHEDULING_DELAY_S


@dataclass
class Capacity:
    system: str
    rate: float  # the highest rate tried that met both bounds (0: none did)
    points: list[Point] = field(default_factory=list)  # every rate tried, in order
    bounded: bool = True  # False: no rate tried missed, the capacity is at least `rate`

    @property
    def at(self) -> Point | None:
        return next((p for p in self.points if p.rate == self.rate), None)


class Watch:
    """An engine observer: when each request was first scheduled and when each of its tokens came."""

    def __init__(self):
        self.scheduled: dict[str, float] = {}
        self.tokens: dict[str, list[float]] = {}

    def __call__(self, engine: Engine, step) -> None:
        for request in step.plan.admit:
            self.scheduled.setdefault(request.id, step.begin)
        now = engine.clock.now()
        for rid, made in step.made.items():
            if made:
                self.tokens.setdefault(rid, []).append(now)


def make_runner(deployment: setup.Deployment, overhead: setup.StepOverhead | None = None) -> SimulatedRunner:
    runner = SimulatedRunner(load_spec(deployment.model), get_device(deployment.gpu), deployment.dtype,
                             deployment.dtype, tp=deployment.tp)  # fmt: skip
    if overhead:  # the host's time around each forward (the account: sarathi_report.py)
        run = runner.run

        def run_and_pay(batch, cache, picker=None):
            runner.clock.advance(overhead.seconds(len(batch.counts)))
            return run(batch, cache, picker)

        runner.run = run_and_pay
    return runner


def scheduler_of(system: str, budget: int, trace: setup.Trace):
    if system == "vllm":
        return PrefillFirstScheduler(max_batched_tokens=trace.max_total)  # (config.py: the trace's max length)
    return ContinuousScheduler(token_budget=budget)


def run_point(deployment: setup.Deployment, system: str, budget: int, trace: setup.Trace, crowd: Crowd, rate: float,
              slo_s: float, overhead: setup.StepOverhead | None = None) -> Point:  # fmt: skip
    """The crowd at `rate` through one system on the simulated card."""
    runner = make_runner(deployment, overhead)
    cfg = EngineConfig(slots=setup.MAX_SEATS, kv="paged", num_blocks=runner.pool_blocks(BLOCK), block_size=BLOCK,
                       max_len=runner.max_len, record_blocks=False)  # fmt: skip
    name, meta = f"sarathi-{system}-budget{budget}-rate{rate:.3g}", {"model": deployment.model, "gpu": deployment.gpu}
    engine, watch = paper_engine(runner, scheduler_of(system, budget, trace), cfg, name, meta), Watch()
    engine.observers.append(watch)
    arrivals = crowd.arrivals(rate)
    for i, (prompt, output, t) in enumerate(zip(crowd.prompts, crowd.outputs, arrivals)):
        engine.submit(Request(f"r{i}", [PROMPT_TOKEN] * prompt, output, ignore_eos=True, arrival_s=t))
    engine.run()
    gaps = [b - a for times in watch.tokens.values() for a, b in zip(times, times[1:])]
    delays = [watch.scheduled[f"r{i}"] - t for i, t in enumerate(arrivals)]
    ttfts = [watch.tokens[f"r{i}"][0] - t for i, t in enumerate(arrivals)]
    return Point(rate, percentile(gaps, setup.TBT_QUANTILE), median(delays), median(ttfts), runner.clock.now(),
                 sum(g > slo_s for g in gaps))  # fmt: skip


def search_capacity(meets_at, start: float) -> tuple[float, list[Point], bool]:
    """The highest rate that meets, to GRANULARITY: double from `start` until a rate fails (or halve until one
    meets), then bisect the bracket. meets_at(rate) -> (Point, met). Returns (rate, points, bounded): bounded is
    False where every rate up to start x 2^MAX_DOUBLINGS met (a crowd too small to load the card)."""
    points, low, high = [], 0.0, None
    rate = start
    for _ in range(MAX_DOUBLINGS + 1):  # bracket
        point, ok = meets_at(rate)
        points.append(point)
        if ok:
            low = rate
            if high is not None:
                break
            rate *= 2
        else:
            high = rate
            if low:
                break
            rate /= 2
    if not low or high is None:
        return low, points, high is not None
    while (high - low) / high > GRANULARITY:
        rate = (low + high) / 2
        point, ok = meets_at(rate)
        points.append(point)
        low, high = (rate, high) if ok else (low, rate)
    return low, points, True


@dataclass
class Options:
    model: str = "mistral-7b"
    trace: str = "openchat_sharegpt4"
    slo: str = "strict"  # or "relaxed" (Table 3), or seconds as text ("0.25")
    budget: int | None = None  # Sarathi-Serve's token budget; None: the paper's for the SLO
    requests: int = REQUESTS
    seed: int = 0
    systems: tuple[str, ...] = tuple(setup.SYSTEMS)
    start_rate: float = 1.0  # where the search starts (requests per second)
    host_overhead: bool = False  # each step also pays the host's measured time around it (setup.HOST_OVERHEAD)


def deployment_of(options: Options) -> setup.Deployment:
    if options.model not in setup.DEPLOYMENTS:
        raise ConfigError(f"unknown model {options.model!r}; choose from {', '.join(setup.DEPLOYMENTS)}")
    return setup.DEPLOYMENTS[options.model]


def slo_seconds(options: Options, deployment: setup.Deployment) -> float:
    """--slo: strict or relaxed (Table 3), or a number of seconds."""
    if options.slo in deployment.slo_s:
        return deployment.slo_s[options.slo]
    try:
        seconds = float(options.slo)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise ConfigError(f"--slo {options.slo!r}: strict, relaxed or a P99 TBT in seconds (> 0)")
    return seconds


def budget_of(options: Options, deployment: setup.Deployment) -> int:
    """The token budget asked for, or the paper's: 512 under the strict SLO, 2048 under a looser one."""
    if options.budget is not None:
        if options.budget < 1:
            raise ConfigError(f"--budget must be at least 1 token, got {options.budget}")
        return options.budget
    strict = slo_seconds(options, deployment) <= deployment.slo_s["strict"]
    return deployment.budget["strict" if strict else "relaxed"]


def check(options: Options) -> None:
    if options.trace not in setup.TRACES:
        raise ConfigError(f"unknown trace {options.trace!r}; choose from {', '.join(setup.TRACES)}")
    unknown = [s for s in options.systems if s not in setup.SYSTEMS]
    if unknown:
        raise ConfigError(f"unknown system {unknown[0]!r}; choose from {', '.join(setup.SYSTEMS)}")
    if options.requests < 8:
        raise ConfigError(f"--requests must be at least 8 (a P99 and a median need a crowd), got {options.requests}")
    if not options.start_rate > 0:
        raise ConfigError(f"--start-rate must be above 0 requests per second, got {options.start_rate}")


def capacities(options: Options, overhead: setup.StepOverhead | None = None) -> dict[str, Capacity]:
    """Each system's capacity on the options' crowd: {system: Capacity}."""
    check(options)
    deployment = deployment_of(options)
    overhead = overhead or (setup.HOST_OVERHEAD if options.host_overhead else None)
    trace, slo, budget = setup.TRACES[options.trace], slo_seconds(options, deployment), budget_of(options, deployment)
    crowd, found = draw_crowd(trace, options.requests, options.seed), {}
    for system in options.systems:

        def meets_at(rate: float, system=system):
            point = run_point(deployment, system, budget, trace, crowd, rate, slo, overhead)
            return point, point.meets(slo)

        rate, points, bounded = search_capacity(meets_at, options.start_rate)
        found[system] = Capacity(system, rate, points, bounded)
    return found
