"""Lesson 11's differential check: your settle_row against the reference on drawn verify rows.

A drawn row: 0 to 5 guesses, the model agreeing with the first 0 to all of them (every guess right, the first wrong,
the last wrong...), its later picks drawn again (so a later guess may match after a miss), the tokens from a small
alphabet so that guesses and picks repeat (the same token guessed twice, a pick equal to an earlier pick), with the
byte range's ends and the special tokens among them (0, 255, EOS, PAD); the row starting at position 0 to 40 of
seat 0 to 3.
"""

from __future__ import annotations

from hypothesis import strategies as st

from minillm.layers.speculate import settle_row as reference_settle_row
from minillm.model.tokenizer import EOS, PAD
from tests.lessons.differential import against_reference, plural
from tests.lessons.harness import case

TOKENS = [4, 5, 0, 255, EOS, PAD]


@st.composite
def rows(draw):
    k = draw(st.integers(0, 5))
    draft = draw(st.lists(st.sampled_from(TOKENS), min_size=k, max_size=k))
    agree = draw(st.integers(0, k))  # the model agrees with the first `agree` guesses
    later = draw(st.lists(st.sampled_from(TOKENS), min_size=k + 1 - agree, max_size=k + 1 - agree))
    if agree < k and later[0] == draft[agree]:  # the first pick after them is a miss
        later[0] = next(t for t in TOKENS if t != draft[agree])
    picks = draft[:agree] + later
    return draft, picks, draw(st.integers(0, 3)), draw(st.sampled_from([0, 1, 7, 40]))


def compare(settle_row, RecordingCache, diagnose_gain):
    def run(drawn):
        draft, picks, seat, computed = drawn
        cache = RecordingCache(seat, computed + 1 + len(draft))
        given_draft, given_picks = list(draft), list(picks)
        setting = f"with draft {draft} and picks {picks} (the row at position {computed}, seat {seat})"
        with case(setting):
            got = settle_row(given_draft, given_picks, cache, seat, computed)
        want = reference_settle_row(list(draft), list(picks), RecordingCache(seat, computed + 1 + len(draft)), seat,
                                    computed)  # fmt: skip
        if got != want:
            raise AssertionError(f"{setting}, you returned {got}; the reference gains {want}\n  "
                                 f"{diagnose_gain(draft, picks, got)}")  # fmt: skip
        assert (given_draft, given_picks) == (draft, picks), (
            f"{setting}: a side effect: settle_row changed the draft or picks list it was given: build the reply in "
            "a new list"
        )
        keep = computed + len(want)
        rejected = len(draft) + 1 - len(want)
        assert cache.length == keep, (
            f"{setting}, the cache keeps {plural(cache.length, 'token')}; the reference keeps {keep} (computed + the "
            f"{len(want)} gained: the row's last token and the kept guesses; {plural(rejected, 'guess', 'guesses')} "
            "rejected)"
        )

    return run


def check_drawn(settle_row, RecordingCache, diagnose_gain, examples: int = 150) -> None:
    against_reference("settle_row", rows(), compare(settle_row, RecordingCache, diagnose_gain), examples)
