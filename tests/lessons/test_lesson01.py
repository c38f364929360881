"""Lesson 01: the decode loop. Run: pytest -m lesson01

Your generate_greedy must match minillm's plain no-cache loop token for token.
"""

from __future__ import annotations

import pytest
import torch

from minillm.generate import generate
from minillm.tokenizer import EOS, decode, encode_prompt
from tests.lessons.harness import IMPLS, first_difference, shipped_model, small_model, stub, student_module

pytestmark = pytest.mark.lesson01


def reference(model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    return generate(model, prompt_ids, max_new_tokens, use_cache=False).tokens


@pytest.fixture(params=IMPLS)
def generate_greedy(request):
    if request.param == "reference":
        return reference
    return student_module("lesson01_generate").generate_greedy


# --- the checks --------------------------------------------------------------------------------
def as_tokens(reply) -> list[int]:
    if isinstance(reply, torch.Tensor):
        reply = reply.flatten().tolist()
    assert isinstance(reply, (list, tuple)), f"return a list of token ids, got {type(reply).__name__}"
    return [int(t) for t in reply]


def check_matches_reference(generate_greedy, model, prompt_ids: list[int], max_new_tokens: int, label: str) -> None:
    expected = reference(model, prompt_ids, max_new_tokens)
    given = list(prompt_ids)
    got = as_tokens(generate_greedy(model, given, max_new_tokens))
    assert given == prompt_ids, "generate_greedy changed the prompt list it was given: build a new list instead"
    if got == expected:
        return
    hints = []
    if EOS in got:
        hints.append(f"your reply contains EOS ({EOS}): stop when it comes, without appending it")
    if len(expected) < max_new_tokens and len(got) > len(expected):
        hints.append(f"the model said EOS after {len(expected)} tokens: the loop must stop there")
    if got[: len(prompt_ids)] == prompt_ids:
        hints.append("your reply starts with the prompt: return only the new tokens")
    raise AssertionError(
        f"{label} with max_new_tokens={max_new_tokens}: {first_difference(expected, got)}\n"
        f"  expected {expected}  ({decode(expected)!r})\n"
        f"  got      {got}  ({decode(got)!r})" + "".join(f"\n  hint: {h}" for h in hints)
    )


def check_random_model(generate_greedy) -> None:
    model = small_model("gqa")
    for prompt, n in (([257, 1, 2, 3], 8), ([257, *b"hello"], 12), ([257], 5)):
        check_matches_reference(generate_greedy, model, prompt, n, f"random model, prompt {prompt}")


def check_shipped_model(generate_greedy) -> None:
    model = shipped_model()
    for text, n in (("count down from 12", 40), ("spell 4096", 40), ("letters c to h", 20), ("count down from 40", 10)):
        check_matches_reference(generate_greedy, model, encode_prompt(text), n, f"shipped model, prompt {text!r}")


def check_all(generate_greedy) -> None:
    check_random_model(generate_greedy)
    check_shipped_model(generate_greedy)


def test_matches_the_reference_on_a_small_random_model(generate_greedy):
    check_random_model(generate_greedy)


def test_matches_the_reference_on_the_shipped_model(generate_greedy):
    check_shipped_model(generate_greedy)


# --- the checks catch plausible mistakes --------------------------------------------------------
def make_loop(keep_eos=False, stop_at_eos=True, position=-1, with_prompt=False, extra=0):
    @torch.no_grad()
    def loop(model, prompt_ids, max_new_tokens):
        sequence, reply = list(prompt_ids), []
        for _ in range(max_new_tokens + extra):
            token = model(torch.tensor([sequence]))[0, position].argmax().item()
            if token == EOS and stop_at_eos and not keep_eos:
                break
            reply.append(token)
            sequence.append(token)
            if token == EOS and keep_eos:
                break
        return sequence if with_prompt else reply

    return loop


WRONG = {
    "keeps-eos": make_loop(keep_eos=True),
    "never-stops-at-eos": make_loop(stop_at_eos=False),
    "reads-the-first-position": make_loop(position=0),
    "returns-the-prompt-too": make_loop(with_prompt=True),
    "one-token-too-many": make_loop(extra=1),
}


def test_a_correct_loop_passes():
    check_all(make_loop())


@pytest.mark.parametrize("wrong", WRONG.values(), ids=WRONG.keys())
def test_the_checks_catch_a_wrong_loop(wrong):
    with pytest.raises(AssertionError):
        check_all(wrong)


def test_the_stub_is_rejected():
    with pytest.raises(NotImplementedError):
        check_all(stub)
