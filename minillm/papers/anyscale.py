"""The Anyscale post, reproduced: 1,000 prompts through naive static batching, FasterTransformer, continuous batching
without paging and vLLM, on a simulated A100 40GB serving OPT-13B, with minillm's own engine, schedulers and KV books.

Each system is a policy, a KV layout and the costs its own code and harness add (anyscale_setup.py says which, with
sources); every run is the same crowd, drawn once per max length. Throughput is the benchmark's: prompt and reply
tokens over the time to serve the whole crowd. The multiples over naive static are set beside the post's, and a
headline that does not land within 35% is taken apart: the mechanism alone, then what the systems added, each priced.

"Contiguous" on the simulated card (whose KV keeps only a paged pool's books): the pool holds exactly the blocks the
contiguous rows would reserve, one row of prompt + max tokens per seat, so no seat ever waits for memory (as none
does with its row reserved ahead), and the seats are what those rows leave room for.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from minillm.card.hardware import get_device
from minillm.card.modelspec import ModelSpec, load_spec
from minillm.config import EngineConfig
from minillm.engine.request import Request
from minillm.engine.scheduler import ContinuousScheduler, StaticScheduler
from minillm.errors import ConfigError
from minillm.papers import anyscale_setup as setup
from minillm.papers.anyscale_runner import PricedRunner
from minillm.papers.quota import QuotaScheduler
from minillm.papers.traces import paper_engine
from minillm.papers.verdict import Headline

BLOCK = 16  # tokens per KV block (vLLM's default block size)
PROMPT_TOKEN = 5  # every prompt token (the simulated card needs ids, not text)


def opt_13b() -> ModelSpec:
    return load_spec("opt-13b")  # (minillm/card/models/opt-13b.json, with its source)


def reply_lengths(requests: int, max_tokens: int, seed: int = 0, mean: int = setup.MEAN_REPLY) -> list[int]:
    """The benchmark's capped_exponential: round(Exp(mean)), redrawn until it is <= max_tokens (its own numbers came
    from numpy's generator; this is the same distribution, seeded here). At least 1: a reply of 0 tokens is asked
    as 1 (vLLM's launcher: max(len, 1))."""
    rng, lengths = random.Random(seed), []
    while len(lengths) < requests:
        drawn = round(rng.expovariate(1 / mean))
        if drawn <= max_tokens:
            lengths.append(max(1, drawn))
    return lengths


def typical_seed(requests: int, max_tokens: int, seeds: range = range(11)) -> int:
    """The seed whose crowd's longest reply is the median of `seeds`' crowds': naive static runs every reply to the
    crowd's longest, so that one draw sets every multiple over it; this is a middling draw, not an extreme one."""
    longest = sorted(seeds, key=lambda seed: max(reply_lengths(requests, max_tokens, seed)))
    return longest[len(longest) // 2]


@dataclass
class Run:
    """One system serving one crowd."""

    system: str
    max_tokens: int
    seats: int
    seconds: float  # simulated time to serve the whole crowd
    tokens: int  # prompt + reply tokens credited (each reply its own length)
    steps: int
    decode_rows: int  # rows that decoded, summed over the steps
    longest: int  # the crowd's longest reply
    extra_s: dict = field(default_factory=dict)  # seconds the harness and the padded batch added

    @property
    def tokens_s(self) -> float:
        return self.tokens / self.seconds


def blocks(tokens: int) -> int:
    return -(-tokens // BLOCK)


def run_system(system: setup.System, max_tokens: int, lengths: list[int], spec: ModelSpec,
               static_batch: int | str | None = None) -> Run:  # fmt: skip
    """The crowd through one system on the simulated card: the same engine, its policy and KV books."""
    runner = PricedRunner(spec, get_device(setup.GPU), system.costs, setup.DTYPE, setup.DTYPE)
    row = blocks(setup.PROMPT_TOKENS + max_tokens)  # a contiguous seat's row: prompt + max tokens
    pool = runner.pool_blocks(BLOCK)
    if system.policy == "static":
        seats = static_batch or setup.STATIC_BATCH.get(max_tokens, pool // row)  # (the benchmark's, by default)
        seats = pool // row if seats == "fit" else seats
        if seats * row > pool:
            raise ConfigError(f"{seats} seats of {setup.PROMPT_TOKENS + max_tokens} tokens do not fit the card's KV "
                              f"memory ({pool * BLOCK:,} tokens): at most {pool // row}")  # fmt: skip
        policy = StaticScheduler(token_budget=None)  # a batch's prompts in one forward, as HF and FT run them
    else:
        budget = setup.BATCHED_TOKENS.get(max_tokens, setup.BATCHED_TOKENS[setup.HEADLINE_MAX])
        seats = pool // row if system.kv == "contiguous" and not system.quota else 256  # (vLLM's max_num_seqs)
        policy = ContinuousScheduler(token_budget=budget if system.vllm_budget else None)
        if system.quota:  # TGI's max_batch_total_tokens: the same numbers as vLLM's budget in the benchmark
            policy = QuotaScheduler(budget)
    num_blocks = seats * row if system.kv == "contiguous" and not system.quota else pool
    cfg = EngineConfig(slots=seats, kv="paged", num_blocks=num_blocks, block_size=BLOCK, max_len=runner.max_len,
                       record_blocks=False)  # fmt: skip
    meta = {"model": setup.MODEL_CONFIG, "gpu": setup.GPU, "dtype": setup.DTYPE, "kv_dtype": setup.DTYPE}
    engine = paper_engine(runner, policy, cfg, f"anyscale-max{max_tokens}-{system.key}", meta)
    longest = max(lengths)
    for i, length in enumerate(lengths):
        reply = longest if system.crowd_replies else length
        engine.submit(Request(f"r{i}", [PROMPT_TOKEN] * setup.PROMPT_TOKENS, reply, ignore_eos=True))
    engine.run()
    unserved = [r.id for r in engine.requests if r.finish_reason != "length"]
    if unserved:
        raise ConfigError(f"{system.key} at max {max_tokens}: {len(unserved)} requests not served ({unserved[0]}...)")
    credited = sum(setup.PROMPT_TOKENS + length for length in lengths)
    return Run(system.key, max_tokens, seats, runner.clock.now(), credited, engine.step_no, runner.decode_rows,
               longest, dict(runner.extra_s))  # fmt: skip


@dataclass
class Options:
    max_tokens: tuple[int, ...] = setup.MAX_TOKENS
    requests: int = setup.REQUESTS
    systems: tuple[str, ...] = tuple(setup.SYSTEMS)
    seed: int = 0
    mechanism_only: bool = False  # every system priced as a serving engine, no harness (System.mechanism)
    # the static systems' seats: a number, "fit" (the rows of prompt + max tokens the KV memory holds) or None (the
    # benchmark's, per max length)
    static_batch: int | str | None = None


def systems_of(options: Options) -> dict[str, setup.System]:
    """The systems asked for, naive static always among them (every multiple is over it)."""
    unknown = [key for key in options.systems if key not in setup.SYSTEMS]
    if unknown:
        raise ConfigError(f"unknown system {unknown[0]!r}; choose from {', '.join(setup.SYSTEMS)}")
    keys = ["naive", *[key for key in options.systems if key != "naive"]]
    chosen = {key: setup.SYSTEMS[key] for key in keys}
    return {key: s.mechanism() for key, s in chosen.items()} if options.mechanism_only else chosen


def sweep(options: Options) -> dict[int, dict[str, Run]]:
    """Every system asked for at every max length asked for: {max_tokens: {system: Run}}."""
    if options.requests < 1:
        raise ConfigError(f"--requests must be at least 1, got {options.requests}")
    spec, chosen, results = opt_13b(), systems_of(options), {}
    for max_tokens in options.max_tokens:
        if not 1 <= max_tokens <= (spec.max_context or 0) - setup.PROMPT_TOKENS:
            raise ConfigError(
                f"--max-tokens {max_tokens}: OPT-13B's 2,048 positions leave room for 1 to "
                f"{(spec.max_context or 0) - setup.PROMPT_TOKENS} tokens after a 512-token prompt"
            )
        lengths = reply_lengths(options.requests, max_tokens, options.seed)
        results[max_tokens] = {key: run_system(s, max_tokens, lengths, spec, options.static_batch)
                               for key, s in chosen.items()}  # fmt: skip
    return results


def memory_headlines(spec: ModelSpec) -> list[Headline]:
    """The post's back-of-the-envelope KV figures beside the card's pool (the runner's, at 90% of memory)."""
    pool = PricedRunner(spec, get_device(setup.GPU), setup.SYSTEMS["vllm"].costs).pool_blocks(BLOCK)
    source = f"{setup.POST} (the basics of LLM inference)"
    found = [Headline("KV tokens that fit beside the weights", setup.KV_TOKENS, pool * BLOCK, "tokens", "OPT-13B fp16",
                      source)]  # fmt: skip
    for tokens, published in setup.SEQUENCES_THAT_FIT.items():
        found.append(Headline(f"sequences of {tokens:,} tokens that fit", published, pool // blocks(tokens),
                              "sequences", "OPT-13B fp16", source))  # fmt: skip
    return found


def headlines(results: dict[int, dict[str, Run]]) -> list[Headline]:
    """The post's figures beside the simulated ones (those the sweep reached)."""
    found: list[Headline] = memory_headlines(opt_13b())
    at = results.get(setup.HEADLINE_MAX)
    where = f"max tokens {setup.HEADLINE_MAX}"
    if at:
        naive = at["naive"].tokens_s
        for key, published in setup.PUBLISHED_OVER_NAIVE.items():
            if key in at:
                found.append(Headline(f"{setup.SYSTEMS[key].label} over naive", published, at[key].tokens_s / naive,
                                      "x", where, f"{setup.POST} (summary)", about=key))  # fmt: skip
        found.append(Headline("naive static throughput", setup.NAIVE_TOKENS_S, naive, "tokens/s", where,
                              f"{setup.POST} (throughput results)"))  # fmt: skip
    both = [runs for runs in results.values() if {"vllm", "continuous"} <= set(runs)]
    if both:
        least = min(both, key=lambda runs: runs["vllm"].tokens_s / runs["continuous"].tokens_s)
        found.append(Headline("vLLM over continuous, at every max length", setup.VLLM_OVER_CONTINUOUS,
                              least["vllm"].tokens_s / least["continuous"].tokens_s, "x",
                              f"least: max tokens {least['vllm'].max_tokens}", f"{setup.POST} (throughput results)",
                              at_least=True, about="vllm/continuous"))  # fmt: skip
    return found
