"""SGLang's benchmark programs as token ids: MMLU 5-shot questions that share their subject's examples, and
multi-turn chats whose every turn starts with the whole conversation so far.

A program is a list of turns; a turn adds its own tokens to what the program said and heard so far, and asks for a
reply of its length. The next turn's prompt is only known when the reply is (the client builds it: sglang.py), as
in SGLang's interpreter (`s += prompt; s += gen(...)`). Token ids are drawn at random from Llama-2's vocabulary, so two
programs share exactly the tokens the benchmark makes them share and nothing by chance.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from minillm.errors import ConfigError
from minillm.papers import sglang_setup as setup

VOCAB = 32000  # Llama-2's
FIRST_ID = 200  # ids below stay clear of the simulated replies' (card/simulate.py: 32..121)


@dataclass(frozen=True)
class Turn:
    tokens: tuple[int, ...]  # what this turn appends to the conversation
    reply: int  # tokens it asks for


Program = tuple[Turn, ...]


def draw_ids(rng: random.Random, n: int) -> tuple[int, ...]:
    return tuple(rng.randrange(FIRST_ID, VOCAB) for _ in range(n))


def mmlu_lengths(mean: float, low: float) -> tuple[int, int, int]:
    """A subject's shared tokens, and its questions' token range: the examples are SHARED_SHARE of the mean prompt
    (an assumption); a question is drawn uniformly between the shortest prompt's remainder and as far above the mean,
    so the mean prompt is kept."""
    shared_chars = setup.SHARED_SHARE * mean
    q_mean, q_low = (mean - shared_chars) / setup.CHARS_PER_TOKEN, (low - shared_chars) / setup.CHARS_PER_TOKEN
    q_low = max(1.0, q_low)
    return round(shared_chars / setup.CHARS_PER_TOKEN), round(q_low), round(2 * q_mean - q_low)


def mmlu(rng: random.Random, share: float = 1.0) -> list[Program]:
    """The first 10 subjects' questions in subject order; `share` < 1 keeps that share of each subject's questions
    (at least 2, so every subject still shares its examples)."""
    programs = []
    for _, questions, mean, low, _ in setup.MMLU_SUBJECTS:
        shared_n, q_low, q_high = mmlu_lengths(mean, low)
        examples = draw_ids(rng, shared_n)
        for _ in range(max(2, round(questions * share))):
            programs.append((Turn(examples + draw_ids(rng, rng.randint(q_low, q_high)), 1),))
    return programs


def chat(rng: random.Random, answer: tuple[int, int], conversations: int) -> list[Program]:
    programs = []
    for _ in range(conversations):
        turns = (Turn(draw_ids(rng, rng.randint(*setup.CHAT_QUESTION)), rng.randint(*answer))
                 for _ in range(setup.CHAT_TURNS))  # fmt: skip
        programs.append(tuple(turns))
    return programs


def programs_of(workload: str, requests: int | None = None, seed: int = 0) -> list[Program]:
    """The workload's programs: the benchmark's number, or `requests` of them (MMLU: that share of every subject)."""
    if workload not in setup.WORKLOADS:
        raise ConfigError(f"unknown workload {workload!r}; choose from {', '.join(setup.WORKLOADS)}")
    if requests is not None and requests < 2:
        raise ConfigError(f"--requests must be at least 2 programs (a prefix is shared by two), got {requests}")
    rng, full = random.Random(seed), setup.WORKLOADS[workload].programs
    if workload == "mmlu":
        return mmlu(rng, 1.0 if requests is None else requests / full)
    return chat(rng, setup.CHAT_ANSWER[workload], requests or full)
