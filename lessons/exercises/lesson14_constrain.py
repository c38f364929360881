"""Lesson 14 exercise: an automaton's mask and walk, and the rejection rule. Check your work: pytest -m lesson14"""

from __future__ import annotations

DEAD = -1  # "no move": the state of a reply that left its pattern (minillm.grammar.automaton.DEAD)


def allowed_tokens(moves, accepting, state: int, vocab_size: int, eos: int):
    """1. The mask of one state: which tokens the reply may take next. Return a numpy bool array (vocab_size,).

    moves (S, 256) numpy int array: moves[s, b] is the state byte b leads to from state s, or DEAD where the
    pattern does not allow b there. accepting (S,) numpy bool: where the pattern may end. state: 0..S-1, or DEAD.

    True for each byte b (0..255) with a move from `state`, and for EOS (the token `eos`) where the state accepts
    (the reply may end here, even if it could also go on); False for every other token: the other special tokens
    (256 and up: PAD, BOS, SEP) are never part of a reply. A DEAD state allows nothing. Return a new array each
    call (the engine keeps each state's mask), and leave `moves` and `accepting` as they are.

    Example, (yes|no): the start allows b"n" and b"y"; after "no" only EOS; after "n" only b"o".
    """
    raise NotImplementedError("lesson 14: a state's mask: its bytes with a move, and EOS where it accepts")


def walk(moves, state: int, tokens: list[int]) -> int:
    """2. Where `tokens` lead from `state`: follow moves[state, token] token by token, and return the state (an int).

    A token without a move from where the walk stands leads to DEAD, and the walk stays DEAD: nothing leaves it
    (careful: moves[DEAD] is moves[-1], the last state's row). A token is a byte (0..255) or a special token
    (256 and up: PAD 256, BOS, EOS, SEP): a special token has no move (EOS ends a reply; it does not move the
    automaton), and leads to DEAD.
    No tokens: the walk stays where it started. Leave `tokens` and `moves` as they are.

    Example, (yes|no): walk(moves, 0, list(b"no")) is the state after "no" (it accepts); list(b"nx") gives DEAD.
    """
    raise NotImplementedError("lesson 14: follow the moves byte by byte; a byte without one leads to DEAD, for good")


def keep_or_resample(p, q, guess: int, u: float, draw) -> int:
    """3. The rejection rule at one guessed position of a sampled reply: keep the guess, or replace it. Return a token.

    p (V,) float64 torch tensor: the model's distribution here. q (V,): the drafter's, which `guess` was drawn
    from; or None: a certain guess (prompt lookup's), as if q were 1 on the guess and 0 elsewhere.
    u: a number drawn uniformly from [0, 1) for this position. draw(dist): a token drawn from `dist` (V,),
    whose weights must be >= 0 and sum to 1.

    1. Keep the guess with probability min(1, p[guess] / q[guess]): when u is below it. A guess the model likes
       at least as much as the drafter is always kept (q[guess] = 0 included: write u * q < p, not a division).
       Where u is exactly p/q (to rounding), keeping and rejecting are both right.
    2. Else return draw(residual): the residual is max(0, p - q), normalised to sum to 1 (for a certain guess:
       p with the guess's probability set to 0, normalised). Draw only after a rejection.
    Then the tokens kept or drawn are distributed exactly as p. Leave p and q as they are (in-place operations
    on them change the caller's tensors: work on new ones).

    Example: p = [0.5, 0.3, 0.2], q = [0.2, 0.6, 0.2], guess 1, u = 0.7: p/q = 0.5 and u >= 0.5, so rejected; the
    residual max(0, p - q) = [0.3, 0, 0], normalised [1, 0, 0]: return draw(tensor([1., 0., 0.])) (token 0).
    """
    raise NotImplementedError("lesson 14: keep the guess with probability min(1, p/q), else draw from the residual")
