"""Lesson 01: one decode loop for several users. Run: pytest -m lesson01

Your generate_batch must give every row exactly the reply the plain one-prompt loop gives (token for
token), with ONE model call per step for all unfinished rows, and no call once every row is done.

WRONG (below) lists the mistakes a room makes, each caught with its hint first; CORRECT, loops written
differently that must pass.
"""

from __future__ import annotations

import functools

import pytest
import torch

from minillm.engine.generate import generate
from minillm.model.tokenizer import EOS, PAD, decode, encode_prompt, token_str
from tests.lessons.harness import CHECKS, implementations, shipped_model, small_model, stub, student_module

lesson = pytest.mark.lesson01  # your code's checks: pytest -m lesson01


# --- the loop written out, with switches for the mistakes students make --------------------------
def make_batch_loop(
    pad="right", read="last-real", stop="per-row", keep_eos=False, extra=0, until_budget=False, limit="reply",
    by_prompt=False, compact=False, old_index=False,
):  # fmt: skip
    """A batched greedy loop. The defaults are right; each switch is one plausible mistake (see WRONG), except
    compact=True: finished rows leave the rectangle (right too, written differently)."""

    @torch.no_grad()
    def generate_batch(model, prompts, max_new_tokens):
        rows, replies = [list(p) for p in prompts], [[] for _ in prompts]
        if by_prompt:  # each reply found by its prompt (wrong: two users may send the same prompt)
            mine = {tuple(p): [] for p in prompts}
            replies = [mine[tuple(p)] for p in prompts]
        done = [False] * len(prompts)
        for _ in range(max_new_tokens + extra):
            if all(done) and not until_budget:
                break
            active = [b for b in range(len(rows)) if not done[b]] if compact or old_index else list(range(len(rows)))
            width = max(len(rows[b]) for b in active) if active else max(len(row) for row in rows)
            fill = {b: [PAD] * (width - len(rows[b])) for b in active}
            batch = [rows[b] + fill[b] if pad == "right" else fill[b] + rows[b] for b in active]
            logits = model(torch.tensor(batch))  # (B, T, vocab): the rows in `active`, in that order
            for i, b in enumerate(active):
                if done[b]:
                    continue
                row = rows[b]
                at = len(row) - 1 if read == "last-real" and pad == "right" else -1
                token = logits[b if old_index else i, at].argmax().item()  # old_index: the row's place before (wrong)
                if token == EOS:
                    if keep_eos:
                        replies[b].append(token)
                    done[b] = True
                    if stop == "all-rows":
                        done = [True] * len(rows)
                    continue
                replies[b].append(token)
                row.append(token)
                cap = max_new_tokens + extra if limit == "reply" else max_new_tokens - len(prompts[b])
                done[b] = done[b] or len(replies[b]) >= cap  # limit="sequence": the prompt counted in (wrong)
        return replies

    return generate_batch


def one_at_a_time(model, prompts, max_new_tokens):
    """Right tokens, but every user's loop runs on its own: no batching at all."""
    return [generate(model, list(p), max_new_tokens, use_cache=False).tokens for p in prompts]


reference = make_batch_loop()

# Each wrong version, and what it implies: the hint shown when your replies equal that version's.
WRONG = {
    "pads-on-the-left": (
        make_batch_loop(pad="left"),
        "padding on the LEFT shifts a shorter prompt's positions and lets it attend to the PADs before it "
        "(there is no attention mask): pad on the right, where causal attention never looks",
    ),
    "reads-the-padded-end": (
        make_batch_loop(read="end"),
        "a shorter row's scores were read at index -1, which is a PAD position: read row b at len(row b) - 1",
    ),
    "stops-every-row-at-the-first-eos": (
        make_batch_loop(stop="all-rows"),
        "when one row said EOS, every row stopped: each row stops on its own, the others carry on",
    ),
    "keeps-the-eos": (
        make_batch_loop(keep_eos=True),
        f"the replies end with EOS ({EOS}): stop a row when EOS comes, without appending it",
    ),
    "one-token-too-many": (
        make_batch_loop(extra=1),
        "a row cut by the limit got max_new_tokens + 1 tokens: stop at max_new_tokens",
    ),
    "runs-to-the-budget": (
        make_batch_loop(until_budget=True),
        "the model ran for max_new_tokens steps although every row had finished earlier: stop when all are done",
    ),
    "one-prompt-at-a-time": (
        one_at_a_time,
        "each prompt ran its own loop: stack the unfinished rows into ONE (B, T) call per step",
    ),
    "counts-the-prompt-in-the-limit": (
        make_batch_loop(limit="sequence"),
        "a row stopped before max_new_tokens NEW tokens: the limit counts the reply only, not the prompt",
    ),
    "finds-a-reply-by-its-prompt": (
        make_batch_loop(by_prompt=True),
        "two users sent the same prompt and their replies got mixed: keep one reply per ROW (its index), "
        "not one per prompt text",
    ),
    "drops-finished-rows-but-reads-by-the-old-index": (
        make_batch_loop(old_index=True),
        "once a row finished and left the rectangle, the rows after it moved up one place, but you read the "
        "scores at each row's old index: read the logits at the row's place in THIS step's rectangle",
    ),
}
CORRECT = {  # right, written differently: the checks must pass them
    "keeps-finished-rows-in-the-rectangle": reference,
    "drops-finished-rows-from-the-rectangle": make_batch_loop(compact=True),
}


@pytest.fixture(params=implementations(lesson))
def generate_batch(request):
    if request.param == "reference":
        return reference
    return student_module("lesson01_generate").generate_batch


# --- the checks --------------------------------------------------------------------------------
class CountingModel:
    """The model, recording the shape of every call."""

    def __init__(self, model):
        self.model, self.calls = model, []

    def __call__(self, tokens, *args, **kwargs):
        self.calls.append(tuple(tokens.shape))
        return self.model(tokens, *args, **kwargs)

    forward = __call__

    def __getattr__(self, name):
        return getattr(self.model, name)


@functools.cache
def expected_replies(model, prompts: tuple[tuple[int, ...], ...], max_new_tokens: int):
    """The plain one-prompt loop's reply and stop reason for each prompt (memoized)."""
    return [generate(model, list(p), max_new_tokens, use_cache=False) for p in prompts]


def as_replies(got, count: int) -> list[list[int]]:
    assert isinstance(got, (list, tuple)), f"return a list of replies (lists of token ids), got {type(got).__name__}"
    assert len(got) == count, f"{count} prompts need {count} replies, you returned {len(got)}"
    replies = []
    for reply in got:
        if isinstance(reply, torch.Tensor):
            reply = reply.flatten().tolist()
        assert isinstance(reply, (list, tuple)), f"each reply must be a list of token ids, got {type(reply).__name__}"
        replies.append([int(t) for t in reply])
    return replies


def show(tokens: list[int]) -> str:
    return " ".join(repr(token_str(t)) for t in tokens)


def diagnose(model, prompts, max_new_tokens, got: list[list[int]], expected) -> str:
    """What is wrong, starting with the first differing token of the first wrong row."""
    b = next(i for i, (g, e) in enumerate(zip(got, expected)) if g != e.tokens)
    want, mine, prompt = expected[b].tokens, got[b], prompts[b]
    longest = max(len(p) for p in prompts)
    row = f"row {b} ({decode(prompt)!r}, a prompt of {len(prompt)} tokens; the longest is {longest})"
    lines = []
    k = next((i for i, (w, g) in enumerate(zip(want, mine)) if w != g), None)
    if k is not None:
        agree = f"; the {k} before agree" if k else ""
        lines.append(
            f"{row}: first difference at reply token {k}: expected {want[k]} ({token_str(want[k])!r}), "
            f"got {mine[k]} ({token_str(mine[k])!r}){agree}"
        )
        if k == 0 and len(prompt) < longest:
            lines.append(
                "its very first token is already wrong, and it is shorter than the longest prompt: what did "
                "the model see, and where did you read its scores? (padding, and index len(row) - 1)"
            )
        elif k == 0:
            lines.append(
                "its very first token is already wrong: is it the argmax of the scores at the row's last real token?"
            )
        else:
            lines.append(
                "the first tokens agree, so the start is right: what changes for this row after a few "
                "steps? (rows grow, and other rows finish)"
            )
    elif len(mine) > len(want):
        if expected[b].finish_reason == "eos":
            went_on = show(mine[len(want) :])
            lines.append(f"{row}: the model said EOS after {len(want)} tokens; you went on with {went_on}: stop there")
        else:
            lines.append(f"{row}: {len(mine)} tokens, but max_new_tokens is {max_new_tokens}")
    else:
        lines.append(
            f"{row}: your reply stops after {len(mine)} tokens, the right one has {len(want)} "
            f"(it ends on {expected[b].finish_reason}); the {len(mine)} you have are right"
        )
    lines.append(f"expected {want}  ({decode(want)!r})")
    lines.append(f"got      {mine}  ({decode(mine)!r})")
    for name, (_, implies) in WRONG.items():
        if wrong_replies(name, model, tuple(map(tuple, prompts)), max_new_tokens) == got:
            return f"hint: {implies}\n  " + "\n  ".join(lines)  # the likely mistake first
    return "\n  ".join(lines)


@functools.cache
def wrong_replies(name: str, model, prompts: tuple[tuple[int, ...], ...], max_new_tokens: int) -> list[list[int]]:
    return WRONG[name][0](model, [list(p) for p in prompts], max_new_tokens)


def check_batch(generate_batch, model, texts_or_ids, max_new_tokens: int, label: str) -> None:
    prompts = [encode_prompt(p) if isinstance(p, str) else list(p) for p in texts_or_ids]
    given = [list(p) for p in prompts]
    counting = CountingModel(model)
    got = as_replies(generate_batch(counting, given, max_new_tokens), len(prompts))
    assert given == prompts, "generate_batch changed the prompt lists it was given: build new lists instead"
    expected = expected_replies(model, tuple(map(tuple, prompts)), max_new_tokens)
    if got != [e.tokens for e in expected]:
        why = diagnose(model, prompts, max_new_tokens, got, expected)
        if why.startswith("hint:"):  # the hint leads, then the case
            hint, rest = why.split("\n", 1)
            raise AssertionError(f"{hint}\n{label}, max_new_tokens={max_new_tokens}:\n{rest}")
        raise AssertionError(f"{label}, max_new_tokens={max_new_tokens}:\n  {why}")
    steps = max(len(e.tokens) + (e.finish_reason == "eos") for e in expected)  # an EOS takes a step too
    calls = counting.calls
    assert len(calls) <= steps, (
        f"{label}: every row had finished after {steps} steps, but the model was called {len(calls)} times "
        f"(batch sizes {[c[0] for c in calls][:12]}...): call the model once per step for all unfinished rows, "
        "and stop when every row is done"
    )


def check_shipped_model(generate_batch) -> None:
    # prompts of 9, 20, 10 and 19 tokens; replies end on EOS after 5, 8 and 9 tokens, or on the limit (12)
    prompts = ["spell 7", "count down from 40", "spell 42", "count down from 5"]
    check_batch(generate_batch, shipped_model(), prompts, 12, "shipped model, four prompts")
    check_batch(generate_batch, shipped_model(), ["spell 31", "count down from 9"], 1, "one token each")
    check_batch(generate_batch, shipped_model(), ["count down from 3"], 12, "a batch of one")
    # two users with the same prompt, and a row that finishes early between longer ones
    same = ["count down from 9", "spell 42", "count down from 9", "count down from 20"]
    check_batch(generate_batch, shipped_model(), same, 16, "two users, the same prompt")


def check_random_model(generate_batch) -> None:
    prompts = [[257, 1, 2, 3], [257, *b"hello"], [257], [257, *b"a longer prompt"]]
    check_batch(generate_batch, small_model("gqa"), prompts, 6, "random model, four prompts")


def check_all(generate_batch) -> None:
    check_shipped_model(generate_batch)
    check_random_model(generate_batch)


def test_replies_equal_the_one_prompt_loop_on_the_shipped_model(generate_batch):
    check_shipped_model(generate_batch)


def test_replies_equal_the_one_prompt_loop_on_a_random_model(generate_batch):
    check_random_model(generate_batch)


# --- the checks catch plausible mistakes --------------------------------------------------------
@CHECKS
def test_the_right_padding_is_exact():
    """The lesson's claim: padding on the right leaves each row's logits at its real tokens unchanged."""
    model = shipped_model()
    prompts = [encode_prompt("spell 7"), encode_prompt("count down from 12")]
    width = max(map(len, prompts))
    with torch.no_grad():
        batch = model(torch.tensor([p + [PAD] * (width - len(p)) for p in prompts]))  # (2, T, V)
        for b, p in enumerate(prompts):
            alone = model(torch.tensor([p]))[0]  # (T_b, V)
            assert torch.allclose(batch[b, : len(p)], alone, atol=1e-5)


@CHECKS
@pytest.mark.parametrize("right", CORRECT.values(), ids=CORRECT.keys())
def test_a_correct_version_passes(right):
    check_all(right)


@CHECKS
@pytest.mark.parametrize("wrong", [w for w, _ in WRONG.values()], ids=WRONG.keys())
def test_the_checks_catch_a_wrong_loop(wrong):
    with pytest.raises(Exception) as failure:  # a wrong reply, or a crash in the wrong code (an IndexError)
        check_all(wrong)
    assert isinstance(failure.value, (AssertionError, IndexError)), failure.value


@CHECKS
@pytest.mark.parametrize("name", WRONG.keys())
def test_each_mistake_gets_its_own_hint(name):
    wrong, implies = WRONG[name]
    with pytest.raises(Exception) as failure:
        check_all(wrong)
    if isinstance(failure.value, IndexError):  # it crashed (the row it read is not there): the crash says where
        return
    if name not in ("one-prompt-at-a-time", "runs-to-the-budget"):  # right tokens: the call count says why
        assert str(failure.value).startswith(f"hint: {implies}")  # the hint comes first


@CHECKS
def test_the_stub_is_rejected():
    with pytest.raises(NotImplementedError):
        check_all(stub)
