"""Named, seeded workloads: who asks what, and when.

  seed-story  the lessons' eight users on four seats, with fixed reply lengths
  chat        N users arriving at random (Poisson), reply lengths with a long tail
  bursty      users arriving in bursts, with quiet gaps between

Reply lengths in `chat` and `bursty` come from the trained model's own EOS by default:
each prompt is picked so that its correct reply has about the drawn length, and the
model decides when to stop. `force_lengths=True` ignores EOS and runs each request to
exactly its drawn length instead.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from minillm import tasks
from minillm.errors import ConfigError
from minillm.request import Request
from minillm.tokenizer import encode_prompt

# (id, prompt, reply length) - the story: A leaves after step 11 and E takes its seat at 12;
# C and D leave after step 41 and F and G join at 42; B leaves after step 498 and H joins.
# Static batching makes E..H wait for B. Each prompt's true reply is at least as long as
# its fixed length, so the text on screen is real model output, cut off by the length limit.
SEED_STORY = [
    ("A", "count down from 7", 12),
    ("B", "count down from 152", 499),
    ("C", "count down from 20", 42),
    ("D", "count down from 18", 42),
    ("E", "count down from 151", 495),
    ("F", "count down from 150", 470),
    ("G", "count down from 146", 465),
    ("H", "count down from 16", 35),
]
SEED_STORY_SLOTS = 4
MAX_REPLY = 500  # longest reply a chat workload asks for ("count down from 152": 499 tokens + EOS)


def seed_story() -> list[Request]:
    return [
        Request(id=rid, prompt_ids=encode_prompt(text), max_new_tokens=n, ignore_eos=True, prompt=text)
        for rid, text, n in SEED_STORY
    ]


def prompt_with_reply_length(length: int, rng: random.Random) -> str:
    """A task prompt whose correct reply (plus EOS) is about `length` tokens."""
    if length > 40:  # counting down makes the long replies (and the shipped model stops those reliably)
        n = min(range(1, tasks.MAX_COUNT + 1), key=lambda k: abs(len(tasks.solve(f"count down from {k}")) + 1 - length))
        return f"count down from {n}"
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

    def __post_init__(self) -> None:
        if self.requests < 1:
            raise ConfigError(f"requests must be at least 1, got {self.requests}")
        if self.rate <= 0:
            raise ConfigError(f"rate must be positive (arrivals per step), got {self.rate}")
        if not 0 <= self.spread <= 1:
            raise ConfigError(f"spread must lie in [0, 1], got {self.spread}")
        if not 1 <= self.mean_reply <= MAX_REPLY:
            raise ConfigError(f"mean_reply must lie in [1, {MAX_REPLY}], got {self.mean_reply}")


def _request(rid: str, arrival: int, rng: random.Random, knobs: ChatKnobs) -> Request:
    length = draw_reply_length(rng, knobs.mean_reply, knobs.spread)
    prompt = prompt_with_reply_length(length, rng)
    budget = length if knobs.force_lengths else MAX_REPLY + 100  # real EOS: a generous safety cap
    return Request(rid, encode_prompt(prompt), budget, arrival, ignore_eos=knobs.force_lengths, prompt=prompt)


def chat(knobs: ChatKnobs | None = None, seed: int = 0) -> list[Request]:
    """Poisson arrivals: exponential gaps between arrivals with mean 1 / rate steps."""
    knobs, rng = knobs or ChatKnobs(), random.Random(seed)
    clock, out = 0.0, []
    for i in range(knobs.requests):
        out.append(_request(f"r{i}", int(clock), rng, knobs))
        if knobs.rate < knobs.requests:
            clock += rng.expovariate(knobs.rate)
    return out


def bursty(knobs: ChatKnobs | None = None, seed: int = 0, burst: int = 8, gap: int = 60) -> list[Request]:
    """Bursts of `burst` requests at once, every `gap` steps."""
    knobs, rng = knobs or ChatKnobs(), random.Random(seed)
    return [_request(f"r{i}", (i // burst) * gap, rng, knobs) for i in range(knobs.requests)]


WORKLOADS = ("seed-story", "chat", "bursty")


def make_workload(name: str, knobs: ChatKnobs | None = None, seed: int = 0) -> list[Request]:
    if name == "seed-story":
        return seed_story()
    if name == "chat":
        return chat(knobs, seed)
    if name == "bursty":
        return bursty(knobs, seed)
    raise ConfigError(f"unknown workload {name!r}; choose one of {', '.join(WORKLOADS)}")
