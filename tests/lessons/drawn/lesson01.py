"""Lesson 01's differential check: your generate_batch against the reference loop on drawn prompts and models.

The models are stand-ins: a causal "model" whose pick at each position is a hash of the tokens up to it (so what
it says after a row depends on that row's real tokens only, as a real model's does), with EOS, PAD and the byte
range's ends (0 and 255) among its picks far more often than a random model's. A drawn case: 0 to 4 prompts
(<bos>, 0 to 6 bytes, sometimes <sep>; the same prompt twice sometimes), max_new_tokens 1, 2, 3 or 6, a model drawn
by its seed and how often it says EOS (never, sometimes, often, at once).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from minillm.config import ModelConfig
from minillm.model.tokenizer import BOS, EOS, PAD, SEP, VOCAB_SIZE, decode, token_str
from tests.lessons.differential import against_reference, near, plural
from tests.lessons.harness import case

EOS_RATES = {"never": 0, "sometimes": 12, "often": 40, "at once": 100}  # out of 100 picks


@dataclass(frozen=True)
class HashModel:
    """A causal stand-in: logits (B, T, vocab) with one 1.0 per position, at a token picked from a hash of the
    row's tokens 0..t. `eos` of every 100 picks are EOS; of the rest, some are PAD, 0 or 255."""

    seed: int
    eos: int  # out of 100

    @property
    def cfg(self) -> ModelConfig:
        return ModelConfig(dim=8, n_layers=1, n_heads=1, n_kv_heads=1, ffn_dim=8, max_seq_len=256)

    def pick(self, state: int) -> int:
        roll, rest = state % 100, (state // 100) % 1000
        if roll < self.eos:
            return EOS
        return {0: PAD, 1: PAD, 2: 0, 3: 255, 4: SEP}.get(rest % 10, rest % VOCAB_SIZE)

    def __call__(self, tokens: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        picks = []
        for row in tokens.tolist():  # (B, T)
            state = self.seed
            for token in row:
                state = (state * 1_000_003 + token + 1) % (1 << 61)
                picks.append(self.pick(state))
        logits = torch.zeros(tokens.numel(), VOCAB_SIZE)  # (B * T, V)
        logits[torch.arange(len(picks)), torch.tensor(picks, dtype=torch.long)] = 1.0
        return logits.view(*tokens.shape, VOCAB_SIZE)  # (B, T, V)

    forward = __call__

    def parameters(self):  # (for code that asks the model's device: the CPU)
        return iter([torch.zeros(1)])

    def describe(self) -> str:
        rate = next(name for name, n in EOS_RATES.items() if n == self.eos)
        return f"a stand-in model (seed {self.seed}) that says EOS {rate}"


@st.composite
def batches(draw):
    """(model, prompts, max_new_tokens): a valid call of generate_batch."""
    body = st.lists(near([0, 255], 0, 255), max_size=6)
    one = st.builds(lambda ids, sep: [BOS, *ids] + [SEP] * sep, body, st.booleans())
    prompts = draw(st.lists(one, min_size=(n := draw(st.sampled_from([0, 1, 2, 3, 4]))), max_size=n))
    if len(prompts) >= 2 and draw(st.booleans()):
        i, j = draw(st.integers(0, len(prompts) - 1)), draw(st.integers(0, len(prompts) - 1))
        prompts[j] = list(prompts[i])  # two users, the same prompt
    model = HashModel(draw(st.integers(0, 2**16)), EOS_RATES[draw(st.sampled_from(list(EOS_RATES)))])
    return model, prompts, draw(st.sampled_from([1, 2, 3, 6]))


def shown(tokens: list[int]) -> str:
    return "[" + ", ".join(token_str(t) if t >= 256 else str(t) for t in tokens) + "]"


def compare(generate_batch, reference, as_replies):
    """One drawn case: your replies must be the reference's, row for row."""

    def run(drawn):
        model, prompts, max_new_tokens = drawn
        given = [list(p) for p in prompts]
        setting = f"with {plural(len(prompts), 'prompt')} {shown_all(prompts)} and max_new_tokens={max_new_tokens}"
        with case(f"{setting}, {model.describe()}"):
            got = as_replies(generate_batch(model, given, max_new_tokens), len(prompts))
        assert given == prompts, f"{setting}: your generate_batch changed the prompt lists it was given: copy them"
        want = reference(model, [list(p) for p in prompts], max_new_tokens)
        if got == want:
            return
        b = next(i for i, (g, w) in enumerate(zip(got, want)) if g != w)
        lines = [
            f"{setting}, your reply for row {b} is {shown(got[b])}; the reference says {shown(want[b])}",
            f"  the model: {model.describe()} (its pick depends only on the row's own tokens, like a real model's)",
            f"  row {b}'s prompt: {shown(prompts[b])} ({len(prompts[b])} tokens; {decode(prompts[b])!r})",
            f"  every row, yours: {[shown(g) for g in got]}",
            f"  every row, the reference: {[shown(w) for w in want]}",
        ]
        raise AssertionError("\n".join(lines))

    return run


def shown_all(prompts: list[list[int]]) -> str:
    return "[" + ", ".join(shown(p) for p in prompts) + "]"


def check_drawn(generate_batch, reference, as_replies, examples: int = 30) -> None:
    """Your generate_batch against the reference on drawn batches (see the module's docstring)."""
    against_reference("generate_batch", batches(), compare(generate_batch, reference, as_replies), examples)
