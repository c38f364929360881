"""Lesson 01: one decode loop for several users. Run: pytest -m lesson01

Your generate_batch must give every row exactly the reply the plain one-prompt loop gives (token for
token), with ONE model call per step for all unfinished rows, and no call once every row is done.

The cases include the edges a loop right on the usual prompts gets wrong: no prompts at all, a reply whose first
token is EOS (an empty reply), a reply holding the PAD id, and the same prompts on two models in one process.
Each failure names its case first. WRONG (below) lists the mistakes a room makes, each caught, with its hint first
when your replies equal that mistake's on that very case (an unknown mistake gets the plain expected and got);
CORRECT, loops written differently that must pass.

Then the differential check (tests/lessons/drawn/lesson01.py): your replies against the reference loop's on 30
drawn batches (seeded: the same every run; MINILLM_CHECK_EXAMPLES=N draws N), the smallest that differs shown first.
Its strategies: 0 to 4 prompts (none, one, several; the same prompt twice), each <bos> + 0 to 6 bytes (byte 0 and
255 and their neighbours on purpose) + sometimes <sep>; max_new_tokens 1, 2, 3 or 6; a causal
stand-in model picking by a hash of the row's tokens so far, whose picks include EOS (never, sometimes, often, at
once: empty replies), PAD, <sep> and bytes 0 and 255. DRAWN_ONLY names the wrong loops only the drawn batches catch.
"""

from __future__ import annotations

import functools

import pytest
import torch
from torch.nn.utils.rnn import pad_sequence

from minillm.engine.generate import generate
from minillm.model.tokenizer import EOS, PAD, decode, encode_prompt, token_str
from tests.lessons.drawn.lesson01 import check_drawn
from tests.lessons.harness import CHECKS, case, implementations, shipped_model, small_model, stub, student_module

lesson = pytest.mark.lesson01  # your code's checks: pytest -m lesson01


# --- the loop written out, with switches for the mistakes students make --------------------------
def make_batch_loop(
    pad="right", read="last-real", stop="per-row", keep_eos=False, extra=0, until_budget=False, limit="reply",
    by_prompt=False, compact=False, old_index=False, first_eos="checked", done_check="before", memo=False,
    drop_pad=False, copy=True, ends=(EOS,), pad_id=PAD,
):  # fmt: skip
    """A batched greedy loop. The defaults are right; each switch is one plausible mistake (see WRONG), except
    compact=True: finished rows leave the rectangle (right too, written differently)."""
    remembered = {}  # memo=True: replies kept from one call to the next, keyed by prompt and limit (not the model)

    @torch.no_grad()
    def generate_batch(model, prompts, max_new_tokens):
        rows = [list(p) for p in prompts] if copy else prompts  # copy=False: the caller's lists grow (wrong)
        replies = [[] for _ in prompts]
        if by_prompt:  # each reply found by its prompt (wrong: two users may send the same prompt)
            mine = {tuple(p): [] for p in prompts}
            replies = [mine[tuple(p)] for p in prompts]
        done = [False] * len(prompts)
        if memo:  # a prompt seen before gets its old reply, whichever model asks (wrong)
            key = lambda b: (tuple(prompts[b]), max_new_tokens)
            for b in range(len(prompts)):
                if key(b) in remembered:
                    replies[b], done[b] = list(remembered[key(b)]), True
        for step in range(max_new_tokens + extra):
            if all(done) and not until_budget and done_check == "before":  # "after": only once the model ran (wrong)
                break
            active = [b for b in range(len(rows)) if not done[b]] if compact or old_index else list(range(len(rows)))
            width = max(len(rows[b]) for b in active) if active else max(len(row) for row in rows)
            fill = {b: [pad_id] * (width - len(rows[b])) for b in active}  # pad_id=0: zeros, as torch.zeros pads
            batch = torch.tensor([rows[b] + fill[b] if pad == "right" else fill[b] + rows[b] for b in active])
            logits = model(batch)  # (B, T, vocab): the rows in `active`, in that order
            for i, b in enumerate(active):
                if done[b]:
                    continue
                row = rows[b]
                at = len(row) - 1 if read == "last-real" and pad == "right" else -1
                if read == "non-pad":  # the row's length counted in the rectangle: a PAD in the reply is lost (wrong)
                    at = int((batch[i] != pad_id).sum()) - 1
                elif read == "one-early":  # (a mistake the catalogue does not know: see the unknown-mistake test)
                    at = len(row) - 2
                token = logits[b if old_index else i, at].argmax().item()  # old_index: the row's place before (wrong)
                if token in ends and (step > 0 or first_eos == "checked"):  # "unchecked": the first token always kept
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
            if all(done) and done_check == "after" and not until_budget:
                break
        if memo:
            remembered.update({key(b): list(replies[b]) for b in range(len(prompts))})
        if drop_pad:  # (wrong: a reply may contain the PAD id; padding never reaches a reply)
            replies = [[t for t in reply if t != PAD] for reply in replies]
        return replies

    return generate_batch


def one_at_a_time(model, prompts, max_new_tokens):
    """Right tokens, but every user's loop runs on its own: no batching at all."""
    return [generate(model, list(p), max_new_tokens, use_cache=False).tokens for p in prompts]


reference = make_batch_loop()
SECOND_MODEL_HINT = (
    "the same prompts sent to a second model got the first model's replies: something kept from one call to the "
    "next (a cache of replies) ignores which model asks; key it by the model too, or keep nothing between calls"
)

# Each wrong version, and what it implies: the hint shown when your replies equal that version's on the failing
# case (for those in NO_HINT, what the mistake is: their failure says it another way).
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
    "keeps-a-first-token-eos": (
        make_batch_loop(first_eos="unchecked"),
        "a reply whose very first token is EOS must be empty, but you kept that EOS and went on: check for EOS "
        "at every step, the first one too",
    ),
    "finds-the-last-real-token-by-counting-non-pads": (
        make_batch_loop(read="non-pad"),
        f"a reply that contains the PAD id ({PAD}: a random model may pick it) went wrong after it: you found a "
        "row's last real token by counting its non-PAD tokens; keep each row's own length instead (len(row) - 1)",
    ),
    "ends-a-reply-at-a-pad": (
        make_batch_loop(ends=(EOS, PAD)),
        f"a reply that contains the PAD id ({PAD}: a random model may pick it) ended there: only EOS ends a reply; "
        "a PAD the model picks is a token like any other",
    ),
    "drops-pads-from-the-replies": (
        make_batch_loop(drop_pad=True),
        f"a reply that contains the PAD id ({PAD}: a random model may pick it) lost it: padding never enters a "
        "reply, so return every token the model picked",
    ),
    "remembers-replies-between-calls": (make_batch_loop(memo=True), SECOND_MODEL_HINT),
    # right on every hand-built case (no byte 0 in their prompts or replies); the drawn batches catch it
    "pads-with-zeros-and-counts-the-non-zeros": (
        make_batch_loop(pad_id=0, read="non-pad"),
        "a prompt or reply holding byte 0 went wrong after it: you padded with 0 and found a row's last real token "
        "by counting its non-zero tokens; keep each row's own length instead (len(row) - 1)",
    ),
    # right replies; what the check counts or looks at says what is wrong
    "checks-for-done-only-after-calling-the-model": (
        make_batch_loop(done_check="after"),
        "with no prompts at all there is nothing to compute: return [] without calling the model",
    ),
    "appends-to-the-callers-prompt-lists": (
        make_batch_loop(copy=False),
        "your rows were the caller's prompt lists, so the replies were appended to them: copy each prompt",
    ),
}
NO_HINT = {  # the mistakes whose failure is not a wrong reply, and the words that say what went wrong instead
    "one-prompt-at-a-time": "the model was called",
    "runs-to-the-budget": "the model was called",
    "drops-finished-rows-but-reads-by-the-old-index": "your code raised IndexError",
    "checks-for-done-only-after-calling-the-model": "no prompts at all (max_new_tokens=4): your code raised ValueError",
    "appends-to-the-callers-prompt-lists": "generate_batch changed the prompt lists it was given",
    "pads-with-zeros-and-counts-the-non-zeros": "your reply for row",
}
DRAWN_ONLY = ["pads-with-zeros-and-counts-the-non-zeros"]  # right on every hand-built case: only drawn inputs catch it
REPLAYED = [name for name in WRONG if name != "remembers-replies-between-calls"]  # (its replies depend on the past)


@torch.no_grad()
def with_pad_sequence(model, prompts, max_new_tokens):
    """Right, written differently: the unfinished rows in a dict, torch's pad_sequence builds the rectangle,
    and one gather reads every row's last real token."""
    rows, replies = {b: list(p) for b, p in enumerate(prompts)}, [[] for _ in prompts]
    while rows:
        order = list(rows)  # this step's rows, by their index in `prompts`
        batch = pad_sequence([torch.tensor(rows[b]) for b in order], batch_first=True, padding_value=PAD)  # (B, T)
        last = torch.tensor([len(rows[b]) - 1 for b in order])
        picks = model(batch)[torch.arange(len(order)), last].argmax(-1).tolist()  # (B,)
        for b, token in zip(order, picks):
            if token != EOS:
                replies[b].append(token)
                rows[b].append(token)
            if token == EOS or len(replies[b]) == max_new_tokens:
                del rows[b]
    return replies


@torch.no_grad()
def one_wide_tensor(model, prompts, max_new_tokens):
    """Right, written differently: one PAD-filled tensor wide enough for every reply, the lengths in a tensor;
    each step feeds as many columns as the longest row has."""
    if not prompts:
        return []
    lengths = torch.tensor([len(p) for p in prompts])  # (B,)
    tokens = torch.full((len(prompts), int(lengths.max()) + max_new_tokens), PAD)  # (B, T_max)
    for b, p in enumerate(prompts):
        tokens[b, : len(p)] = torch.tensor(p)
    running = torch.ones(len(prompts), dtype=torch.bool)
    made = torch.zeros(len(prompts), dtype=torch.long)
    while running.any():
        width = int(lengths.max())
        picks = model(tokens[:, :width])[torch.arange(len(prompts)), lengths - 1].argmax(-1)  # (B,)
        running &= picks != EOS
        rows = running.nonzero().flatten()
        tokens[rows, lengths[rows]] = picks[rows]
        lengths[rows] += 1
        made[rows] += 1
        running &= made < max_new_tokens
    return [tokens[b, len(p) : len(p) + int(made[b])].tolist() for b, p in enumerate(prompts)]


CORRECT = {  # right, written differently: the checks must pass them
    "keeps-finished-rows-in-the-rectangle": reference,
    "drops-finished-rows-from-the-rectangle": make_batch_loop(compact=True),
    "a-dict-of-rows-and-pad_sequence": with_pad_sequence,
    "one-wide-tensor-and-lengths": one_wide_tensor,
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


def label_of(token: int) -> str:
    """token_str for a token id, and something printable for an id no tokenizer knows (the diagnosis never crashes)."""
    try:
        return token_str(token)
    except (ValueError, OverflowError):
        return f"<{token}: not a token>"


def show(tokens: list[int]) -> str:
    return " ".join(repr(label_of(t)) for t in tokens)


def diagnose(model, prompts, max_new_tokens, got: list[list[int]], expected, known=()) -> str:
    """What is wrong: the first wrong row, expected against got, then what that suggests. A hint leads only when your
    replies equal a known mistake's replies on this very input (`known`: (replies, hint) pairs of this case first)."""
    b = next(i for i, (g, e) in enumerate(zip(got, expected)) if g != e.tokens)
    want, mine, prompt = expected[b].tokens, got[b], prompts[b]
    longest = max(len(p) for p in prompts)
    lines = [f"row {b}: expected {want}, got {mine}"]
    row = f"row {b} ({decode(prompt)!r}, a prompt of {len(prompt)} tokens; the longest is {longest})"
    k = next((i for i, (w, g) in enumerate(zip(want, mine)) if w != g), None)
    if k is not None:
        agree = f"; the {k} before agree" if k else ""
        lines.append(
            f"{row}: first difference at reply token {k}: expected {want[k]} ({label_of(want[k])!r}), "
            f"got {mine[k]} ({label_of(mine[k])!r}){agree}"
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
    key = tuple(map(tuple, prompts))
    known = [*known, *((wrong_replies(name, model, key, max_new_tokens), WRONG[name][1]) for name in REPLAYED)]
    hint = next((implies for replies, implies in known if replies == got), None)  # (a generator: stops at a match)
    return "\n  ".join(([f"hint: {hint}"] if hint else []) + lines)


@functools.cache
def wrong_replies(name: str, model, prompts: tuple[tuple[int, ...], ...], max_new_tokens: int) -> list | None:
    """A known mistake's replies on this input; None where that mistake crashes on it (so it explains nothing)."""
    try:
        return WRONG[name][0](model, [list(p) for p in prompts], max_new_tokens)
    except Exception:
        return None


def changed(prompts: list[list[int]], given: list[list[int]]) -> str:
    """How the caller's prompt lists differ after the call, in one line."""
    if len(given) != len(prompts):
        return f"the list held {len(prompts)} prompts, now {len(given)}: leave it as it is"
    b = next(i for i, (p, g) in enumerate(zip(prompts, given)) if p != g)
    return (
        f"prompt {b} had {len(prompts[b])} tokens, now {len(given[b])} (it ends {given[b][-6:]}): copy each prompt "
        "into a row of your own and grow that"
    )


def check_batch(generate_batch, model, texts_or_ids, max_new_tokens: int, label: str, known=()) -> list[list[int]]:
    """Your replies must equal the one-prompt loop's, with one model call per step, your arguments left as given."""
    prompts = [encode_prompt(p) if isinstance(p, str) else list(p) for p in texts_or_ids]
    given = [list(p) for p in prompts]
    counting = CountingModel(model)
    case_name = f"{label} (max_new_tokens={max_new_tokens})"
    with case(case_name):  # a crash in your code names the case first
        got = as_replies(generate_batch(counting, given, max_new_tokens), len(prompts))
    assert given == prompts, (
        f"{case_name}: your generate_batch changed the prompt lists it was given: {changed(prompts, given)}"
    )
    expected = expected_replies(model, tuple(map(tuple, prompts)), max_new_tokens)
    if got != [e.tokens for e in expected]:
        why = diagnose(model, prompts, max_new_tokens, got, expected, known)
        if why.startswith("hint:"):  # the hint leads, then the case
            hint, rest = why.split("\n", 1)
            raise AssertionError(f"{hint}\n{case_name}: {rest.strip()}")
        raise AssertionError(f"{case_name}: {why}")
    steps = max((len(e.tokens) + (e.finish_reason == "eos") for e in expected), default=0)  # an EOS takes a step too
    calls = counting.calls
    assert len(calls) <= steps, (
        f"{label}: every row had finished after {steps} steps, but the model was called {len(calls)} times "
        f"(batch sizes {[c[0] for c in calls][:12]}...): call the model once per step for all unfinished rows, "
        "and stop when every row is done"
    )
    return got


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


@functools.cache
def second_gqa_model():
    """Another random model of the same shape as small_model("gqa") (seed 1): a cache keyed by the model's config,
    not the model, mixes the two up too."""
    from tests.conftest import random_model

    return random_model("gqa", seed=1)


def check_edges(generate_batch) -> None:
    """Where a loop right on the usual case goes wrong: replies that are empty (the first token is EOS: "reverse" and
    "spell x" on the shipped model), a reply holding the PAD id, one process serving two models, no rows at all."""
    check_batch(generate_batch, shipped_model(), ["reverse"], 8, "a batch of one whose first reply token is EOS")
    prompts = ["spell x", "count down from 3", "reverse"]
    check_batch(generate_batch, shipped_model(), prompts, 8, "rows whose first reply token is EOS, beside a longer one")
    # the random mha model's reply to [257, 10] is 192 64 235 42 <pad> 67 ...: a PAD id in the middle of a reply
    prompts = [[257, 10], [257, *b"count"], [257, 1, 2, 3, 4, 5, 6]]
    check_batch(generate_batch, small_model("mha"), prompts, 8, "a reply that contains the PAD id")
    prompts = [[257, *b"two"], [257, *b"models"], [257, 7, 7, 7, 7]]  # (used by no other case)
    first = check_batch(generate_batch, small_model("gqa"), prompts, 6, "the same prompts on a first model")
    known = [(first, SECOND_MODEL_HINT)]
    label = "the same prompts on a second model of the same shape"
    check_batch(generate_batch, second_gqa_model(), prompts, 6, label, known)
    check_batch(generate_batch, shipped_model(), [], 4, "no prompts at all")


def check_drawn_batches(generate_batch) -> None:
    check_drawn(generate_batch, reference, as_replies)


def check_cases(generate_batch) -> None:
    check_shipped_model(generate_batch)
    check_random_model(generate_batch)
    check_edges(generate_batch)


def check_all(generate_batch) -> None:
    check_cases(generate_batch)
    check_drawn_batches(generate_batch)


def test_replies_equal_the_one_prompt_loop_on_the_shipped_model(generate_batch):
    check_shipped_model(generate_batch)


def test_replies_equal_the_one_prompt_loop_on_a_random_model(generate_batch):
    check_random_model(generate_batch)


def test_empty_replies_a_pad_in_a_reply_two_models_and_no_prompts(generate_batch):
    check_edges(generate_batch)


def test_replies_equal_the_reference_on_drawn_batches(generate_batch):
    check_drawn_batches(generate_batch)


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
def test_the_edge_cases_are_what_their_names_say():
    """The edge prompts do what check_edges says, on these models: else the cases test nothing."""
    for text in ("reverse", "spell x"):
        reply = generate(shipped_model(), encode_prompt(text), 8, use_cache=False)
        assert reply.tokens == [] and reply.finish_reason == "eos", text
    assert PAD in generate(small_model("mha"), [257, 10], 8, use_cache=False).tokens[:-1]
    prompts = ((257, *b"two"), (257, *b"models"), (257, 7, 7, 7, 7))
    first, second = (expected_replies(model, prompts, 6) for model in (small_model("gqa"), second_gqa_model()))
    assert all(a.tokens != b.tokens for a, b in zip(first, second))


@CHECKS
@pytest.mark.parametrize("right", CORRECT.values(), ids=CORRECT.keys())
def test_a_correct_version_passes(right):
    check_all(right)


@CHECKS
@pytest.mark.parametrize("wrong", [w for w, _ in WRONG.values()], ids=WRONG.keys())
def test_the_checks_catch_a_wrong_loop(wrong):
    with pytest.raises(AssertionError):  # a wrong reply, or a crash in the wrong code, named by its case
        check_all(wrong)


@CHECKS
@pytest.mark.parametrize("name", WRONG.keys())
def test_each_mistake_gets_its_own_hint(name):
    wrong, implies = WRONG[name]
    with pytest.raises(AssertionError) as failure:
        check_all(wrong)
    if name in NO_HINT:  # right tokens (or a crash): the call count, the arguments or the crash say why
        assert NO_HINT[name] in str(failure.value).splitlines()[0] and "hint:" not in str(failure.value)
    else:
        assert str(failure.value).startswith(f"hint: {implies}")  # the hint comes first


off_by_one = make_batch_loop(read="one-early")  # each row's scores read one position before its last real token


@CHECKS
def test_an_unknown_mistake_gets_the_plain_expected_and_got_line():
    """No known mistake gives these replies (and one of them crashes on this case): no hint, no crash in the check's
    own diagnosis, the case and the first wrong row's expected and got on the first line."""
    with pytest.raises(AssertionError) as failure:
        check_shipped_model(off_by_one)
    first = str(failure.value).splitlines()[0]
    want = expected_replies(shipped_model(), (tuple(encode_prompt("spell 7")),), 12)[0].tokens
    assert first.startswith(f"shipped model, four prompts (max_new_tokens=12): row 0: expected {want}, got ["), first
    assert "hint:" not in str(failure.value)


@CHECKS
def test_a_known_mistake_that_crashes_on_the_case_explains_nothing():
    prompts = tuple(tuple(encode_prompt(p)) for p in ["spell 7", "count down from 40", "spell 42"])
    assert wrong_replies("drops-finished-rows-but-reads-by-the-old-index", shipped_model(), prompts, 12) is None


@CHECKS
@pytest.mark.parametrize("name", DRAWN_ONLY)
def test_the_drawn_batches_catch_what_the_cases_miss(name):
    check_cases(WRONG[name][0])  # every hand-built case passes it
    with pytest.raises(AssertionError, match="your reply for row"):
        check_drawn_batches(WRONG[name][0])


@CHECKS
def test_the_stub_is_rejected():
    with pytest.raises(NotImplementedError):
        check_all(stub)
