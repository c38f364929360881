"""DistServe, reproduced: per-GPU goodput, colocated (vLLM) against disaggregated (DistServe's placement), on
simulated A100 80GB cards with minillm's own engines, schedulers and KV books.

Goodput (section 1): the highest request rate at which the SLO attainment goal holds (90% of requests meet both their
TTFT and TPOT targets; Figure 1 reads the P90 of each instead), divided by the cards the system holds. Each system's
rate is found by a short search (papers/sarathi.py's: double until a rate misses, then bisect to 5%), every rate
serving the same sampled requests (distserve_trace.py), so the ratio compares the systems, not two draws.

distserve_setup.py gives every fact with its source; distserve_systems.py how each system maps onto minillm.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from minillm.errors import ConfigError
from minillm.papers import distserve_setup as setup
from minillm.papers.distserve_cost import PRICES
from minillm.papers.distserve_systems import SYSTEMS, Deployment, Outcome, serve
from minillm.papers.distserve_trace import TRACES, draw
from minillm.papers.sarathi import search_capacity
from minillm.papers.sarathi_crowd import percentile

APP_SYSTEMS = {"chatbot-13b": ("vllm", "distserve"), "figure-1": ("vllm", "prefill", "decode", "distserve")}


@dataclass
class Options:
    app: str = "chatbot-13b"
    model: str | None = None  # None: the app's (Table 1)
    slo_scale: float = 1.0  # both SLOs times this (section 6.2's "SLO Scale")
    requests: int = setup.REQUESTS_PER_GPU  # requests per card of the system (the artifact's)
    seed: int = 0
    systems: tuple[str, ...] | None = None  # None: the app's
    prices: str = "roofline"  # or "paper": DistServe's own profiled step times (distserve_cost.py)
    vllm_tp: int | None = None  # None: the paper's
    prefill_tp: int | None = None
    decode_tp: int | None = None
    prefill: int | None = None  # prefill instances
    decode: int | None = None  # decoding instances
    trace: str | None = None  # None: the app's
    attainment: float = setup.ATTAINMENT


@dataclass(frozen=True)
class Point:
    """One system at one rate."""

    rate: float  # requests per second, all its cards together
    per_gpu: float
    attainment: float  # share of requests meeting both SLOs (each system: the ones it serves)
    p90_ttft_s: float | None
    p90_tpot_s: float | None


@dataclass
class Goodput:
    system: str
    gpus: int
    rate: float  # the highest rate tried that met the goal (0: none did)
    points: list[Point] = field(default_factory=list)
    bounded: bool = True  # False: no rate tried missed

    @property
    def per_gpu(self) -> float:
        return self.rate / self.gpus


def app_of(options: Options) -> setup.App:
    if options.app not in setup.APPS:
        raise ConfigError(f"unknown app {options.app!r}; choose from {', '.join(setup.APPS)}")
    return setup.APPS[options.app]


def deployment_of(options: Options) -> Deployment:
    app = app_of(options)
    p = app.placement
    placement = setup.Placement(options.prefill_tp or p.prefill_tp, options.decode_tp or p.decode_tp,
                                options.prefill or p.prefill, options.decode or p.decode)  # fmt: skip
    return Deployment(options.model or app.model, options.vllm_tp or app.vllm_tp, placement, options.prices)


def slos(options: Options) -> tuple[float, float]:
    app = app_of(options)
    return app.ttft_s * options.slo_scale, app.tpot_s * options.slo_scale


def systems_of(options: Options) -> tuple[str, ...]:
    return options.systems or APP_SYSTEMS[app_of(options).key]


def check(options: Options) -> None:
    app_of(options)
    unknown = [s for s in systems_of(options) if s not in SYSTEMS]
    if unknown:
        raise ConfigError(f"unknown system {unknown[0]!r}; choose from {', '.join(SYSTEMS)}")
    if options.trace is not None and options.trace not in TRACES:
        raise ConfigError(f"unknown trace {options.trace!r}; choose from {', '.join(TRACES)}")
    if options.prices not in PRICES:
        raise ConfigError(f"unknown prices {options.prices!r}; choose from {', '.join(PRICES)}")
    if options.requests < 10:
        raise ConfigError(f"--requests must be at least 10 a card (a 90% share needs a crowd), got {options.requests}")
    if not options.slo_scale > 0 or not 0 < options.attainment <= 1:
        raise ConfigError("--slo-scale must be above 0 and --attainment in (0, 1]")


def judge(outcomes: list[Outcome], ttft_s: float, tpot_s: float) -> tuple[float, float | None, float | None]:
    """(the share meeting both targets, P90 TTFT, P90 TPOT); a missing latency meets its target."""
    ok = [(o.ttft_s is None or o.ttft_s <= ttft_s) and (o.tpot_s is None or o.tpot_s <= tpot_s) for o in outcomes]
    ttfts = [o.ttft_s for o in outcomes if o.ttft_s is not None]
    tpots = [o.tpot_s for o in outcomes if o.tpot_s is not None]
    p90 = lambda xs: percentile(xs, 90) if xs else None  # noqa: E731
    return sum(ok) / len(ok), p90(ttfts), p90(tpots)


def meets(point: Point, options: Options) -> bool:
    ttft_s, tpot_s = slos(options)
    if app_of(options).quantile is None:
        return point.attainment >= options.attainment
    return (point.p90_ttft_s is None or point.p90_ttft_s <= ttft_s) and (
        point.p90_tpot_s is None or point.p90_tpot_s <= tpot_s)  # fmt: skip


def goodputs(options: Options, prices: str | None = None, start: float = 1.0) -> dict[str, Goodput]:
    """Each system's goodput on the options' crowd (prices: override the options' step prices; start: the rate a
    GPU the search starts from)."""
    check(options)
    options = replace(options, prices=prices or options.prices)
    deployment, (ttft_s, tpot_s) = deployment_of(options), slos(options)
    trace = options.trace or app_of(options).trace
    found = {}
    for system in systems_of(options):
        gpus = deployment.gpus(system)
        crowd = draw(trace, options.requests * gpus, options.seed)

        def meets_at(rate: float, system=system, crowd=crowd, gpus=gpus):
            share, p90_ttft, p90_tpot = judge(serve(deployment, system, crowd, rate), ttft_s, tpot_s)
            point = Point(rate, rate / gpus, share, p90_ttft, p90_tpot)
            return point, meets(point, options)

        first = start * gpus * (4 if system == "decode" else 1)  # (decoding alone goes far: start higher)
        rate, points, bounded = search_capacity(meets_at, first)
        found[system] = Goodput(system, gpus, rate, points, bounded)
    return found
