"""Each step priced two ways: minillm's roofline (card/simulate.py), or DistServe's own measured step times.

DistServe's simulator (simdistserve, the one its placement search and Table 2 use, "error less than 2%") prices a
step with latency models fitted to profiles of both engines on an A100 80GB (CODE, commit 82831f1,
simdistserve/estimators/profile_data/profiler-a100-80g.{distserve,vllm}.json, read by time_estimator.py), in ms:

    prefill  a + b x tokens + c x sum(prompt length^2)                   (Appendix A's shape: GEMMs + attention)
    decode   a + b x sum(context + 1) + c x batch size, (a, b, c) for batches under 95 and for larger ones
    + 2 + 0.0001 x the step's context tokens                             (base/worker.py add_ray_overhead: Ray)

Those fits carry what the roofline leaves out: each engine's kernels as fast as they really ran, its launch and
Python time per step (vLLM 0.2's decode step at batch 1: 23.5 ms; DistServe's SwiftTransformer: 19.9 ms; the
roofline's: about 16 ms), and the Ray hop. The report runs the experiment both ways (distserve_report.py).
"""

from __future__ import annotations

from minillm.card.hardware import get_device
from minillm.card.modelspec import load_spec
from minillm.card.simulate import SimulatedRunner, planned_token
from minillm.errors import ConfigError
from minillm.papers import distserve_setup as setup

PROFILE_SOURCE = (f"{setup.CODE}/tree/{setup.COMMIT[:7]}/simdistserve/estimators/profile_data "
                  "(profiler-a100-80g.distserve.json, profiler-a100-80g.vllm.json; OPT-13B)")  # fmt: skip
SMALL_BATCH = 95  # decoding_large_small_bs_threshold
# engine -> tp -> (prefill (a, b, c), decode under SMALL_BATCH (a, b, c), decode at or above it (a, b, c)), ms
PROFILE = {
    "distserve": {
        1: ((18.102546475, 0.101912257, 7.122e-06), (19.934702625, 0.000626936, 0.038506977),
            (7.166188947, 0.0005798, 0.158310962)),
        2: ((14.742973695, 0.068577207, 2.45e-06), (13.29479635, 0.000341092, 0.062963932),
            (10.638741913, 0.000311834, 0.085629136)),
        4: ((12.062297033, 0.038081401, 5.23e-07), (10.256231678, 0.000187867, 0.032692736),
            (10.483514938, 0.000171209, 0.045666485)),
    },
    "vllm": {
        1: ((22.052204789, 0.140509239, 8.077e-06), (23.475041008, 0.000592934, 0.060726861),
            (20.206356174, 0.000490773, 0.120003139)),
        2: ((27.440806248, 0.090545327, 8.452e-06), (24.540584242, 0.000224401, 0.087157873),
            (17.947769467, 0.000457085, 0.111790758)),
        4: ((30.53632259, 0.051506449, 4.23e-07), (25.901144443, 7.7536e-05, 0.055280872),
            (23.883884689, 0.000284002, 0.062765238)),
    },
}  # fmt: skip
PRICES = ("roofline", "paper")


def step_ms(engine: str, tp: int, prompts: list[int], contexts: list[int]) -> float:
    """The fitted time of one step: whole prompts of `prompts` tokens, decode rows with `contexts` tokens before
    their new one (DistServe's engines and vLLM's prefill-first one never mix the two; a mixed step pays both)."""
    prefill, small, large = PROFILE[engine][tp]
    ms = 0.0
    if prompts:
        a, b, c = prefill
        ms += a + b * sum(prompts) + c * sum(n * n for n in prompts)
    if contexts:
        a, b, c = small if len(contexts) < SMALL_BATCH else large
        ms += a + b * sum(n + 1 for n in contexts) + c * len(contexts)
    return ms + 2 + 1e-4 * (sum(prompts) + sum(contexts))  # (the Ray hop)


class ProfiledRunner(SimulatedRunner):
    """A simulated card whose steps cost what DistServe's profile of `engine` says (the KV books as the roofline
    runner keeps them)."""

    def __init__(self, spec, device, engine: str, dtype: str, tp: int, utilization: float):
        if tp not in PROFILE[engine]:
            raise ConfigError(f"DistServe profiled {engine} on OPT-13B at TP {', '.join(map(str, PROFILE[engine]))}")
        super().__init__(spec, device, dtype, dtype, utilization, tp=tp)
        self.engine = engine

    def run(self, batch, cache, picker=None) -> list[int]:
        starts = cache.prepare(batch.seats, batch.counts, batch.padding_rows)
        rows = list(zip(batch.counts, starts))
        prompts = [n for n, start in rows if n > 1 or start == 0]
        contexts = [start for n, start in rows if n == 1 and start > 0]
        seconds = step_ms(self.engine, self.tp, prompts, contexts) / 1e3
        self.clock.advance(seconds)
        self.busy_s += seconds
        return [planned_token(r) for r in batch.sampled]


def make_runner(model: str, tp: int, engine: str, prices: str) -> SimulatedRunner:
    """One instance's cards: the roofline's prices, or the paper's profile of `engine` ("vllm" or "distserve")."""
    if prices not in PRICES:
        raise ConfigError(f"unknown prices {prices!r}; choose from {', '.join(PRICES)}")
    spec, device = load_spec(model), get_device(setup.GPU)
    if prices == "paper":
        if model != "opt-13b":
            raise ConfigError("DistServe's profile here is OPT-13B's: --prices paper needs --model opt-13b")
        return ProfiledRunner(spec, device, engine, setup.DTYPE, tp, setup.MEMORY_SHARE)
    return SimulatedRunner(spec, device, setup.DTYPE, setup.DTYPE, setup.MEMORY_SHARE, tp=tp)
