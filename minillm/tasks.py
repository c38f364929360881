"""The synthetic instruction tasks the tiny model is trained on.

Each task maps a prompt to exactly one correct reply that a person can check by eye, and
the prompt sets the reply length, from a single token ("count to 1" -> "1") to 500
("count to 152"). That spread of reply lengths is what makes batching interesting:
in a crowd of these requests some finish almost at once and some run for hundreds of steps.

A fixed tenth of all prompts (by a hash of the text) is held out of training, so accuracy
is measured on prompts the model has never seen.
"""

from __future__ import annotations

import math
import random
import zlib
from collections.abc import Callable

DIGIT_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
LETTERS = "abcdefghijklmnopqrstuvwxyz"
MAX_COUNT = 152  # "count to 152" is the longest reply: 500 bytes, then EOS


def draw_count(rng: random.Random) -> int:
    """Half uniform, half log-uniform: short counts are cheap and each one teaches where to stop."""
    if rng.random() < 0.5:
        return rng.randint(1, MAX_COUNT)
    return min(MAX_COUNT, int(math.exp(rng.uniform(0, math.log(MAX_COUNT + 1)))))


def count_example(rng: random.Random) -> tuple[str, str]:
    n = draw_count(rng)
    return f"count to {n}", " ".join(str(i) for i in range(1, n + 1))


def spell_example(rng: random.Random) -> tuple[str, str]:
    number = str(rng.randint(0, 10 ** rng.randint(1, 6) - 1))
    return f"spell {number}", " ".join(DIGIT_WORDS[int(d)] for d in number)


def countdown_example(rng: random.Random) -> tuple[str, str]:
    n = draw_count(rng)
    return f"count down from {n}", " ".join(str(i) for i in range(n, 0, -1))


def alphabet_example(rng: random.Random) -> tuple[str, str]:
    first = rng.randrange(26)
    last = rng.randrange(first, 26)
    return f"letters {LETTERS[first]} to {LETTERS[last]}", " ".join(LETTERS[first : last + 1])


TASKS: dict[str, Callable[[random.Random], tuple[str, str]]] = {
    "count": count_example,
    "countdown": countdown_example,
    "spell": spell_example,
    "letters": alphabet_example,
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


def all_prompts(task: str) -> list[str] | None:
    """Every prompt of a task with few enough prompts to list (None for the others)."""
    if task == "count":
        return [f"count to {n}" for n in range(1, MAX_COUNT + 1)]
    if task == "countdown":
        return [f"count down from {n}" for n in range(1, MAX_COUNT + 1)]
    if task == "letters":
        return [f"letters {a} to {b}" for i, a in enumerate(LETTERS) for b in LETTERS[i:]]
    return None


def solve(prompt: str) -> str | None:
    """The correct reply for a prompt of any task, or None if the prompt fits no task."""
    words = prompt.split(" ")
    try:
        if prompt.startswith("count to ") and len(words) == 3:
            return " ".join(str(i) for i in range(1, int(words[2]) + 1))
        if prompt.startswith("count down from ") and len(words) == 4:
            return " ".join(str(i) for i in range(int(words[3]), 0, -1))
        if prompt.startswith("spell ") and len(words) == 2 and words[1].isdigit():
            return " ".join(DIGIT_WORDS[int(d)] for d in words[1])
        if prompt.startswith("letters ") and len(words) == 4 and words[2] == "to":
            first, last = LETTERS.index(words[1]), LETTERS.index(words[3])
            return " ".join(LETTERS[first : last + 1]) if first <= last else None
    except ValueError:
        return None
    return None
