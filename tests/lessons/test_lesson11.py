"""Lesson 11: speculative decoding's acceptance rule and rollback. Run: pytest -m lesson11

Your settle_row keeps a verify row's guesses up to the first one the model disagrees with, adds the model's own
pick there, and cuts the rejected guesses' keys and values out of the cache. Checked on hand-made rows against a
cache that records what you cut, then inside the real engine (both caches, a draft that is right part of the
time), where every reply must equal the plain loop's token for token and the cache must hold exactly the kept
tokens after every step. The draft and picks lists you are given must come back as they were (the engine records
the guesses from them).

WRONG (below) lists the mistakes a room makes, each caught and named; RIGHT, versions written differently that
must pass.

Then the differential check (tests/lessons/drawn/lesson11.py): your settle_row against the reference on 150 drawn
rows (seeded: the same every run; MINILLM_CHECK_EXAMPLES=N draws N), the gain, the lists given and the cache's length
compared, the smallest row that differs shown first. Its strategies: 0 to 5 guesses, the model agreeing with the
first 0 to all of them, its later picks drawn again (a later guess may match after a miss), tokens from a small
alphabet with 0, 255, EOS and PAD among them (the same token guessed twice, a pick equal to an earlier pick), the row
at position 0, 1, 7 or 40 of seat 0 to 3. DRAWN_ONLY names the wrong versions only the drawn rows catch.
"""

from __future__ import annotations

import functools
import itertools

import pytest
import torch

from minillm.config import EngineConfig
from minillm.engine.request import Request
from minillm.engine.scheduler import ContinuousScheduler
from minillm.layers import LayeredEngine
from minillm.layers.speculate import settle_row as reference_settle_row
from tests.lessons.drawn.lesson11 import check_drawn
from tests.lessons.harness import CHECKS, expected_reply, first_difference, implementations, small_model, stub
from tests.lessons.harness import student_module as student

lesson = pytest.mark.lesson11  # your code's checks: pytest -m lesson11


@pytest.fixture(params=implementations(lesson))
def settle_row(request):
    return reference_settle_row if request.param == "reference" else student("lesson11_speculate").settle_row


class RecordingCache:
    """Stands for a KV cache: it holds `length` tokens for one seat and records every truncate."""

    def __init__(self, seat: int, length: int):
        self.seat, self.length, self.cuts = seat, length, []

    def truncate(self, seat: int, num_tokens: int) -> None:
        assert seat == self.seat, f"you truncated seat {seat}; the row's seat is {self.seat}"
        self.cuts.append(num_tokens)
        self.length = num_tokens

    def seat_tokens(self, seat: int) -> int:  # (what the real caches answer too)
        assert seat == self.seat, f"you asked for seat {seat}'s tokens; the row's seat is {self.seat}"
        return self.length


ROWS = {  # name: (draft, picks)
    "every guess right": ([5, 6, 7], [5, 6, 7, 8]),
    "the second guess wrong": ([5, 6, 7], [5, 9, 7, 8]),
    "the first guess wrong": ([5, 6, 7], [1, 6, 7, 8]),
    "a later guess right again after a miss": ([5, 6, 7, 4], [5, 9, 7, 4, 2]),
    "one guess, right": ([3], [3, 4]),
    "one guess, wrong": ([3], [8, 4]),
    "no guess at all": ([], [4]),
    "repeated guesses, the third wrong": ([4, 4, 4], [4, 4, 9, 1]),
}


def reference_gain(draft, picks):
    n = 0
    while n < len(draft) and draft[n] == picks[n]:
        n += 1
    return draft[:n] + [picks[n]]


def diagnose_gain(draft, picks, got) -> str:
    want = reference_gain(draft, picks)
    n = len(want) - 1
    if not isinstance(got, list) or not all(isinstance(t, int) for t in got):
        return f"return a list of token ids, got {got!r}"
    k = len(got) - 1
    if 0 <= k < n and got == draft[:k] + [picks[k]] and picks[k] == picks[n]:
        return (
            f"you stopped at place {k}, where the model first picked {picks[n]}, not at the miss (place {n}): "
            "picks.index(pick) finds a token's first place; count the places (enumerate, or a counter)"
        )
    if got == draft[: len(got)] and len(got) == n:
        return "you forgot the model's own token: after the guesses you keep, add picks[n], the model's pick there"
    if len(got) > len(want) and got[:n] == want[:n]:
        return (
            "you kept guesses after the first miss: a guess after a wrong one was made from a wrong prefix, so "
            "stop at the first guess that differs from the model's pick, even if a later one happens to match"
        )
    if got[:-1] == want[:-1] and got[-1] == picks[-1] != want[-1]:
        return "the model's own token is picks[n] (its pick where you stopped), not the last pick"
    k = len(got) - 1
    if n < len(draft) and k == draft.index(draft[n]) < n and got == draft[:k] + [picks[k]]:
        return (
            f"you stopped at guess {k}, where {draft[n]} was first guessed, not at the miss (guess {n}): "
            "draft.index(guess) finds a token's first place; count the places (enumerate, or a counter)"
        )
    if got and got[:n] != want[:n]:
        return (
            "compare each guess with the model's pick at the same place: draft[i] with picks[i] (picks[0] comes "
            "after the row's last token)"
        )
    return "the tokens differ from the rule"


def check_row(settle_row, name: str, computed: int = 10, seat: int = 2) -> None:
    draft, picks = ROWS[name]
    cache = RecordingCache(seat, computed + 1 + len(draft))
    given_draft, given_picks = list(draft), list(picks)
    got = settle_row(given_draft, given_picks, cache, seat, computed)
    want = reference_gain(draft, picks)
    why = diagnose_gain(draft, picks, got)
    assert got == want, f"{name}: draft {draft}, picks {picks}: you returned {got}, expected {want}.\n  {why}"
    for what, given, before in (("draft", given_draft, draft), ("picks", given_picks, picks)):
        assert given == before, (
            f"{name}: a side effect: settle_row changed the {what} list it was given, from {before} to {given}. The "
            "caller's lists are not yours to change (the engine records the row's guesses from the draft it passed): "
            "build the reply in a new list"
        )
    keep = computed + len(want)
    if len(want) == len(draft) + 1:
        assert not cache.cuts or cache.length == keep, (
            f"{name}: nothing was rejected, yet you cut the cache to {cache.length} tokens (it holds {keep}: all of "
            "them are right)"
        )
        return
    assert cache.cuts, (
        f"{name}: {len(draft) + 1 - len(want)} guess(es) were rejected but you left their keys and values in the "
        f"cache: call cache.truncate(seat, {keep}), or the next tokens would be written after wrong ones"
    )
    assert cache.length == keep, (
        f"{name}: the row started at position {computed} and the reply gains {len(want)} token(s); you kept "
        f"{cache.length} tokens in the cache, expected {keep} (the row's last token and the {len(want) - 1} guess(es) "
        f"kept: computed + len(gained); the model's own pick is not in the cache yet)"
        + (" : an off-by-one" if abs(cache.length - keep) == 1 else "")
    )


# --- inside the real engine --------------------------------------------------------------------------
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


def check_engine(settle_row, kv: str, k: int) -> None:
    model = small_model("gqa")
    cfg = EngineConfig(slots=3, kv=kv, block_size=4, max_len=model.cfg.max_seq_len, speculate=k)
    engine = LayeredEngine(model, ContinuousScheduler(), cfg, draft=noisy_draft())
    engine.speculation.settle_row = settle_row
    requests = [Request(f"r{i}", [257] + [(31 * i + 7 * j) % 256 for j in range(3 + i)], 12 + 5 * i,
                        arrival_step=i, ignore_eos=True) for i in range(5)]  # fmt: skip
    for r in requests:
        engine.submit(r)
    while engine.has_work():
        assert engine.step_no < 400, "the replies stopped growing: does every verify row gain at least one token?"
        engine.step()
        for r in engine.running():
            held = engine.cache.seat_tokens(r.seat)
            assert held == r.num_computed, (
                f"step {engine.step_no - 1}, {kv} cache: {r.id}'s seat holds {held} tokens, but {r.num_computed} "
                "are right: "
                + (
                    "rejected guesses' keys and values were kept"
                    if held > r.num_computed
                    else "you cut tokens that were kept"
                )  # fmt: skip
            )
    for r in requests:
        want = expected_reply(model, tuple(r.prompt_ids), r.max_new_tokens, r.ignore_eos)
        assert r.output_ids == want, f"{r.id} with k = {k}: {first_difference(want, r.output_ids)}"
    trace = engine.trace()
    kept = sum(trace.request(r.id).drafts_accepted for r in requests)
    assert kept < sum(trace.request(r.id).drafts_verified for r in requests)  # (misses happened)


def check_drawn_rows(settle_row) -> None:
    check_drawn(settle_row, RecordingCache, diagnose_gain)


def check_cases(settle_row) -> None:
    for name in ROWS:
        check_row(settle_row, name)
    for kv in ("paged", "contiguous"):
        check_engine(settle_row, kv, 3)


def check_all(settle_row) -> None:
    check_cases(settle_row)
    check_drawn_rows(settle_row)


@pytest.mark.parametrize("name", ROWS)
def test_a_verify_row_is_settled_by_the_rule(settle_row, name):
    check_row(settle_row, name)


@pytest.mark.parametrize("kv", ["paged", "contiguous"])
@pytest.mark.parametrize("k", [1, 4])
def test_the_real_engine_stays_token_exact_and_keeps_only_the_kept_tokens(settle_row, kv, k):
    check_engine(settle_row, kv, k)


def test_a_verify_row_is_settled_as_the_reference_on_drawn_rows(settle_row):
    check_drawn_rows(settle_row)


# --- the checks catch plausible mistakes ----------------------------------------------------------
def written_out(past_first_miss=False, bonus=True, last_pick=False, shift=0, truncate=True, compare_ahead=False):
    """A settle_row written out, with switches for the mistakes below."""

    def settle(draft, picks, cache, seat, computed):
        offset = 1 if compare_ahead else 0
        if past_first_miss:
            kept = [d for i, d in enumerate(draft) if d == picks[i]]
            n = len(kept)
        else:
            n = 0
            while n < len(draft) and n + offset < len(picks) and draft[n] == picks[n + offset]:
                n += 1
            kept = draft[:n]
        gained = kept + ([picks[-1] if last_pick else picks[n]] if bonus else [])
        if truncate and n < len(draft):
            cache.truncate(seat, computed + n + 1 + shift)
        return gained

    return settle


def cuts_the_draft_in_place(draft, picks, cache, seat, computed):
    """Wrong: the reply is right, but it is the caller's draft list, cut and extended."""
    n = 0
    while n < len(draft) and draft[n] == picks[n]:
        n += 1
    rejected = len(draft) - n
    del draft[n:]
    draft.append(picks[n])
    if rejected:
        cache.truncate(seat, computed + len(draft))
    return draft


def finds_the_miss_with_picks_index(draft, picks, cache, seat, computed):
    """Wrong: picks.index(pick) is the first place the model picked that token, not the place of the miss."""
    n = len(draft)
    for guess, pick in zip(draft, picks):
        if guess != pick:
            n = picks.index(pick)
            break
    if n < len(draft):
        cache.truncate(seat, computed + n + 1)
    return draft[:n] + [picks[n]]


def finds_the_miss_with_index(draft, picks, cache, seat, computed):
    """Wrong: draft.index(guess) is the first place that token was guessed, not the place of the miss."""
    n = len(draft)
    for guess, pick in zip(draft, picks):
        if guess != pick:
            n = draft.index(guess)
            break
    if n < len(draft):
        cache.truncate(seat, computed + n + 1)
    return draft[:n] + [picks[n]]


def slices_the_picks(draft, picks, cache, seat, computed):
    """Right, written differently: a kept guess equals the model's pick there, so the gain is a slice of picks."""
    n = next((i for i, (guess, pick) in enumerate(zip(draft, picks)) if guess != pick), len(draft))
    if n < len(draft):
        cache.truncate(seat, computed + n + 1)
    return picks[: n + 1]


def for_else(draft, picks, cache, seat, computed):
    """Right, written differently: a for loop that breaks at the miss, else one more token free."""
    gained = []
    for guess, pick in zip(draft, picks):
        if guess != pick:
            gained.append(pick)
            break
        gained.append(guess)
    else:
        gained.append(picks[len(draft)])
    cache.truncate(seat, computed + len(gained))  # (nothing rejected: the length it has, a cut of nothing)
    return gained


def counts_back_from_the_cache(draft, picks, cache, seat, computed):
    """Right, written differently: the rejected guesses counted, and cut from the cache's own length."""
    kept = list(itertools.takewhile(lambda pair: pair[0] == pair[1], zip(draft, picks)))
    rejected = len(draft) - len(kept)
    if rejected:
        cache.truncate(seat, cache.seat_tokens(seat) - rejected)
    return [guess for guess, _ in kept] + [picks[len(kept)]]


WRONG = {
    "accepts-past-the-first-miss": (dict(past_first_miss=True), "after the first miss"),
    "forgets-the-models-own-token": (dict(bonus=False), "forgot the model's own token"),
    "takes-the-last-pick-as-its-own-token": (dict(last_pick=True), "not the last pick"),
    "compares-each-guess-with-the-next-pick": (dict(compare_ahead=True), "at the same place"),
    "keeps-one-token-too-many": (dict(shift=1), "off-by-one"),
    "keeps-one-token-too-few": (dict(shift=-1), "off-by-one"),
    "keeps-the-rejected-kv": (dict(truncate=False), "left their keys and values"),
    # caught by one check only, which names the situation first
    "cuts-the-draft-in-place": (cuts_the_draft_in_place, "every guess right: a side effect"),
    "finds-the-miss-with-index": (finds_the_miss_with_index, "repeated guesses, the third wrong"),
    # right on every hand-built row and engine run (no miss there is a token the model picked earlier in the row);
    # the drawn rows catch it
    "finds-the-miss-with-picks-index": (finds_the_miss_with_picks_index, "with draft"),
}
DRAWN_ONLY = ["finds-the-miss-with-picks-index"]  # only the drawn rows catch these
RIGHT = {
    "written-out": written_out(),
    "slices-the-picks": slices_the_picks,
    "for-else-and-a-cut-of-nothing": for_else,
    "counts-back-from-the-caches-length": counts_back_from_the_cache,
}


@CHECKS
@pytest.mark.parametrize("right", RIGHT.values(), ids=RIGHT.keys())
def test_a_correct_version_passes(right):
    check_all(right)


@CHECKS
@pytest.mark.parametrize("name", WRONG)
def test_the_checks_catch_a_wrong_settle_and_name_the_mistake(name):
    wrong, hint = WRONG[name]
    with pytest.raises(AssertionError, match=hint) as caught:
        check_all(wrong if callable(wrong) else written_out(**wrong))
    if callable(wrong):  # a student sees the first lines: the situation comes first
        assert str(caught.value).startswith(hint), str(caught.value)


@CHECKS
@pytest.mark.parametrize("name", DRAWN_ONLY)
def test_the_drawn_rows_catch_what_the_cases_miss(name):
    wrong, _ = WRONG[name]
    check_cases(wrong)  # every hand-built row and engine run passes it
    with pytest.raises(AssertionError, match="picks.index"):
        check_drawn_rows(wrong)


@CHECKS
def test_the_stub_is_rejected():
    with pytest.raises(NotImplementedError):
        check_all(stub)
