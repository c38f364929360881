"""Running one step's packed batch on the model, and the clock the engine reads.

The engine decides who runs how many tokens (scheduler.py) and lays the rows out (packing.py);
a runner turns that batch into next tokens. ModelRunner is the real thing: the KV cache makes room
for the new tokens, the transformer runs ONE forward over every row, and each row that reached the
end of its sequence gets its next token (greedy, or drawn as its request asks: sampler.py; among the tokens its
constraint allows, if it has one: constrain.py). A simulated
card (simulate.py) is another runner with the same two methods: the engine never knows which it drives.
"""

from __future__ import annotations

import time

import torch

from minillm.config import EngineConfig
from minillm.engine.constrain import allowed_counts, logit_masks
from minillm.engine.kv_cache import ContiguousKVCache, PagedKVCache
from minillm.engine.packing import Batch
from minillm.engine.sampler import sample
from minillm.model.transformer import Transformer


class WallClock:
    """Seconds since the engine started, by the wall clock."""

    def __init__(self):
        self.start = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.start

    def wait_until(self, t: float) -> None:
        """Nothing to do until `t` (the next arrival): sleep."""
        time.sleep(max(0.0, t - self.now()))


class ModelRunner:
    def __init__(self, model: Transformer):
        self.model = model.eval()
        self.device = next(model.parameters()).device
        self.vocab_size, self.max_len = model.cfg.vocab_size, model.cfg.max_seq_len
        self.kv_cfg = model.cfg  # the heads this runner's cache holds (a tensor-parallel rank: its own share)
        self.clock = WallClock()

    def make_cache(self, cfg: EngineConfig, max_len: int) -> ContiguousKVCache | PagedKVCache:
        return make_cache(self.kv_cfg, cfg, max_len, self.device)

    def prepare(self, batch: Batch, cache: ContiguousKVCache | PagedKVCache) -> torch.Tensor:
        """The cache makes room for the rows' new tokens and plans the step; returns their positions."""
        same = len(set(batch.counts)) == 1  # every row runs T tokens: a (B, T) rectangle, attending as one group
        return cache.prepare(batch.seats, batch.counts[0] if same else batch.counts, batch.padding_rows)

    @torch.no_grad()
    def run(self, batch: Batch, cache: ContiguousKVCache | PagedKVCache) -> list[int]:
        """One forward over the batch; returns the next token of each row that samples, in row order (a row that
        verifies drafts gets one after each of its tokens: speculate.py)."""
        positions = self.prepare(batch, cache)
        tokens = torch.tensor(batch.token_ids, device=self.device).view(positions.shape)  # (B, T), else (1, N)
        at = torch.tensor(batch.logit_index, dtype=torch.long, device=self.device)  # (R,) where a token is picked
        logits = self.model(tokens, positions, cache, logits_at=at)  # (R, V)
        masks = logit_masks(batch, logits.shape[-1], self.device)  # (R, V) constrained rows' allowed tokens, or None
        batch.allowed = allowed_counts(batch)  # (for the trace)
        return sample(logits, [batch.requests[i] for i in batch.logit_rows], masks, batch.guesses())


def make_cache(model_cfg, cfg: EngineConfig, max_len: int, device) -> ContiguousKVCache | PagedKVCache:
    """The KV cache an engine config asks for, for a model of `model_cfg`'s heads and layers."""
    if cfg.kv == "contiguous":  # (EngineConfig refuses prefix caching on it)
        return ContiguousKVCache(model_cfg, cfg.slots, max_len, device=device, block_size=cfg.block_size)
    num_blocks = cfg.num_blocks or cfg.slots * -(-max_len // cfg.block_size)
    return PagedKVCache(model_cfg, num_blocks, cfg.block_size, device=device, prefix_caching=cfg.prefix_caching)
