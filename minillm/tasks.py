"""The synthetic instruction tasks the tiny model is trained on.

Each task maps a prompt to exactly one correct reply that a person can check by eye, and
the prompt sets the reply length, from a single token ("count down from 1" -> "1") to 499
("count down from 152"). That spread of reply lengths is what makes batching interesting:
in a crowd of these requests some finish almost at once and some run for hundreds of steps.

Both tasks have a *local* stop rule, one the model can see in the last few tokens:
a countdown stops after "1", a spelling stops when the digits of the prompt run out.
A 3 M-parameter model learns such rules in minutes and applies them to prompts it never saw.
Counting *up* ("count to 37") was tried and dropped: to stop there the model must match the
number it just wrote against one in the prompt, and after 3800 steps it stopped right on 0 of
18 unseen end numbers (it memorised the ends it had seen), while "count down from N" got 14 of 17.

A fixed tenth of all prompts (by a hash of the text) is held out of training, so accuracy
is measured on prompts the model has never seen.
"""

from __future__ import annotations

import math
import random
import zlib
from collections.abc import Callable

DIGIT_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
MAX_COUNT = 152  # "count down from 152" is the longest reply: 499 bytes, then EOS
MAX_DIGITS = 6  # "spell 999999" is the longest spelling
KNOWN_TASKS = f"'count down from N' (N from 1 to {MAX_COUNT}) and 'spell N' (N up to {MAX_DIGITS} digits)"


def countdown_example(rng: random.Random) -> tuple[str, str]:
    # half uniform, half log-uniform: short countdowns are cheap and each one teaches the start and the stop
    if rng.random() < 0.5:
        start = rng.randint(1, MAX_COUNT)
    else:
        start = min(MAX_COUNT, int(math.exp(rng.uniform(0, math.log(MAX_COUNT + 1)))))
    prompt = f"count down from {start}"
    return prompt, " ".join(str(i) for i in range(start, 0, -1))


def spell_example(rng: random.Random) -> tuple[str, str]:
    number = str(rng.randint(0, 10 ** rng.randint(1, MAX_DIGITS) - 1))
    return f"spell {number}", " ".join(DIGIT_WORDS[int(d)] for d in number)


TASKS: dict[str, Callable[[random.Random], tuple[str, str]]] = {
    "countdown": countdown_example,
    "spell": spell_example,
}


def is_held_out(prompt: str) -> bool:
    """True for the tenth of prompts reserved for evaluation."""
    return zlib.crc32(prompt.encode()) % 10 == 0


def sample(task: str, rng: random.Random, held_out: bool) -> tuple[str, str]:
    """One (prompt, reply) pair of `task` from the training split, or from the held-out split."""
    while True:
        prompt, reply = TASKS[task](rng)
        if is_held_out(prompt) == held_out:
            return prompt, reply


def solve(prompt: str) -> str | None:
    """The correct reply for a prompt of any task, or None if the prompt fits no task."""
    words = prompt.split(" ")
    if len(words) == 2 and words[0] == "spell" and words[1].isdigit():
        return " ".join(DIGIT_WORDS[int(d)] for d in words[1])
    if len(words) == 4 and words[:3] == ["count", "down", "from"] and words[3].isdigit() and int(words[3]) >= 1:
        return " ".join(str(i) for i in range(int(words[3]), 0, -1))
    return None


def is_trained_shape(prompt: str) -> bool:
    """True if the prompt is one of the tasks, within the sizes training drew (held-out prompts included)."""
    if solve(prompt) is None:
        return False
    number = prompt.split(" ")[-1]
    return len(number) <= MAX_DIGITS if prompt.startswith("spell") else int(number) <= MAX_COUNT
