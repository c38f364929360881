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

A prompt may come after a preamble, a system prompt the model learns to ignore (see PREAMBLES):
that is what real users share, and what makes prefix caching worth having. Training mixes bare
prompts, the fixed PREAMBLES and random ones; every exchange, <bos> preamble <sep> prompt <sep>
reply <eos>, fits the model's 1024-token context, so the longest countdowns only come after the
shorter preambles (`fits`, `longest_countdown`).
"""

from __future__ import annotations

import math
import random
import zlib
from collections.abc import Callable

from minillm.config import ModelConfig
from minillm.errors import ConfigError
from minillm.model.tokenizer import encode, encode_prompt

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


# ---- preambles: a system prompt before the task, which the model learns to ignore ----

CONTEXT = ModelConfig().max_seq_len  # tokens of the whole exchange: preamble, prompt, reply and EOS

# The fixed system prompts (116 to 560 bytes) that workloads put before their prompts. Training sees
# them often, and random text besides, so the model ignores any preamble rather than these four only.
PREAMBLES: dict[str, str] = {
    "assistant": (
        "You are a helpful assistant. Answer the request that follows exactly, "
        "with no greeting and nothing after the answer."
    ),
    "teacher": (
        "You are a patient teacher in a primary school classroom. The children ask you to count down "
        "or to spell numbers out loud. Give only the answer, one word or number at a time, separated by "
        "single spaces, and stop as soon as the answer is complete."
    ),
    "workshop": (
        "You are the demo model of a workshop on how one GPU serves many users at once. Everyone in the "
        "room sends this same system prompt before their own request, so its keys and values can be "
        "computed once and shared: that is prefix caching. Keep every reply exact and short. Never explain "
        "yourself, never apologise, and never add text before or after the answer. If a request is unclear, "
        "do your best with what you were given."
    ),
    "rules": (
        "You are Minnie, the counting assistant of a small public library. Follow these rules in every "
        "conversation.\n"
        "Be accurate: a wrong answer is worse than a slow one.\n"
        "Be brief: reply with the answer alone, without greetings, summaries or offers of further help.\n"
        "Respect privacy: never ask for names, addresses or other personal details, and do not repeat any "
        "that a user shares.\n"
        "Stay on topic: you count down and you spell numbers digit by digit; politely decline anything else.\n"
        "Write plain text: no lists, no bold, no emoji. When in doubt, choose the shorter reply."
    ),
}
PREAMBLE_KINDS = ("none", "fixed", "random")
RANDOM_PREAMBLE_BYTES = (8, 700)  # training's random preambles: 8 bytes to a bit past the longest fixed one

# Random preambles are sentences of these words, with a number now and then: the task's own words and
# digits among them, so the model learns to read the task after the preamble, not anywhere in it.
FILLER_WORDS = (
    "the a an and or but if when then so because you your we our they it this that these those is are was be "
    "will can may must should please always never only also just very more less most each every all some any "
    "user users assistant model reply replies answer answers question questions request requests message text "
    "word words number numbers letter digit digits count down from spell say write read give keep stop start "
    "short long clear kind polite careful exact simple plain friendly helpful quiet fast slow first last next "
    "time day week year school library class team room table list line page book note rule rules help people "
    "child children teacher student workshop prompt system server seat seats cache memory token tokens"
).split()


def random_preamble(rng: random.Random, length: int) -> str:
    """Random sentences of FILLER_WORDS, cut to at most `length` bytes (ASCII: a byte is a character)."""
    text = ""
    while len(text) < length:
        words = [
            str(rng.randint(0, 999)) if rng.random() < 0.05 else rng.choice(FILLER_WORDS)
            for _ in range(rng.randint(3, 14))
        ]
        text += " ".join(words).capitalize() + rng.choice(".....?!") + rng.choice("   \n")
    return text[:length].rstrip()


def sequence_length(prompt: str, preamble: str | None = None) -> int:
    """Tokens of the whole exchange: <bos> [preamble <sep>] prompt <sep> reply <eos>."""
    return len(encode_prompt(prompt, preamble)) + len(encode(solve(prompt) or "")) + 1


def fits(prompt: str, preamble: str | None = None, context: int = CONTEXT) -> bool:
    """True if the prompt, after this preamble, and its whole correct reply fit the model's context."""
    return sequence_length(prompt, preamble) <= context


def longest_countdown(preamble: str | None = None) -> int:
    """The largest N for which "count down from N" fits after `preamble` (MAX_COUNT = 152 without one)."""
    return max(n for n in range(1, MAX_COUNT + 1) if fits(f"count down from {n}", preamble))


def draw_preamble(rng: random.Random, kind: str, prompt: str, context: int = CONTEXT) -> str | None:
    """A preamble of `kind` (one of PREAMBLE_KINDS) that still lets `prompt` and its reply fit the context.

    None when nothing of that kind fits. Random lengths are half uniform, half log-uniform over
    RANDOM_PREAMBLE_BYTES, like countdown starts: short preambles are cheap, long ones must be seen too.
    """
    if kind not in PREAMBLE_KINDS:
        raise ConfigError(f"unknown preamble kind {kind!r}; choose one of {', '.join(PREAMBLE_KINDS)}")
    room = context - sequence_length(prompt) - 1  # bytes left for a preamble, after its own <sep>
    if kind == "fixed":
        fitting = [p for p in PREAMBLES.values() if len(encode(p)) <= room]
        return rng.choice(fitting) if fitting else None
    low, high = RANDOM_PREAMBLE_BYTES[0], min(RANDOM_PREAMBLE_BYTES[1], room)
    if kind != "random" or high < low:
        return None
    if rng.random() < 0.5:
        length = rng.randint(low, high)
    else:
        length = int(math.exp(rng.uniform(math.log(low), math.log(high + 1))))
    return random_preamble(rng, min(length, high))
