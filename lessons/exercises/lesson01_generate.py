"""Lesson 01 exercise: the decode loop. Check your work: pytest -m lesson01"""

from __future__ import annotations

import torch

from minillm.model import Transformer


@torch.no_grad()
def generate_greedy(model: Transformer, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Greedy generation with no cache: the plain loop every faster path must match.

    Each step: run `model` on the whole sequence so far (a (1, T) long tensor; the model
    returns logits (1, T, vocab)), take the argmax of the LAST position's logits, and
    append it. Stop when the new token is EOS (do not include it; `from minillm.tokenizer import EOS`)
    or after max_new_tokens tokens. Return the new tokens only (not the prompt).
    """
    raise NotImplementedError("lesson 01: write the decode loop (run the model, argmax, append, stop at EOS)")
