"""Lesson 14's differential checks: your mask, walk and rule against the reference on drawn automata and draws.

- allowed_tokens: automata of 1 to 5 states, each byte's move DEAD or a state (state 0 and the last one included),
  the bytes 0, 127, 128 and 255 given moves on purpose, states that accept or not (one with EOS as its only choice:
  no byte moves, accepting); every state, and DEAD;
- walk: the same automata, from any state or DEAD, 0 to 8 tokens: bytes with a move, bytes without, the bytes 0, 127,
  128, 255 (which always move, so that the walk reaches what follows alive), and every special token (PAD 256, BOS,
  EOS, SEP);
- keep_or_resample: vocabularies of 2 to 6 tokens, p and q from whole weights (zeros, and p equal to q at places or
  everywhere), q None (a certain guess), the guess where q gives it probability (q = 0 there, once p does not),
  u = 0, u exactly p/q (a tie: kept or not, both are right), just below and above it, or anywhere in [0, 1).
"""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st

from minillm.grammar.automaton import DEAD, Dfa
from minillm.layers import sampling
from minillm.model.tokenizer import BOS, EOS, PAD, SEP, VOCAB_SIZE
from tests.lessons.differential import against_reference
from tests.lessons.harness import case

EDGE_BYTES = [0, 127, 128, 255]


@st.composite
def automata(draw):
    states, seed = draw(st.integers(1, 5)), draw(st.integers(0, 999))
    rng = np.random.default_rng(seed)
    moves = np.where(rng.random((states, 256)) < draw(st.sampled_from([0.05, 0.3, 0.9])),
                     rng.integers(0, states, (states, 256)), DEAD).astype(np.int64)  # fmt: skip
    moves[:, EDGE_BYTES] = rng.integers(0, states, (states, len(EDGE_BYTES)))
    accepting = rng.random(states) < 0.5
    if draw(st.booleans()):  # a state whose only choice is EOS
        last = states - 1
        moves[last], accepting[last] = DEAD, True
    return moves, accepting


def shown(moves, accepting) -> str:
    rows = []
    for s in range(len(moves)):
        bytes_ = np.flatnonzero(moves[s] != DEAD)
        where = f"{len(bytes_)} bytes move ({', '.join(map(str, bytes_[:6]))}{', ...' if len(bytes_) > 6 else ''})"
        rows.append(f"state {s}: {where}{', accepts' if accepting[s] else ''}")
    return "; ".join(rows)


def compare_mask(allowed_tokens, labels):
    def run(drawn):
        (moves, accepting), pick = drawn
        state = DEAD if pick is None else pick % len(moves)
        given_moves, given_accepting = moves.copy(), accepting.copy()
        setting = f"with an automaton of {len(moves)} state(s) ({shown(moves, accepting)}), state {state}"
        with case(setting):
            got = allowed_tokens(given_moves, given_accepting, state, VOCAB_SIZE, EOS)
        got = got.cpu().numpy() if isinstance(got, torch.Tensor) else np.asarray(got)
        want = Dfa(moves, accepting).allowed(state)
        assert got.shape == want.shape and got.dtype == bool, (
            f"{setting}: return a numpy bool array of shape ({VOCAB_SIZE},); you returned {got.shape}, {got.dtype}"
        )
        assert np.array_equal(got, want), (
            f"{setting}: you allowed {labels(np.flatnonzero(got))}; the reference allows {labels(np.flatnonzero(want))}"
        )
        assert np.array_equal(given_moves, moves) and np.array_equal(given_accepting, accepting), (
            f"{setting}: a side effect: allowed_tokens changed the automaton's arrays"
        )

    return run


@st.composite
def walks(draw):
    moves, accepting = draw(automata())
    start = draw(st.one_of(st.none(), st.integers(0, len(moves) - 1)))
    specials, edges = st.sampled_from([PAD, BOS, EOS, SEP]), st.sampled_from(EDGE_BYTES)  # (edges always move)
    tokens = draw(st.lists(st.one_of(specials, edges, st.integers(0, 255)), max_size=8))
    return moves, DEAD if start is None else start, tokens


def compare_walk(walk, in_order):
    def run(drawn):
        moves, start, tokens = drawn
        given_moves, given_tokens = moves.copy(), list(tokens)
        setting = f"with an automaton of {len(moves)} state(s), walk from {start} over {in_order(tokens)}"
        with case(setting):
            got = walk(given_moves, start, given_tokens)
        want = Dfa(moves, np.zeros(len(moves), dtype=bool)).walk(start, tokens)
        assert isinstance(got, int | np.integer) and not isinstance(got, bool), (
            f"{setting}: return the state as an int; you returned {got!r}"
        )
        steps = [start]
        for token in tokens:
            steps.append(Dfa(moves, np.zeros(len(moves), dtype=bool)).step(steps[-1], token))
        assert got == want, f"{setting}: you returned {got}; the reference {want} (its states on the way: {steps})"
        assert given_tokens == tokens and np.array_equal(given_moves, moves), (
            f"{setting}: a side effect: walk changed the tokens or the moves it was given"
        )

    return run


@st.composite
def rules(draw):
    V = draw(st.integers(2, 6))
    weights = lambda: draw(st.lists(st.integers(0, 4), min_size=V, max_size=V).filter(any))  # noqa: E731
    p = torch.tensor(weights(), dtype=torch.float64)
    p /= p.sum()
    kind = draw(st.sampled_from(["sampled", "sampled", "certain", "equal", "q-zero"]))
    q = None if kind == "certain" else p.clone() if kind == "equal" else torch.tensor(weights(), dtype=torch.float64)
    if q is not None and kind != "equal":
        q /= q.sum()
    places = [i for i in range(V) if q is None or q[i] > 0]  # a guess drawn from q
    if kind == "q-zero":
        places = [i for i in range(V) if q[i] == 0 and p[i] > 0] or places
    if kind == "equal":
        places = [i for i in range(V) if p[i] > 0]
    guess = draw(st.sampled_from(places))
    q_guess = 1.0 if q is None else float(q[guess])
    boundary = min(1.0, float(p[guess]) / q_guess) if q_guess else 1.0
    u = draw(st.sampled_from([0.0, boundary, boundary - 1e-9, boundary + 1e-9, draw(st.floats(0, 0.999))]))
    return p, q, guess, min(max(u, 0.0), 0.999999)


def compare_rule(rule, Draw):
    def run(drawn):
        p, q, guess, u = drawn
        given_p, given_q = p.clone(), None if q is None else q.clone()
        show = lambda t: "None" if t is None else [round(x, 4) for x in t.tolist()]  # noqa: E731
        setting = f"with p = {show(p)}, q = {show(q)}, guess {guess}, u = {u!r}"
        draw = Draw(len(p))
        with case(setting):
            got = rule(given_p, given_q, guess, u, draw)
        q_guess, p_guess = 1.0 if q is None else float(q[guess]), float(p[guess])
        tie = abs(u * q_guess - p_guess) <= 1e-12  # u exactly p/q: kept or not, both are right
        kept = u * q_guess < p_guess
        assert isinstance(got, int | np.integer) and not isinstance(got, bool), f"{setting}: return a token, an int"
        if not draw.given:
            assert kept or tie, (
                f"{setting}: you kept the guess; it is kept when u is below min(1, p/q) = "
                f"{min(1.0, p_guess / q_guess) if q_guess else 1.0:.6g}: here it is rejected and replaced by a draw"
            )
            assert got == guess, f"{setting}: you returned {got} without calling draw: a kept guess is returned"
        else:
            assert not kept or tie, (
                f"{setting}: you called draw, but the guess is kept (u is below min(1, p/q)): draw only after a "
                "rejection"
            )
            assert len(draw.given) == 1, f"{setting}: you called draw {len(draw.given)} times; once replaces a guess"
            want = sampling.rejection_rule(p, q, guess, 1.0, lambda dist: dist)  # (u = 1: rejected) the residual
            assert torch.allclose(draw.given[0], want, atol=1e-9), (
                f"{setting}: you gave draw {show(draw.given[0])}; the reference's residual is {show(want)}"
            )
            drawn_token = Draw(len(p))(draw.given[0])
            assert got == drawn_token, f"{setting}: return the token draw gave you ({drawn_token}); you returned {got}"
        for what, given, before in (("p", given_p, p), ("q", given_q, q)):
            assert given is None or torch.equal(given, before), f"{setting}: a side effect: you changed {what}"

    return run


def check_drawn(lesson, masks=None, walk=None, rule=None, examples: int = 50) -> None:
    """`lesson`: the test module (its labels and its Draw). Each part given is checked."""
    if masks is not None:
        states = st.tuples(automata(), st.one_of(st.none(), st.integers(0, 4)))
        against_reference("allowed_tokens", states, compare_mask(masks, lesson.labels), examples)
    if walk is not None:
        against_reference("walk", walks(), compare_walk(walk, lesson.in_order), examples)
    if rule is not None:
        against_reference("keep_or_resample", rules(), compare_rule(rule, lesson.Draw), examples + 10)
