"""Lesson 11 exercise: accept a verify row's guesses and roll back the rest. Check your work: pytest -m lesson11"""

from __future__ import annotations


def settle_row(draft: list[int], picks: list[int], cache, seat: int, computed: int) -> list[int]:
    """One verify row, after the forward. Return the tokens the reply gains, and cut the rejected guesses' KV.

    The row ran its last token (the one the reply ended with) and then the k guesses in `draft`, at positions
    `computed`, computed + 1, ..., computed + k, so the cache now holds computed + 1 + k tokens for `seat`.
    picks (k + 1 tokens): the model's own choice after each of them: picks[0] after the last token, picks[i]
    after draft[i - 1].

    1. Accept: keep the guesses from the start while each equals the model's pick at its place (draft[i] ==
       picks[i]); stop at the first one that does not (even if a later one matches). Then add the model's own
       pick at the place you stopped: after a miss it replaces the wrong guess, after all k it is one more, free.
       So the reply always gains at least 1 token and at most k + 1.
    2. Roll back: the keys and values of the rejected guesses are in the cache. Keep only the row's last token
       and the guesses you kept, with cache.truncate(seat, number of tokens to keep); the model's own pick is
       not in the cache yet (it runs next step, like any new token). When nothing was rejected, leave it.

    Example: draft [5, 6, 7], picks [5, 6, 9, 2]: gains [5, 6, 9]; the cache keeps computed + 3 tokens.
    k may be 0 (no guess: gains [picks[0]]); tokens are any ids, special ones (EOS, PAD) included, and may repeat
    (the same token guessed twice, the model picking a token it picked before): the place of the first miss is
    counted, not looked up by value. Cutting the cache to the length it already has is allowed. Leave draft and
    picks as they are (return a new list).
    """
    raise NotImplementedError("lesson 11: keep the guesses up to the first miss, add the model's pick, cut the rest")
