"""Lesson 14: output that obeys: a state's mask, the automaton's walk, the rejection rule. Run: pytest -m lesson14

Your allowed_tokens and walk are checked state by state on automata that minillm.grammar compiles (a yes or no, a
number, a word with a non-ASCII letter, any text), against the reference (Dfa.allowed and Dfa.walk), then inside
the real engine: together they become the automaton of every constrained request (greedy and sampled, with and
without speculation), and the replies must be those the engine gives with its own automaton, token for token.
Your keep_or_resample is checked on positions where the answer is known (u and the draw are given), then for the
distribution it leaves over every u and guess (it must be p), then inside the engine: sampled requests speculate
(a draft model's guesses, and prompt lookup's certain ones) and must get the replies the engine's own rule gives.
The arguments you are given must come back as they were.

WRONG_MASKS, WRONG_WALKS and WRONG_RULES (below) list the mistakes a room makes, each caught and named; RIGHT_*,
versions written differently that must pass.

Then the differential checks (tests/lessons/drawn/lesson14.py): each function against the reference on drawn inputs
(seeded: the same every run; MINILLM_CHECK_EXAMPLES=N draws N; 50 each, the rule 60), the smallest that differs
shown first. Strategies: automata of 1 to 5 states whose bytes move to any state (0 and the last included) or DEAD,
the bytes 0, 127, 128 and 255 always given moves, states accepting or not, one whose only choice is EOS; masks for
every state and DEAD; walks of 0 to 8 tokens from any state or DEAD over bytes with and without moves, 0, 127, 128,
255 and every special token (PAD, BOS, EOS, SEP); the rule on vocabularies of 2 to 6 tokens, p and q from whole weights
(zeros, p equal to q), q None, the guess where q gives it probability (or q = 0 where p does not), u = 0, u exactly
p/q (a tie: either answer is right), 1e-9 either side of it, or anywhere in [0, 1). DRAWN_ONLY names the wrong
versions only the drawn inputs catch.
"""

from __future__ import annotations

import functools
import math
import re
import sys
from dataclasses import replace
from unittest import mock

import numpy as np
import pytest
import torch

from minillm.config import EngineConfig, Sampling
from minillm.engine.request import Request
from minillm.engine.scheduler import ContinuousScheduler
from minillm.grammar import compile_regex, compile_schema
from minillm.grammar.automaton import DEAD, Dfa
from minillm.layers import LayeredEngine, sampling
from minillm.model.tokenizer import EOS, SEP, SPECIAL_NAMES, VOCAB_SIZE, decode
from tests.lessons.drawn.lesson14 import check_drawn
from tests.lessons.harness import CHECKS, case, first_difference, implementations, small_model, stub
from tests.lessons.harness import student_module as student

lesson = pytest.mark.lesson14  # your code's checks: pytest -m lesson14


def reference_allowed_tokens(moves, accepting, state, vocab_size, eos):
    assert (vocab_size, eos) == (VOCAB_SIZE, EOS)  # (the engine's vocabulary: the one Dfa.allowed builds for)
    return Dfa(moves, accepting).allowed(state)


def reference_walk(moves, state, tokens):
    return Dfa(moves, np.zeros(len(moves), dtype=bool)).walk(state, tokens)


reference_keep_or_resample = sampling.rejection_rule  # the engine's own rule, its random numbers given: u and draw


@pytest.fixture(params=implementations(lesson))
def allowed_tokens(request):
    return reference_allowed_tokens if request.param == "reference" else student("lesson14_constrain").allowed_tokens


@pytest.fixture(params=implementations(lesson))
def walk(request):
    return reference_walk if request.param == "reference" else student("lesson14_constrain").walk


@pytest.fixture(params=implementations(lesson))
def automaton(request):
    """Both halves of an automaton (the engine needs both): (allowed_tokens, walk)."""
    if request.param == "reference":
        return reference_allowed_tokens, reference_walk
    module = student("lesson14_constrain")
    return module.allowed_tokens, module.walk


@pytest.fixture(params=implementations(lesson))
def keep_or_resample(request):
    if request.param == "reference":
        return reference_keep_or_resample
    return student("lesson14_constrain").keep_or_resample


# --- automata, and how a check shows tokens -------------------------------------------------------------------------
PATTERNS = {
    "yes-no": r"(yes|no)",
    "number": r"[0-9]{1,3}(\.[0-9])?",
    "cafe": "caf(e|é)s?",  # é is two bytes in UTF-8, 0xC3 0xA9: tokens above 127
    "any-text": r".*",  # every ASCII byte but a newline: bytes 0 to 3 too, where a special token read as a byte lands
}


def automaton_of(name: str) -> tuple[np.ndarray, np.ndarray]:
    """A fresh copy of a compiled automaton's (moves, accepting): compile_regex keeps the compiled one, shared."""
    dfa = compile_regex(PATTERNS[name])
    return dfa.moves.copy(), dfa.accepting.copy()


def label(token: int) -> str:
    return SPECIAL_NAMES.get(token) or (repr(chr(token))[1:-1] if token < 128 else f"0x{token:02X}")


def in_order(tokens) -> str:
    """[y, x, s]: a walk's tokens, as they come."""
    return "[" + ", ".join(label(t) for t in tokens) + "]"


def labels(tokens) -> str:
    """[n, y] or, for runs of consecutive tokens, [., 0-9, <eos>]."""
    runs: list[list[int]] = []
    for t in sorted(int(t) for t in tokens):
        if runs and t == runs[-1][1] + 1 and t < 256:
            runs[-1][1] = t
        else:
            runs.append([t, t])
    return "[" + ", ".join(label(a) if a == b else f"{label(a)}-{label(b)}" for a, b in runs) + "]"


# --- 1. a state's mask --------------------------------------------------------------------------------------------
MASKS = {  # name: (pattern, the bytes the reply has so far, or None: the reply already left its pattern)
    "the start of (yes|no)": ("yes-no", b""),
    "(yes|no) after 'n'": ("yes-no", b"n"),
    "(yes|no) after 'no', a state whose only move is EOS": ("yes-no", b"no"),
    "a number after '4', which may end or go on": ("number", b"4"),
    "a number after '4.', which may not end yet": ("number", b"4."),
    "caf(e|é)s? after 'caf', where a byte above 127 is allowed (é's first, 0xC3)": ("cafe", b"caf"),
    "caf(e|é)s? after 'caf' and 0xC3": ("cafe", b"caf\xc3"),
    "any text, at the start": ("any-text", b""),
    "a dead state (a reply that left its pattern)": ("yes-no", None),
}


def as_mask(got, name: str) -> np.ndarray:
    array = got.cpu().numpy() if isinstance(got, torch.Tensor) else np.asarray(got)
    if array.shape != (VOCAB_SIZE,) or array.dtype != bool:
        what = f"a {type(got).__name__}" + (f" of shape {array.shape}, dtype {array.dtype}" if array.ndim else "")
        raise AssertionError(
            f"{name}: return a mask, a numpy bool array of shape ({VOCAB_SIZE},) with one entry per token (True: "
            f"allowed), e.g. np.zeros(vocab_size, dtype=bool) filled in; you returned {what}"
        )
    return array


def diagnose_mask(got, want, moves, accepting, state) -> str:
    extra, missing = set(np.flatnonzero(got & ~want)), set(np.flatnonzero(want & ~got))
    if state == DEAD:
        if np.array_equal(got, reference_allowed_tokens(moves, accepting, 0, VOCAB_SIZE, EOS)):
            return "you gave DEAD (-1) the start's mask: DEAD is no state at all, not state 0: it allows nothing"
        if np.array_equal(got, reference_allowed_tokens(moves, accepting, len(moves) - 1, VOCAB_SIZE, EOS)):
            return (
                "moves[DEAD] is moves[-1], the LAST state's row (Python's negative index): check state == DEAD "
                "first, and allow nothing"
            )
        return "a dead state allows nothing: return all False"
    why = []
    if EOS in extra:
        why.append("EOS where the pattern may not end (accepting[state] is False): allow EOS only where it accepts")
    if EOS in missing:
        goes_on = ", even though it has moves: an accepting state may end or go on" if got[:256].any() else ""
        why.append(f"EOS is missing: this state accepts, so the reply may end here{goes_on}")
    specials = sorted(t for t in extra if t >= 256 and t != EOS)
    if specials:
        why.append(f"you allowed {labels(specials)}: special tokens are never part of a reply (only bytes, and EOS)")
    high = sorted(b for b in missing if 128 <= b < 256)
    if high:
        why.append(
            f"you left out {labels(high)}: bytes 128-255 are tokens too (UTF-8 writes é as 0xC3 0xA9): look at "
            "moves[state, b] for every b from 0 to 255"
        )
    if not why:
        why.append(f"the bytes allowed are those with moves[state, b] != DEAD: you allowed {labels(sorted(extra))} "
                   f"and left out {labels(sorted(missing))}")  # fmt: skip
    return "; ".join(why)


def check_mask(allowed_tokens, name: str) -> None:
    pattern, before = MASKS[name]
    moves, accepting = automaton_of(pattern)
    state = DEAD if before is None else reference_walk(moves, 0, list(before))
    given_moves, given_accepting = moves.copy(), accepting.copy()
    with case(name):
        got = as_mask(allowed_tokens(given_moves, given_accepting, state, VOCAB_SIZE, EOS), name)
    want = reference_allowed_tokens(moves, accepting, state, VOCAB_SIZE, EOS)
    assert np.array_equal(got, want), (
        f"{name}: state {state} of {PATTERNS[pattern]!r}: you allowed {labels(np.flatnonzero(got))}, expected "
        f"{labels(np.flatnonzero(want))}.\n  {diagnose_mask(got, want, moves, accepting, state)}"
    )
    for what, given, before_call in (("moves", given_moves, moves), ("accepting", given_accepting, accepting)):
        assert np.array_equal(given, before_call), (
            f"{name}: a side effect: allowed_tokens changed the automaton's `{what}` array (moves[state] is a view "
            "of it, so `row += 1` or `row[...] = ...` writes into the automaton every request shares): work on a copy, "
            "or on a new array"
        )


def check_masks_are_new(allowed_tokens) -> None:
    moves, accepting = automaton_of("yes-no")
    after_no = reference_walk(moves, 0, list(b"no"))
    start = as_mask(allowed_tokens(moves, accepting, 0, VOCAB_SIZE, EOS), "the start of (yes|no)")
    kept = start.copy()
    as_mask(allowed_tokens(moves, accepting, after_no, VOCAB_SIZE, EOS), "(yes|no) after 'no'")
    assert np.array_equal(start, kept), (
        "two masks held at once: the mask you returned for the start of (yes|no) changed when you built the one "
        "after 'no'. Return a new array each call (np.zeros(vocab_size, dtype=bool) inside the function), not one "
        "shared array: the engine keeps every state's mask and uses them step after step"
    )


@pytest.mark.parametrize("name", MASKS)
def test_a_state_allows_its_bytes_and_eos_where_it_may_end(allowed_tokens, name):
    check_mask(allowed_tokens, name)


def test_each_call_gives_a_new_mask(allowed_tokens):
    check_masks_are_new(allowed_tokens)


# --- 2. the walk ----------------------------------------------------------------------------------------------------
WALKS = {  # name: (pattern, the bytes that lead to the start, or None: a dead start; the tokens walked)
    "an empty reply, from the start": ("yes-no", b"", []),
    "an empty reply, from part-way (after 'y')": ("yes-no", b"y", []),
    "a reply the pattern allows, 'yes'": ("yes-no", b"", list(b"yes")),
    "a walk from part-way, 'es' after 'y'": ("yes-no", b"y", list(b"es")),
    "a byte the pattern refuses, 'yx'": ("yes-no", b"", list(b"yx")),
    "a byte after a refused one, 'yxs' (the last state moves on 's')": ("yes-no", b"", list(b"yxs")),
    "a walk that starts DEAD, then 's'": ("yes-no", None, list(b"s")),
    "a walk over EOS (258, a special token: no move)": ("yes-no", b"", [*b"no", EOS]),
    "EOS in any text, where byte 2 has a move": ("any-text", b"", [*b"ok", EOS]),
    "SEP in any text, where byte 3 has a move": ("any-text", b"", [SEP]),
    "bytes above 127, 'café' (é is 0xC3 0xA9)": ("cafe", b"", list("café".encode())),
}


def walk_with(moves, state, tokens, sticky=True, specials="dead", seven_bits=False):
    """A walk written out, with switches for the mistakes below (the diagnosis replays them)."""
    for token in tokens:
        if state == DEAD and sticky:
            return DEAD
        if (token >= 256 and specials == "dead") or (token > 256 and specials == "past-pad"):  # past-pad: wrong
            state = DEAD
            continue
        byte = token & 0xFF if specials == "wrap" else token
        state = int(moves[state, byte & 0x7F if seven_bits else byte])
    return state


def walk_the_text(moves, state, tokens):
    for char in decode(tokens):
        if state == DEAD:
            break
        state = int(moves[state, ord(char)]) if ord(char) < 256 else DEAD
    return state


def diagnose_walk(moves, start, tokens, got, want) -> str:
    if not tokens:
        return f"no tokens: the walk stays where it started ({start})"
    replays = [
        (lambda: walk_with(moves, start, tokens, sticky=False),
         "nothing leaves DEAD: moves[DEAD] is moves[-1], the LAST state's row (Python's negative index), so stop at "
         "DEAD (or check for it before each move)"),
        (lambda: walk_with(moves, start, tokens, specials="wrap"),
         "a special token (256 and up) has no move: read as a byte (token % 256, & 0xFF) it lands on one this "
         "pattern allows. It leads to DEAD"),
        (lambda: walk_with(moves, start, tokens, seven_bits=True),
         "bytes 128-255 are tokens too: read as 7 bits (token % 128, & 0x7F) é's 0xC3 becomes 'C'; index moves with "
         "the token itself"),
        (lambda: walk_the_text(moves, start, tokens),
         "you walked the reply's text: decoding drops the special tokens and reads é as one character (233), not its "
         "two bytes: walk the tokens themselves"),
    ]  # fmt: skip
    for replay, why in replays:
        try:
            if replay() == got:
                return why
        except Exception:  # (a replay that cannot run on these tokens is not the mistake)
            continue
    return f"follow moves[state, token] for each token; a token without a move leads to DEAD ({DEAD}) for good"


def check_walk(walk, name: str) -> None:
    pattern, before, tokens = WALKS[name]
    moves, _ = automaton_of(pattern)
    start = DEAD if before is None else reference_walk(moves, 0, list(before))
    given_moves, given_tokens = moves.copy(), list(tokens)
    with case(name):
        got = walk(given_moves, start, given_tokens)
    want = reference_walk(moves, start, tokens)
    if isinstance(got, bool) or not isinstance(got, (int, np.integer)):
        raise AssertionError(f"{name}: return the state as an int (a state, or DEAD = -1); you returned {got!r}")
    where = "DEAD" if want == DEAD else f"state {want}" + (", which accepts" if compile_regex(PATTERNS[pattern])
                                                            .accepts(want) else "")  # fmt: skip
    assert got == want, (
        f"{name}: walk(moves, {start}, {in_order(tokens)}) on {PATTERNS[pattern]!r} returned {got}, expected {where}."
        f"\n  {diagnose_walk(moves, start, tokens, got, want)}"
    )
    assert given_tokens == tokens, (
        f"{name}: a side effect: walk changed the tokens list it was given, from {in_order(tokens)} to "
        f"{in_order(given_tokens)}. They are the reply's (the engine walks a row's guesses from the draft it keeps): "
        "loop over them, never pop"
    )
    assert np.array_equal(given_moves, moves), f"{name}: a side effect: walk changed the automaton's moves"


@pytest.mark.parametrize("name", WALKS)
def test_a_walk_follows_the_moves_and_stays_dead_after_a_refusal(walk, name):
    check_walk(walk, name)


def test_the_mask_and_the_walk_equal_the_reference_on_drawn_automata(automaton):
    allowed_tokens, walk = automaton
    check_drawn(sys.modules[__name__], masks=allowed_tokens, walk=walk)


# --- 3. the rejection rule ------------------------------------------------------------------------------------------
P = torch.tensor([0.30, 0.25, 0.20, 0.12, 0.08, 0.05], dtype=torch.float64)  # the model's distribution
Q = torch.tensor([0.10, 0.40, 0.05, 0.30, 0.10, 0.05], dtype=torch.float64)  # a drafter's, often wrong
Q_ZERO = torch.tensor([0.10, 0.40, 0.10, 0.30, 0.10, 0.00], dtype=torch.float64)  # no probability for token 5
P_ZERO = torch.tensor([0.35, 0.25, 0.20, 0.12, 0.08, 0.00], dtype=torch.float64)  # the model never picks token 5
RULES = {  # name: (p, q, guess, u)
    "a guess the model likes more than the drafter (p > q), u near 1: kept": (P, Q, 0, 0.97),
    "a guess the drafter overrates (q > p), u below p/q: kept": (P, Q, 1, 0.5),
    "a guess the drafter overrates (q > p), u above p/q: rejected": (P, Q, 1, 0.8),
    "another overrated guess, u above p/q: rejected": (P, Q, 3, 0.55),
    "p equal to q: kept whatever u": (P, P, 3, 0.999),
    "a guess the drafter gave no probability (q = 0 there): kept": (P, Q_ZERO, 5, 0.99),
    "a guess the model never picks (p = 0 there): rejected": (P_ZERO, Q, 5, 0.01),
    "a certain guess (q is None, as prompt lookup's), u below p[guess]: kept": (P, None, 0, 0.2),
    "a certain guess (q is None), u above p[guess]: rejected": (P, None, 0, 0.5),
}


def not_a_distribution(weights: torch.Tensor, size: int) -> str | None:
    """What is wrong with the weights a rule handed to draw, or None."""
    if weights.shape != (size,):
        return f"draw takes a weight for each of the {size} tokens, shape ({size},); you gave it {tuple(weights.shape)}"
    if (weights < 0).any():
        least = weights[weights < 0].min().item()
        return (
            f"draw was given weights below 0 (the least {least:.3g}): the residual is max(0, p - q): clamp p - q at 0"
        )
    if not torch.isfinite(weights).all() or weights.sum() == 0:
        return (
            "draw was given nothing to draw from (all zeros, or 0 / 0 = nan): where p equals q the residual is empty, "
            "and the guess is always kept there: draw only after a rejection"
        )
    if abs(weights.sum().item() - 1) > 1e-6:
        total = weights.sum().item()
        return f"the weights you gave draw sum to {total:.3f}, not 1: normalise the residual (divide it by its sum)"
    return None


class Draw:
    """The draw a check hands you: it records what it was given, and picks the token where the weights pass 0.5."""

    def __init__(self, size: int):
        self.size, self.given = size, []

    def __call__(self, dist) -> int:
        weights = torch.as_tensor(dist, dtype=torch.float64).clone()
        self.given.append(weights)
        problem = not_a_distribution(weights, self.size)
        assert problem is None, problem
        return int(
            torch.searchsorted(weights.cumsum(0), torch.tensor(0.5, dtype=torch.float64)).clamp(max=self.size - 1)
        )


def residual_of(p, q, guess) -> torch.Tensor:
    if q is None:
        rest = p.clone()
        rest[guess] = 0.0
        return rest / rest.sum()
    return reference_keep_or_resample(p, q, guess, 1.0, lambda dist: dist)  # (u = 1: always rejected)


def check_rule(rule, name: str) -> None:
    p, q, guess, u = RULES[name]
    given_p, given_q = p.clone(), None if q is None else q.clone()
    draw = Draw(len(p))
    with case(name):
        got = rule(given_p, given_q, guess, u, draw)
    q_guess = 1.0 if q is None else float(q[guess])
    ratio = math.inf if q_guess == 0 else float(p[guess]) / q_guess
    at = f"guess {guess} (p {float(p[guess]):.2f}, q {'None' if q is None else f'{q_guess:.2f}'}), u = {u}"
    kept_with = f"min(1, p/q) = {min(1.0, ratio):.3f}"
    if isinstance(got, bool) or not isinstance(got, (int, np.integer)):
        raise AssertionError(f"{name}: return the token as an int (the guess, or what draw gave); you returned {got!r}")
    if u * q_guess < float(p[guess]):
        why = ""
        if ratio >= 1:
            why = " (a guess the model likes at least as much as the drafter is always kept: min(1, p/q) = 1"
            why += "; q = 0 makes p/q infinite: compare u * q < p, no division)" if q_guess == 0 else ")"
        elif q is not None:
            why = " (where the drafter gave it more than the model, keep it with probability p/q, not only where p > q)"
        assert got == guess, f"{name}: {at}: you returned {got}, but the guess is kept: u is below {kept_with}{why}"
        assert not draw.given, (
            f"{name}: {at}: you called draw (a rejection, or a draw before deciding), but the guess is kept: u is "
            f"below {kept_with}{why}. Draw only after a rejection (where p equals q the residual is all zeros)"
        )
    else:
        assert draw.given or got != guess, (
            f"{name}: {at}: you kept the guess, but it is kept with probability {kept_with}, so only when u is below "
            "that: here it is rejected, and replaced by draw(residual)"
        )
        assert draw.given, (
            f"{name}: {at}: a rejected guess is replaced by a token from draw(residual); you returned {got} without "
            "calling draw"
        )
        assert len(draw.given) == 1, (
            f"{name}: you called draw {len(draw.given)} times: one draw replaces one rejected guess"
        )
        want = residual_of(p, q, guess)
        dist = draw.given[0]
        if not torch.allclose(dist, want, atol=1e-9):
            if q is None and torch.allclose(dist, p):
                why = ("a certain guess: q is 1 on the guess and 0 elsewhere, so the residual max(0, p - q) is p "
                       "without the guess (normalised): a rejected guess must not be drawn again")  # fmt: skip
            elif torch.allclose(dist, p):
                why = ("you drew from p itself: a rejected guess is replaced by a draw from the residual "
                       "max(0, p - q), normalised (what p has beyond q: drawing from p gives the overrated tokens "
                       "twice)")  # fmt: skip
            else:
                why = "the residual is max(0, p - q) normalised to sum to 1"
            raise AssertionError(
                f"{name}: {at}: you gave draw {[round(x, 3) for x in dist.tolist()]}, expected "
                f"{[round(x, 3) for x in want.tolist()]}.\n  {why}"
            )
        drawn = Draw(len(p))(want)
        assert got == drawn, f"{name}: {at}: return the token draw gave you ({drawn}); you returned {got}"
    for what, given, before in (("p", given_p, p), ("q", given_q, q)):
        assert given is None or torch.equal(given, before), (
            f"{name}: a side effect: you changed {what}, the caller's tensor (`r = p; r -= q` or clamp_ works in "
            f"place): compute the residual into a new tensor (p - q makes one)"
        )


def check_distribution(rule, steps: int = 50) -> None:
    """Over every u (a grid of `steps`) and every guess, the tokens the rule leaves must be distributed as p: a guess
    drawn from q (or a certain one), then kept or replaced by the rule, is a token drawn from p."""
    drafters = [("guesses drawn from q", Q, [(x, float(Q[x])) for x in range(len(P))])]
    drafters += [(f"the certain guess {x}", None, [(x, 1.0)]) for x in (0, 4)]
    for what, q, guesses in drafters:
        left = torch.zeros(len(P), dtype=torch.float64)  # the probability of each token coming out
        for guess, weight in guesses:
            for i in range(steps):
                draw = Draw(len(P))
                token = rule(P.clone(), None if q is None else q.clone(), guess, (i + 0.5) / steps, draw)
                if draw.given:
                    left += weight / steps * draw.given[-1]  # (the draw's whole distribution, not its one token)
                else:
                    left[token] += weight / steps
        gap = 0.5 * (left - P).abs().sum().item()
        assert gap < 0.02, (
            f"the tokens your rule leaves, over every u, for {what}: {[round(x, 3) for x in left.tolist()]}; they "
            f"must be distributed as p, {[round(x, 3) for x in P.tolist()]} (total variation {gap:.3f})"
        )


@pytest.mark.parametrize("name", RULES)
def test_a_guess_is_kept_or_replaced_by_the_rule(keep_or_resample, name):
    check_rule(keep_or_resample, name)


def test_the_tokens_the_rule_leaves_are_distributed_as_p(keep_or_resample):
    check_distribution(keep_or_resample)


def test_the_rule_equals_the_reference_on_drawn_draws(keep_or_resample):
    check_drawn(sys.modules[__name__], rule=keep_or_resample)


# --- inside the real engine -----------------------------------------------------------------------------------------
class YourAutomaton(Dfa):
    """A compiled pattern whose mask and walk are yours: the engine asks it at every step (layers/constrain.py)."""

    def __init__(self, dfa: Dfa, allowed_tokens, walk):
        super().__init__(dfa.moves.copy(), dfa.accepting.copy(), dfa.pattern)
        self.allowed_tokens, self.walk_tokens = allowed_tokens, walk

    def allowed(self, state: int) -> np.ndarray:
        return np.asarray(self.allowed_tokens(self.moves, self.accepting, state, VOCAB_SIZE, EOS))

    def step(self, state: int, token: int) -> int:
        return self.walk_tokens(self.moves, state, [token])

    def walk(self, state: int, tokens) -> int:
        return self.walk_tokens(self.moves, state, list(tokens))


@functools.cache
def noisy_draft():
    """The test model with noise in its weights: its guesses are right part of the time."""
    model = small_model("gqa")
    draft = type(model)(model.cfg)
    draft.load_state_dict(model.state_dict())
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.5 * p.std())
    return draft.eval()


SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}},
          "required": ["ok", "n"], "additionalProperties": False}  # fmt: skip
CONSTRAINTS = {  # what the crowd's replies must match
    "digits": lambda: compile_regex(r"[0-9]{2,5}(\.[0-9])?"),
    "words": lambda: compile_regex(r'\["[a-z]{1,4}"(, "[a-z]{1,4}"){0,3}\]'),
    "café": lambda: compile_regex("(yes|no|caf(e|é))!?"),
    "a JSON schema": lambda: compile_schema(SCHEMA),
}
ENGINE_RUNS = {
    "paged cache, no speculation": dict(kv="paged", block_size=4),
    "contiguous cache, speculating with a draft model (k = 3)": dict(kv="contiguous", speculate=3),
}


def serve(requests, **how):
    model = small_model("gqa")
    draft = noisy_draft() if how.get("speculate") and how.get("drafter", "model") == "model" else None
    engine = LayeredEngine(
        model, ContinuousScheduler(), EngineConfig(slots=4, max_len=model.cfg.max_seq_len, **how), draft=draft
    )
    for r in requests:
        engine.submit(r)
    return engine.run(max_steps=600)


def constrained_crowd(automaton=None) -> list[Request]:
    """Greedy and sampled requests under each constraint, and an unconstrained neighbour."""
    requests = []
    for i, (name, make) in enumerate(list(CONSTRAINTS.items()) * 2):
        dfa = make() if automaton is None else YourAutomaton(make(), *automaton)
        how = Sampling(temperature=1.0, seed=i) if i >= len(CONSTRAINTS) else Sampling()
        prompt = [257] + [(11 * i + j) % 256 for j in range(3 + 4 * (i % 3))]
        requests.append(Request(f"r{i}", prompt, 40, sampling=replace(how, constraint=dfa), prompt=name))
    return requests + [Request("free", [257, 40, 41, 42], 12, ignore_eos=True)]


@functools.cache
def engines_own(run: str):
    """The engine's replies with its own automata, and how many tokens each step's masks allowed."""
    requests = constrained_crowd()
    trace = serve(requests, **ENGINE_RUNS[run])
    return {r.id: r.output_ids for r in requests}, [s.allowed for s in trace.steps]


def check_engine_automaton(allowed_tokens, walk, run: str) -> None:
    requests = constrained_crowd((allowed_tokens, walk))
    with case(f"inside the engine, {run}"):
        trace = serve(requests, **ENGINE_RUNS[run])
    want, allowed = engines_own(run)
    for r in requests:
        how = f"inside the engine, {run}: {r.id} ({r.prompt or 'no constraint'}, " + (
            "sampled)" if r.sampling.temperature else "greedy)"
        )
        if r.sampling.constraint is not None:
            own = CONSTRAINTS[r.prompt]()
            state = own.walk(0, r.output_ids)
            assert state != DEAD and (r.finish_reason != "eos" or own.accepts(state)), (
                f"{how}: its reply {decode(r.output_ids)!r} breaks its pattern {own.pattern[:60]!r}: your mask let a "
                "token through that the pattern does not allow there, or your walk lost its place"
            )
        assert r.output_ids == want[r.id], (
            f"{how}: {first_difference(want[r.id], r.output_ids)} (with the engine's own automaton the reply is "
            f"{decode(want[r.id])!r}; with yours {decode(r.output_ids)!r})"
        )
    steps = [s.allowed for s in trace.steps]
    assert steps == allowed, (
        f"inside the engine, {run}: the trace's counts of allowed tokens differ from the engine's own"
    )


def engine_rule(rule):
    """Your rule in sampling.rejection_rule's place: the engine gives it this position's u and draw, and the draw
    checks that it is handed a distribution."""

    def settle(p, q, guess, u, draw):
        def checked_draw(dist) -> int:
            weights = torch.as_tensor(dist, dtype=torch.float64)
            problem = not_a_distribution(weights, len(p))
            assert problem is None, problem
            return draw(weights)

        return rule(p, q, guess, u, checked_draw)

    return settle


RULE_RUNS = {  # name: (the engine's switches, the requests)
    "sampled replies speculating with a draft model": (
        dict(speculate=3),
        lambda: [Request(f"s{i}", [257] + [(7 * i + j) % 256 for j in range(4 + i)], 24, ignore_eos=True,
                         sampling=Sampling(temperature=0.1, seed=10 + i)) for i in range(3)],
    ),
    "sampled replies in a pattern, speculating with prompt lookup (certain guesses: q is None)": (
        dict(speculate=3, drafter="ngram"),
        lambda: [Request(f"n{i}", [257, *b"abbaabab"], 30,
                         sampling=Sampling(temperature=1.0, seed=20 + i, constraint=compile_regex("(ab|ba){3,10}")))
                 for i in range(4)],
    ),
}  # fmt: skip


def serve_rule_run(run: str, rule=None):
    """The run's requests, served with `rule` in the engine's place (None: the engine's own), and the run's trace."""
    how, make = RULE_RUNS[run]
    requests = make()
    if rule is None:
        trace = serve(requests, **how)
    else:
        with mock.patch.object(sampling, "rejection_rule", engine_rule(rule)):
            trace = serve(requests, **how)
    return requests, trace


@functools.cache
def engines_own_samples(run: str):
    return serve_rule_run(run)


def check_engine_rule(rule, run: str) -> None:
    with case(f"inside the engine, {run}"):
        requests, _ = serve_rule_run(run, rule)
    for mine, own in zip(requests, engines_own_samples(run)[0]):
        assert mine.output_ids == own.output_ids, (
            f"inside the engine, {run}: {mine.id}: {first_difference(own.output_ids, mine.output_ids)} (the engine's "
            "own rule, with the same random numbers, gives another token: yours keeps or replaces a guess differently)"
        )


@pytest.mark.parametrize("run", ENGINE_RUNS)
def test_the_engine_obeys_each_pattern_with_your_automaton(automaton, run):
    check_engine_automaton(*automaton, run)


@pytest.mark.parametrize("run", RULE_RUNS)
def test_the_engine_with_your_rule_gives_its_own_sampled_replies(keep_or_resample, run):
    check_engine_rule(keep_or_resample, run)


# --- the checks check what they say ---------------------------------------------------------------------------------
@CHECKS
def test_the_cases_are_what_their_names_say():
    yes_no, _ = automaton_of("yes-no")
    assert yes_no[-1, ord("s")] != DEAD, (
        "(yes|no)'s last state must move on 's', or 'yxs' and a dead start test nothing"
    )
    anything, _ = automaton_of("any-text")
    assert (anything[:, [EOS % 256, SEP % 256]] != DEAD).all(), "any text must move on bytes 2 and 3"
    for run in RULE_RUNS:
        requests, trace = engines_own_samples(run)
        records = [trace.request(r.id) for r in requests]
        verified, kept = sum(r.drafts_verified for r in records), sum(r.drafts_accepted for r in records)
        assert 0 < kept < verified, f"{run}: guesses must be kept and rejected ({kept} of {verified} kept)"
    for run in ENGINE_RUNS:
        replies, allowed = engines_own(run)
        assert any(n > 1 for counts in allowed for n in counts.values()), f"{run}: the masks never left a choice"


# --- the checks catch plausible mistakes ----------------------------------------------------------------------------
def written_out_mask(eos="where-it-accepts", dead="nothing", bytes_up_to=256, specials=False, shared=False):
    """An allowed_tokens written out, with switches for the mistakes below."""
    buffer = np.zeros(VOCAB_SIZE, dtype=bool)

    def allowed_tokens(moves, accepting, state, vocab_size, eos_token):
        allowed = buffer if shared else np.zeros(vocab_size, dtype=bool)
        allowed[:] = specials  # (True: every special token left allowed)
        allowed[:256] = False
        if state == DEAD and dead == "nothing":
            return allowed
        if state == DEAD and dead == "start":
            state = 0
        for b in range(bytes_up_to):  # (dead == "last row": moves[-1] is read)
            allowed[b] = moves[state, b] != DEAD
        no_move = not allowed[:256].any()
        allowed[eos_token] = {"where-it-accepts": accepting[state], "always": True, "never": False,
                              "where-no-byte-moves": no_move}[eos]  # fmt: skip
        return allowed

    return allowed_tokens


def shifts_the_row_in_place(moves, accepting, state, vocab_size, eos):
    """Wrong: moves[state] is a view of the automaton; `row += 1` (to make DEAD 0) writes into it."""
    allowed = np.zeros(vocab_size, dtype=bool)
    if state == DEAD:
        return allowed
    row = moves[state]
    row += 1
    allowed[:256] = row > 0
    allowed[eos] = accepting[state]
    return allowed


def lists_the_allowed_tokens(moves, accepting, state, vocab_size, eos):
    """Wrong: the ids of the allowed tokens, not a mask over the vocabulary."""
    if state == DEAD:
        return []
    return [b for b in range(256) if moves[state, b] != DEAD] + ([eos] if accepting[state] else [])


def vectorised_mask(moves, accepting, state, vocab_size, eos):
    """Right, written differently: one comparison of the state's row."""
    allowed = np.zeros(vocab_size, dtype=bool)
    if state != DEAD:
        allowed[:256] = moves[state] != DEAD
        allowed[eos] = accepting[state]
    return allowed


def mask_by_index(moves, accepting, state, vocab_size, eos):
    """Right, written differently: the bytes with a move found by index, EOS set from a list."""
    allowed = np.full(vocab_size, False)
    if state == DEAD:
        return allowed
    allowed[np.flatnonzero(moves[state] >= 0)] = True
    allowed[[eos]] = bool(accepting[state])
    return allowed


def walk_written_out(sticky=True, specials="dead", seven_bits=False):
    return lambda moves, state, tokens: walk_with(moves, state, tokens, sticky, specials, seven_bits)


def pops_the_tokens(moves, state, tokens):
    """Wrong: the walk is right, but it empties the caller's list."""
    while tokens:
        token = tokens.pop(0)
        state = DEAD if state == DEAD or token >= 256 else int(moves[state, token])
    return state


def forgets_the_empty_reply(moves, state, tokens):
    """Wrong: returns the last state reached, which no token ever set in an empty reply."""
    for token in tokens:
        reached = DEAD if state == DEAD or token >= 256 else int(moves[state, token])
        state = reached
    return reached


def walk_stops_early(moves, state, tokens):
    """Right, written differently: DEAD returned at the first refusal."""
    for token in tokens:
        if state == DEAD or not 0 <= token < 256:
            return DEAD
        state = int(moves[state, token])
    return state


def walk_by_reduce(moves, state, tokens):
    """Right, written differently: one step folded over the tokens."""
    step = lambda s, t: DEAD if s == DEAD or t >= 256 else int(moves[s, t])
    return functools.reduce(step, tokens, state)


def written_out_rule(keep="u*q<p", residual="normalised", certain="without-the-guess", in_place=False,
                     draw_first=False):  # fmt: skip
    """A keep_or_resample written out, with switches for the mistakes below."""

    def rule(p, q, guess, u, draw):
        if q is None and certain == "crash":
            q_guess = float(q[guess])  # (a certain guess forgotten: q is None)
        q_guess = 1.0 if q is None else float(q[guess])
        p_guess = float(p[guess])
        if keep == "u*q<p":
            kept = u * q_guess < p_guess
        elif keep == "divided":
            kept = u < min(1.0, p_guess / q_guess)
        elif keep == "always":
            kept = True
        elif keep == "p>=q":
            kept = p_guess >= q_guess
        else:  # "u<p": kept with probability p
            kept = u < p_guess
        if kept and not draw_first:
            return guess
        if q is None:
            rest = p.clone()
            if certain != "from-p":
                rest[guess] = 0.0
        elif residual == "from-p":
            rest = p
        elif in_place:
            rest = p
            rest -= q
            rest.clamp_(min=0.0)
        elif residual == "unclamped":
            rest = p - q
        else:
            rest = (p - q).clamp(min=0.0)
        token = draw(rest if residual == "unnormalised" else rest / rest.sum())
        return guess if kept else token

    return rule


def rule_with_one_hot_q(p, q, guess, u, draw):
    """Right, written differently: a certain guess as a one-hot q, and the ratio with a guard."""
    if q is None:
        q = torch.zeros_like(p)
        q[guess] = 1.0
    ratio = math.inf if q[guess] == 0 else float(p[guess] / q[guess])
    if u < min(1.0, ratio):
        return guess
    residual = torch.clamp(p - q, min=0.0)
    return draw(residual / residual.sum())


def rule_in_numpy(p, q, guess, u, draw):
    """Right, written differently: in numpy, the draw given a numpy array."""
    p = p.numpy()
    q = np.eye(len(p))[guess] if q is None else q.numpy()
    if u * q[guess] < p[guess]:
        return guess
    residual = np.maximum(p - q, 0.0)
    return draw(residual / residual.sum())


def check_mask_cases(allowed_tokens) -> None:
    for name in MASKS:
        check_mask(allowed_tokens, name)
    check_masks_are_new(allowed_tokens)
    for run in ENGINE_RUNS:
        check_engine_automaton(allowed_tokens, reference_walk, run)


def check_walk_cases(walk) -> None:
    for name in WALKS:
        check_walk(walk, name)
    for run in ENGINE_RUNS:
        check_engine_automaton(reference_allowed_tokens, walk, run)


def check_rule_cases(rule) -> None:
    for name in RULES:
        check_rule(rule, name)
    check_distribution(rule)
    for run in RULE_RUNS:
        check_engine_rule(rule, run)


def check_all_masks(allowed_tokens) -> None:
    check_mask_cases(allowed_tokens)
    check_drawn(sys.modules[__name__], masks=allowed_tokens)


def check_all_walks(walk) -> None:
    check_walk_cases(walk)
    check_drawn(sys.modules[__name__], walk=walk)


def check_all_rules(rule) -> None:
    check_rule_cases(rule)
    check_drawn(sys.modules[__name__], rule=rule)


CHECK_ALL = {"mask": check_all_masks, "walk": check_all_walks, "rule": check_all_rules}
CHECK_CASES = {"mask": check_mask_cases, "walk": check_walk_cases, "rule": check_rule_cases}
WRONG_MASKS = {  # name: (switches of written_out_mask, or a function; what the message must say)
    "allows-eos-everywhere": (dict(eos="always"), "EOS where the pattern may not end"),
    "never-allows-eos": (dict(eos="never"), "EOS is missing"),
    "allows-eos-only-where-no-byte-moves": (dict(eos="where-no-byte-moves"), "even though it has moves"),
    "leaves-the-special-tokens-allowed": (dict(specials=True), "special tokens are never part of a reply"),
    "gives-a-dead-state-the-starts-mask": (dict(dead="start"), "the start's mask"),
    "reads-a-dead-states-row-as-the-last-one": (dict(dead="last row"), "the LAST state's row"),
    "ascii-bytes-only": (dict(bytes_up_to=128), "bytes 128-255 are tokens too"),
    # caught by one check only, which names the situation first
    "returns-one-shared-array": (dict(shared=True), "two masks held at once"),
    "shifts-the-row-in-place": (shifts_the_row_in_place, "the start of (yes|no): a side effect"),
    "lists-the-allowed-tokens": (lists_the_allowed_tokens, "the start of (yes|no): return a mask"),
}
WRONG_WALKS = {
    "leaves-dead-by-the-last-row": (dict(sticky=False), "nothing leaves DEAD"),
    "reads-special-tokens-as-bytes": (dict(specials="wrap"), "a special token (256 and up) has no move"),
    "indexes-moves-with-eos": (dict(specials="index"), "a walk over EOS (258, a special token: no move)"),
    "wraps-bytes-above-127": (dict(seven_bits=True), "read as 7 bits"),
    "walks-the-decoded-text": (walk_the_text, "you walked the reply's text", "a walk over EOS"),
    "pops-the-tokens": (pops_the_tokens, "a reply the pattern allows, 'yes': a side effect"),
    "forgets-the-empty-reply": (forgets_the_empty_reply, "an empty reply, from the start: your code raised"),
    # right on every hand-built walk and engine run (none walks over PAD, 256, the first special token): the drawn
    # walks catch it
    "special-tokens-from-257": (dict(specials="past-pad"), "with an automaton of"),
}
DRAWN_ONLY = {"walk-special-tokens-from-257": "<pad>"}  # only the drawn inputs catch these; words in their failure
WRONG_RULES = {
    "accepts-always": (dict(keep="always"), "you kept the guess"),
    "accepts-only-where-p-beats-q": (dict(keep="p>=q"), "not only where p > q"),
    "accepts-with-probability-p": (dict(keep="u<p"), "always kept"),
    "resamples-from-p": (dict(residual="from-p"), "you drew from p itself"),
    "leaves-the-residual-unnormalised": (dict(residual="unnormalised"), "normalise the residual"),
    "leaves-the-residual-unclamped": (dict(residual="unclamped"), "clamp p - q at 0"),
    "redraws-a-certain-guess-from-p": (dict(certain="from-p"), "must not be drawn again"),
    "subtracts-in-place": (dict(in_place=True), "a side effect: you changed p"),
    "draws-before-deciding": (dict(draw_first=True), "a draw before deciding"),
    # caught by one check only, which names the situation first
    "divides-by-q": (dict(keep="divided"), "a guess the drafter gave no probability (q = 0 there): kept: your code"),
    "forgets-the-certain-guess": (dict(certain="crash"), "a certain guess (q is None, as prompt lookup's), u below"),
}
WRITTEN_OUT = {"mask": written_out_mask, "walk": walk_written_out, "rule": written_out_rule}
WRONG = {
    f"{kind}-{name}": (kind, *entry)
    for kind, wrongs in (("mask", WRONG_MASKS), ("walk", WRONG_WALKS), ("rule", WRONG_RULES))
    for name, entry in wrongs.items()
}
RIGHT = {
    "mask-written-out": ("mask", written_out_mask()),
    "mask-vectorised": ("mask", vectorised_mask),
    "mask-by-index": ("mask", mask_by_index),
    "walk-written-out": ("walk", walk_written_out()),
    "walk-stops-early": ("walk", walk_stops_early),
    "walk-by-reduce": ("walk", walk_by_reduce),
    "rule-written-out": ("rule", written_out_rule()),
    "rule-with-a-one-hot-q": ("rule", rule_with_one_hot_q),
    "rule-in-numpy": ("rule", rule_in_numpy),
}


@CHECKS
@pytest.mark.parametrize("name", RIGHT)
def test_a_correct_version_passes(name):
    kind, right = RIGHT[name]
    CHECK_ALL[kind](right)


@CHECKS
@pytest.mark.parametrize("name", WRONG)
def test_the_checks_catch_a_wrong_version_and_name_the_mistake(name):
    kind, wrong, hint, *first = WRONG[name]
    with pytest.raises(AssertionError, match=re.escape(hint)) as caught:
        CHECK_ALL[kind](wrong if callable(wrong) else WRITTEN_OUT[kind](**wrong))
    if callable(wrong):  # a student sees the first lines: the situation comes first
        assert str(caught.value).startswith(first[0] if first else hint), str(caught.value)


@CHECKS
@pytest.mark.parametrize("name", DRAWN_ONLY)
def test_the_drawn_inputs_catch_what_the_cases_miss(name):
    kind, wrong, *_ = WRONG[name]
    wrong = wrong if callable(wrong) else WRITTEN_OUT[kind](**wrong)
    CHECK_CASES[kind](wrong)  # every hand-built case and engine run passes it
    with pytest.raises(AssertionError) as caught:
        check_drawn(sys.modules[__name__], **{{"mask": "masks"}.get(kind, kind): wrong})
    assert DRAWN_ONLY[name] in str(caught.value).splitlines()[0], str(caught.value)


@CHECKS
@pytest.mark.parametrize("kind", CHECK_ALL)
def test_the_stub_is_rejected(kind):
    with pytest.raises(NotImplementedError):
        CHECK_ALL[kind](stub)
