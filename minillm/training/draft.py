"""The draft model speculative decoding guesses with (layers/speculate.py): its shape and training, in one place.

A draft must be of the same family as the model it drafts for: the same tokenizer (its guesses are the model's
tokens), the same prompt format and tasks, so it guesses what the model would say. It only has to be cheap and
often right, not always right: every guess is checked, and a wrong one costs a little time, never a wrong token.
So it is one layer, half as wide, trained by the very loop that trained the model (train.py) for a few minutes.
What it gets right is the local part of each task: the next digits of a countdown, the rest of a spelled word.
"""

from __future__ import annotations

from minillm.config import ModelConfig
from minillm.training.train import TrainConfig

# 1 layer of width 128 (2 query heads sharing 1 key/value head, head_dim 64): about 0.23 M parameters.
DRAFT_MODEL = ModelConfig(dim=128, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=352)
# A smaller model takes a larger learning rate; fewer steps keep training within minutes on 2 cores.
DRAFT_TRAINING = TrainConfig(steps=800, lr=3e-3, warmup_steps=80)
