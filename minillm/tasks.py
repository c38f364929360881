"""The synthetic instruction tasks the tiny model is trained on.

Each task maps a prompt to exactly one correct reply that a person can check by eye, and
the prompt sets the reply length, from a single token ("count from 7 to 7" -> "7") to 500
("count to 152"). That spread of reply lengths is what makes batching interesting:
in a crowd of these requests some finish almost at once and some run for hundreds of steps.

A fixed tenth of all prompts (by a hash of the text) is held out of training, so accuracy
is measured on prompts the model has never seen. The prompt space is large (thousands of
(start, end) pairs), so the model cannot memorise where each count stops: it has to learn
to compare the number it just wrote with the one in the prompt.
"""

from __future__ import annotations

import math
import random
import zlib
from collections.abc import Callable

DIGIT_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
MAX_COUNT = 152  # "count to 152" is the longest reply: 499 bytes, then EOS


def draw_range(rng: random.Random) -> tuple[int, int]:
    """(low, high) with 1 <= low <= high <= MAX_COUNT. The span is half uniform, half log-uniform:
    short counts are cheap and each one teaches where to stop."""
    if rng.random() < 0.5:
        span = rng.randint(0, MAX_COUNT - 1)
    else:
        span = min(MAX_COUNT - 1, int(math.exp(rng.uniform(0, math.log(MAX_COUNT)))) - 1)
    low = 1 if rng.random() < 0.25 else rng.randint(1, MAX_COUNT - span)
    return low, low + span


def count_example(rng: random.Random) -> tuple[str, str]:
    low, high = draw_range(rng)
    prompt = f"count to {high}" if low == 1 else f"count from {low} to {high}"
    return prompt, " ".join(str(i) for i in range(low, high + 1))


def countdown_example(rng: random.Random) -> tuple[str, str]:
    low, high = draw_range(rng)
    prompt = f"count down from {high}" if low == 1 else f"count down from {high} to {low}"
    return prompt, " ".join(str(i) for i in range(high, low - 1, -1))


def spell_example(rng: random.Random) -> tuple[str, str]:
    number = str(rng.randint(0, 10 ** rng.randint(1, 6) - 1))
    return f"spell {number}", " ".join(DIGIT_WORDS[int(d)] for d in number)


TASKS: dict[str, Callable[[random.Random], tuple[str, str]]] = {
    "count": count_example,
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
    numbers = [int(w) for w in words if w.isdigit()]
    if prompt.startswith("spell ") and len(words) == 2 and words[1].isdigit():
        return " ".join(DIGIT_WORDS[int(d)] for d in words[1])
    shapes = {
        ("count", "to", "#"): lambda n: range(1, n[0] + 1),
        ("count", "from", "#", "to", "#"): lambda n: range(n[0], n[1] + 1),
        ("count", "down", "from", "#"): lambda n: range(n[0], 0, -1),
        ("count", "down", "from", "#", "to", "#"): lambda n: range(n[0], n[1] - 1, -1),
    }
    shape = tuple("#" if w.isdigit() else w for w in words)
    if shape not in shapes or not numbers or min(numbers) < 1:
        return None
    values = list(shapes[shape](numbers))
    return " ".join(map(str, values)) or None
