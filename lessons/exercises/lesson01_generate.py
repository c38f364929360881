"""Lesson 01 exercise: one decode loop for several users at once. Check your work: pytest -m lesson01"""

from __future__ import annotations

import torch

from minillm.model.tokenizer import EOS, PAD  # noqa: F401 (you will need them)
from minillm.model.transformer import Transformer


@torch.no_grad()
def generate_batch(model: Transformer, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy replies to several prompts, computed together: ONE model call per step for every unfinished row.

    No KV cache: each step runs the model on the whole sequences so far, as in the lesson's loop, but for
    all rows at once. A batch is a rectangle (B, T) and the prompts have different lengths, so:
      - pad each row on the RIGHT with PAD up to the longest row (build a fresh rectangle every step);
      - row b's next-token scores are at its last REAL token, index len(row b) - 1 (not -1);
      - each row stops on its own: when it produces EOS (not part of its reply) or has max_new_tokens
        tokens. A finished row takes no more tokens; the others carry on.
    Stop calling the model as soon as every row has finished.

    model(tokens) takes a (B, T) long tensor and returns logits (B, T, vocab); it is causal (the scores at a
    position depend only on the row's tokens up to there) and may pick ANY token id, PAD and 0 included: only
    EOS ends a reply. prompts: zero or more lists of token ids, each non-empty (<bos> first), two users may send
    the same one; leave them as they are. max_new_tokens >= 1.
    Returns one reply per prompt (the new tokens only, without EOS), in the order of `prompts` ([] for no prompts).
    """
    raise NotImplementedError(
        "lesson 01: write the batched greedy loop (pad, read each row's last token, stop per row)"
    )
