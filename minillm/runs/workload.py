"""Named, seeded workloads: who asks what, and when.

  seed-story     the lessons' eight users on four seats, each reply ending at the model's EOS
  chat           N users arriving at random (Poisson), reply lengths with a long tail
  bursty         users arriving in bursts, with quiet gaps between
  system-prompt  a chat crowd whose users share one of a few long system prompts (prefix caching's case)
  long-prompts   a chat crowd in which some users send long prompts (chunked prefill's case)
  mixed          chat users with a TTFT target and batch jobs with a deadline (runs/classes.py: who goes first)
  azure-conv     prompt and reply lengths of Azure's 2023 LLM inference trace, conversation service
  azure-code     the same trace's coding service (long prompts, very short replies)
  multi-turn     users who come back with their whole conversation after a think (runs/conversations.py)

The azure workloads are lengths only (their token ids are placeholders): they are meant for a
simulated card (`run --simulate`), since their prompts are longer than the tiny model's context.

Arrivals: `rate` is per engine step (exact and reproducible on any machine); `rate_per_s` is per
second, the offered load a real server sees: exact on a simulated clock, by the wall clock on the
real model (so such runs are not step-for-step reproducible).

Reply lengths in the chat crowds come from the trained model's own EOS by default: each prompt is
picked so that its correct reply has about the drawn length, and the model decides when to stop.
`force_lengths=True` ignores EOS and runs each request to exactly its drawn length instead.
"""

from __future__ import annotations

import bisect
import functools
import random
from dataclasses import dataclass

from minillm.engine.request import Request
from minillm.errors import ConfigError
from minillm.model.tokenizer import BOS, SEP, encode_prompt
from minillm.training import tasks

# (id, prompt, reply length in tokens, its EOS included: the steps its user decodes). Every prompt is one the
# shipped model answers exactly, and every reply ends at the model's own EOS (tests/test_shipped_model.py).
# The story on four seats: A leaves after step 11 and E takes its seat at 12; D leaves after 17 (F at 18), C
# after 41 (G at 42); B, the one long reply, runs to step 499 and H joins at 500. Static batching holds A's,
# C's and D's seats idle until B is done, while E..H wait in the queue.
SEED_STORY = [
    ("A", "count down from 6", 12),
    ("B", "count down from 152", 500),
    ("C", "count down from 17", 42),
    ("D", "spell 2024", 18),
    ("E", "count down from 151", 496),
    ("F", "count down from 149", 488),
    ("G", "count down from 146", 476),
    ("H", "spell 4096", 19),
]
SEED_STORY_SLOTS = 4
MAX_REPLY = 500  # longest reply a chat workload asks for ("count down from 152": 499 tokens + EOS)

# Quantiles (0, 1, 5, 10, 15, ..., 95, 99, 100 %) of prompt and reply lengths in tokens, computed from
# Azure LLM inference trace 2023 (github.com/Azure/AzurePublicDataset, data/AzureLLMInferenceTrace_conv.csv:
# 19,366 requests, and _code.csv: 8,819, one hour on 2023-11-16; the Splitwise paper, ISCA 2024).
# Medians: conversation 1020 prompt / 129 reply tokens, coding 1469 / 13.
AZURE_QUANTILES = [0, 1] + list(range(5, 100, 5)) + [99, 100]
AZURE = {
    "azure-conv": {
        "prompt": [2, 29, 181, 207, 372, 387, 396, 403, 414, 703, 984, 1020, 1045, 1071, 1097, 1130, 1189, 1315,
                   1877, 2735, 4083, 4142, 14050],
        "reply": [7, 16, 41, 54, 67, 77, 85, 91, 96, 103, 113, 129, 151, 177, 217, 384, 395, 400, 411, 424, 451,
                  601, 1000],
    },
    "azure-code": {
        "prompt": [3, 17, 75, 147, 232, 385, 578, 770, 938, 1075, 1261, 1469, 1690, 1909, 2164, 2433, 2745, 3193,
                   3923, 5194, 7315, 7436, 7437],
        "reply": [6, 6, 6, 7, 7, 8, 9, 9, 10, 11, 12, 13, 14, 16, 18, 20, 24, 29, 39, 55, 90, 252, 1899],
    },
}  # fmt: skip

WORKLOADS = ("seed-story", "chat", "bursty", "system-prompt", "long-prompts", "mixed")  # for the tiny model
SIMULATED_WORKLOADS = tuple(AZURE)  # lengths only: for a simulated card
MULTI_TURN = "multi-turn"  # a closed loop (each turn made as the last reply ends): run.py builds it
ALL_WORKLOADS = WORKLOADS + SIMULATED_WORKLOADS + (MULTI_TURN,)


def seed_story() -> list[Request]:
    """The story's requests. max_new_tokens is the reply's length with its EOS, so the cap never cuts a right
    answer (the EOS comes first) and any model takes the same steps: a random one just ends by length."""
    return [
        Request(id=rid, prompt_ids=encode_prompt(text), max_new_tokens=n, prompt=text, planned_reply=n - 1)
        for rid, text, n in SEED_STORY
    ]


@functools.cache
def countdown_lengths() -> tuple[int, ...]:
    """Tokens of each countdown's reply with its EOS: "count down from N" is entry N - 1."""
    return tuple(len(tasks.solve(f"count down from {k}")) + 1 for k in range(1, tasks.MAX_COUNT + 1))


@functools.cache
def countdown_for_length(length: int, longest_countdown: int = tasks.MAX_COUNT) -> int:
    """The N whose "count down from N" reply (plus EOS) is closest to `length` tokens (the smallest such N)."""
    lengths = countdown_lengths()
    return 1 + min(range(longest_countdown), key=lambda i: abs(lengths[i] - length))


longest_countdown_after = functools.cache(tasks.longest_countdown)  # the same few preambles, over and over


def prompt_with_reply_length(length: int, rng: random.Random, longest_countdown: int = tasks.MAX_COUNT) -> str:
    """A task prompt whose correct reply (plus EOS) is about `length` tokens."""
    if length > 40:  # counting down makes the long replies (and the shipped model stops those reliably)
        return f"count down from {countdown_for_length(length, longest_countdown)}"
    candidates = [tasks.TASKS[rng.choice(list(tasks.TASKS))](rng)[0] for _ in range(24)]
    return min(candidates, key=lambda p: abs(len(tasks.solve(p)) + 1 - length))


def draw_reply_length(rng: random.Random, mean: float, spread: float) -> int:
    """spread 0: every reply is `mean` long; spread 1: exponential with that mean (a long tail)."""
    length = (1 - spread) * mean + spread * rng.expovariate(1 / mean)
    return max(1, min(MAX_REPLY, round(length)))


@dataclass
class ChatKnobs:
    requests: int = 32
    rate: float = 0.5  # mean arrivals per engine step; >= requests puts everyone in the queue at step 0
    mean_reply: float = 80
    spread: float = 1.0
    force_lengths: bool = False
    rate_per_s: float | None = None  # when set: arrivals per second (Poisson) instead of per step
    prompt_len: int | None = None  # azure workloads: every prompt this long instead of drawn (published tables)
    reply_len: int | None = None  # azure workloads: every reply this long

    def __post_init__(self) -> None:
        for name in ("prompt_len", "reply_len"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigError(f"{name} must be a whole number of tokens, at least 1, got {value!r}")
        if self.requests < 1:
            raise ConfigError(f"requests must be at least 1, got {self.requests}")
        if self.rate <= 0:
            raise ConfigError(f"rate must be positive (arrivals per step), got {self.rate}")
        if self.rate_per_s is not None and self.rate_per_s <= 0:
            raise ConfigError(f"rate_per_s must be positive (arrivals per second), got {self.rate_per_s}")
        if not 0 <= self.spread <= 1:
            raise ConfigError(f"spread must lie in [0, 1], got {self.spread}")
        if not 1 <= self.mean_reply <= MAX_REPLY:
            raise ConfigError(f"mean_reply must lie in [1, {MAX_REPLY}], got {self.mean_reply}")


def poisson_arrivals(n: int, rate: float, rng: random.Random) -> list[float]:
    """n arrival times with exponential gaps of mean 1 / rate, the first at 0."""
    clock, times = 0.0, []
    for _ in range(n):
        times.append(clock)
        clock += rng.expovariate(rate)
    return times


def chat_request(rid: str, rng: random.Random, knobs: ChatKnobs, preamble: str | None = None) -> Request:
    length = draw_reply_length(rng, knobs.mean_reply, knobs.spread)
    prompt = prompt_with_reply_length(length, rng, longest_countdown_after(preamble) if preamble else tasks.MAX_COUNT)
    budget = length if knobs.force_lengths else MAX_REPLY + 100  # real EOS: a generous safety cap
    if preamble:
        budget = min(budget, tasks.CONTEXT - len(encode_prompt(prompt, preamble)) - 1)
    ids = encode_prompt(prompt, preamble)
    text = prompt if not preamble else f"[{len(preamble)}-byte system prompt] {prompt}"
    return Request(rid, ids, budget, ignore_eos=knobs.force_lengths, prompt=text, planned_reply=length)


def spread_arrivals(requests: list[Request], knobs: ChatKnobs, rng: random.Random) -> list[Request]:
    """Give each request its arrival: Poisson per step (exponential gaps of mean 1 / rate steps) or per second."""
    if knobs.rate_per_s is not None:
        at_once = knobs.rate_per_s >= len(requests)  # (as `rate` per step: as many a second as there are: all at 0 s)
        for r, t in zip(requests, poisson_arrivals(len(requests), knobs.rate_per_s, rng)):
            r.arrival_s = 0.0 if at_once else t
        return requests
    clock = 0.0
    for r in requests:
        r.arrival_step = int(clock)
        if knobs.rate < knobs.requests:
            clock += rng.expovariate(knobs.rate)
    return requests


def chat(knobs: ChatKnobs | None = None, seed: int = 0) -> list[Request]:
    """Poisson arrivals: exponential gaps with mean 1 / rate steps (or seconds, with rate_per_s)."""
    knobs, rng = knobs or ChatKnobs(), random.Random(seed)
    if knobs.rate_per_s is not None:
        requests = [chat_request(f"r{i}", rng, knobs) for i in range(knobs.requests)]
        return spread_arrivals(requests, knobs, random.Random(seed + 1))
    out, clock = [], 0.0
    for i in range(knobs.requests):  # (draws interleaved as they always were: the same seed gives the same crowd)
        request = chat_request(f"r{i}", rng, knobs)
        request.arrival_step = int(clock)
        out.append(request)
        if knobs.rate < knobs.requests:
            clock += rng.expovariate(knobs.rate)
    return out


def bursty(knobs: ChatKnobs | None = None, seed: int = 0, burst: int = 8, gap: int = 60) -> list[Request]:
    """Bursts of `burst` requests at once, every `gap` steps."""
    knobs, rng = knobs or ChatKnobs(), random.Random(seed)
    requests = [chat_request(f"r{i}", rng, knobs) for i in range(knobs.requests)]
    for i, r in enumerate(requests):
        r.arrival_step = (i // burst) * gap
    return requests


def system_prompt(knobs: ChatKnobs | None = None, seed: int = 0) -> list[Request]:
    """Every user sends one of the fixed system prompts (tasks.PREAMBLES) before their request, as apps do:
    most use the app's main one. Their prompts share a long prefix, which a prefix cache computes once."""
    knobs, rng = knobs or ChatKnobs(), random.Random(seed)
    names = list(tasks.PREAMBLES)
    weights = [1 if name != "workshop" else 3 for name in names]  # the workshop's own prompt is the common one
    requests = [
        chat_request(f"r{i}", rng, knobs, tasks.PREAMBLES[rng.choices(names, weights)[0]])
        for i in range(knobs.requests)
    ]
    return spread_arrivals(requests, knobs, rng)


LONG_PROMPT_SHARE = 0.25  # of the long-prompts crowd
LONG_PROMPT_BYTES = (300, 600)


def long_prompts(knobs: ChatKnobs | None = None, seed: int = 0) -> list[Request]:
    """A chat crowd in which a quarter of the users paste a long text (a unique preamble of 300-600 bytes)
    before their request: each such prompt costs many decode steps' worth of work when it is prefilled."""
    knobs, rng = knobs or ChatKnobs(), random.Random(seed)
    requests = []
    for i in range(knobs.requests):
        preamble = None
        if rng.random() < LONG_PROMPT_SHARE:
            preamble = tasks.random_preamble(rng, rng.randint(*LONG_PROMPT_BYTES))
        requests.append(chat_request(f"r{i}", rng, knobs, preamble))
    return spread_arrivals(requests, knobs, rng)


BATCH_SHARE, BATCH_REPLY = 0.25, 400  # the mixed crowd: one user in four a batch job, replies of 400 tokens on average


def mixed(knobs: ChatKnobs | None = None, seed: int = 0) -> list[Request]:
    """`knobs.requests` users in a random order, a quarter of them batch jobs (a long document pasted before the
    request, a long reply), the rest chat users (runs/classes.py gives each its class's service); arrivals by
    `knobs.rate` (per step) or `knobs.rate_per_s`, as the chat crowd's."""
    knobs, rng = knobs or ChatKnobs(), random.Random(seed)
    requests, counts = [], {"chat": 0, "batch": 0}
    for _ in range(knobs.requests):
        cls = "batch" if rng.random() < BATCH_SHARE else "chat"
        rid, counts[cls] = f"{cls}{counts[cls]}", counts[cls] + 1
        if cls == "chat":
            requests.append(chat_request(rid, rng, knobs))
        else:
            document = tasks.random_preamble(rng, rng.randint(*LONG_PROMPT_BYTES))
            long_knobs = ChatKnobs(knobs.requests, knobs.rate, BATCH_REPLY, 0.3, knobs.force_lengths)
            requests.append(chat_request(rid, rng, long_knobs, document))
    return spread_arrivals(requests, knobs, rng)


def draw_quantile(rng: random.Random, values: list[int]) -> int:
    """A length drawn from a quantile table: uniform in probability, linear between the listed quantiles."""
    u = rng.uniform(0, 100)
    i = max(1, bisect.bisect_left(AZURE_QUANTILES, u))
    lo, hi = AZURE_QUANTILES[i - 1], AZURE_QUANTILES[i]
    return max(1, round(values[i - 1] + (values[i] - values[i - 1]) * (u - lo) / (hi - lo)))


def azure(name: str, knobs: ChatKnobs | None = None, seed: int = 0) -> list[Request]:
    """Prompt and reply lengths drawn (independently) from the Azure trace's quantiles, or fixed by knobs.prompt_len
    and knobs.reply_len (a published table's "input 128, output 2048"). The prompt's tokens are
    placeholders, different for every request (no shared prefixes); the reply is `planned_reply` tokens, then EOS."""
    knobs, rng = knobs or ChatKnobs(), random.Random(seed)
    table = AZURE[name]
    requests = []
    for i in range(knobs.requests):
        prompt_len, reply = draw_quantile(rng, table["prompt"]), draw_quantile(rng, table["reply"])
        prompt_len, reply = knobs.prompt_len or prompt_len, knobs.reply_len or reply  # (drawn anyway: same seeds)
        first = rng.randrange(256)
        body = [(first + 7 * j) % 256 for j in range(max(0, prompt_len - 2))]
        body[:2] = [i % 256, i // 256 % 256][: len(body)]  # the request's number first: no two share a block
        ids = [BOS] + body + [SEP]
        requests.append(Request(f"r{i}", ids[:prompt_len] if prompt_len < 2 else ids, reply + 1,
                                prompt=f"[{name}: {prompt_len} prompt tokens, {reply} reply tokens]",
                                planned_reply=reply))  # fmt: skip
    return spread_arrivals(requests, knobs, rng)


def make_workload(name: str, knobs: ChatKnobs | None = None, seed: int = 0) -> list[Request]:
    builders = {"chat": chat, "bursty": bursty, "system-prompt": system_prompt, "long-prompts": long_prompts}
    if name == "seed-story":
        return seed_story()
    if name == "mixed":
        return mixed(knobs, seed)
    if name in builders:
        return builders[name](knobs, seed)
    if name in AZURE:
        return azure(name, knobs, seed)
    if name == MULTI_TURN:
        raise ConfigError("multi-turn makes each turn as the last reply ends: build it with run.workload_engine")
    raise ConfigError(f"unknown workload {name!r}; choose one of {', '.join(ALL_WORKLOADS)}")
