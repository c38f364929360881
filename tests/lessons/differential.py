"""Differential checks: your function against the reference on inputs hypothesis draws, not only on the cases
someone thought of.

Each lesson's check file builds a strategy (valid inputs of the exercise only, drawn so that the edges come up on
purpose: comparisons at equality and one past, empty and single inputs, special tokens, ties...) and a `compare`
that runs your function and the reference on one drawn input and raises AssertionError when they disagree, its first
line in the lesson's own words ("with these 3 requests and a budget of 8, ..."), the details after.

`against_reference` runs it on a fixed sequence of draws (derandomized, no example database: every run, yours and
the room's, draws the same inputs, so a failure reproduces), and when one differs hypothesis shrinks it to the
smallest input that still differs before the message is built from it. The number of draws is sized per check so
that a lesson's checks take at most 3 s on a loaded 2-core machine; MINILLM_CHECK_EXAMPLES=N draws N per check
instead, for a thorough run (`MINILLM_CHECK_EXAMPLES=2000 pytest -m lesson08`).

Your code raising NotImplementedError passes through untouched (the lesson summary calls it "not attempted" or
"partly done"); any other crash in your code is reported by the check's own `case(...)` with your line.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import strategies as st

ENV = "MINILLM_CHECK_EXAMPLES"


def examples(default: int) -> int:
    """How many inputs a check draws: its own default, or MINILLM_CHECK_EXAMPLES when set (a thorough run)."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return default
    try:
        count = int(raw)
    except ValueError:
        raise ValueError(f"{ENV}={raw!r}: give a whole number of inputs per check, e.g. {ENV}=2000") from None
    if count < 1:
        raise ValueError(f"{ENV}={raw!r}: give at least 1")
    return count


def against_reference(what: str, strategy: st.SearchStrategy, compare: Callable[[Any], None], default: int) -> None:
    """compare(drawn) on `default` inputs drawn from `strategy` (seeded); the first that differs, shrunk, fails the
    check with compare's own message first. `what`: the function compared, for the message's last line."""
    count = examples(default)

    @settings(
        max_examples=count,
        derandomize=True,  # the same draws on every run: a failure reproduces, for you and for whoever helps you
        database=None,  # no replay of earlier failures from .hypothesis/: every run draws the same inputs
        deadline=None,
        phases=(Phase.explicit, Phase.generate, Phase.shrink),  # (not "explain": it re-runs the input many times)
        report_multiple_bugs=False,  # one failure, the smallest of the first kind found
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
        print_blob=False,
    )
    @given(strategy)
    def run(drawn):
        compare(drawn)

    try:
        run()
    except AssertionError as error:
        message = str(error).rstrip()
        raise AssertionError(
            f"{message}\n  ({what} compared with the reference on {count} drawn inputs: this is the smallest that "
            f"differs; the draws are the same every run, {ENV}=N draws N)"
        ) from error


# --- strategies the lessons share -------------------------------------------------------------------------------------
def near(values: Iterable[int], low: int, high: int) -> st.SearchStrategy[int]:
    """An int in [low, high], half the time one of `values` or one either side of it (the edges: equality, one past)."""
    edges = sorted({v + d for v in values for d in (-1, 0, 1) if low <= v + d <= high})
    anywhere = st.integers(low, high)
    return st.one_of(st.sampled_from(edges), anywhere) if edges else anywhere


def plural(n: int, word: str, words: str | None = None) -> str:
    """'1 block', '3 blocks' ('1 query', '2 queries' with words given)."""
    return f"{n} {word}" if n == 1 else f"{n} {words or word + 's'}"


def request_line(rid: str, prompt_tokens: int, says: int, cap: int, at: int) -> str:
    """One drawn request in words: when it comes, its prompt, its cap, and what the stand-in model replies."""
    if cap == 0:
        reply = "rejected"
    elif says == 0:
        reply = "replies EOS at once"
    else:
        reply = f"replies {plural(min(says, cap), 'token')}" + (" then EOS" if says < cap else "")
    return f"  {rid}: arrives at step {at}, a prompt of {prompt_tokens} tokens, max_new_tokens {cap}, {reply}"
