"""Running one step's packed batch on the model, picking each row's next token, and the clock.

The engine decides who runs how many tokens (scheduler.py) and lays the rows out (packing.py); a
runner turns that batch into next tokens. ModelRunner is the real thing: the KV cache makes room
for the new tokens, the transformer runs ONE forward over every row, and a picker (greedy here, a
layer's otherwise) picks each next token. A simulated card (card/simulate.py) is another runner
with the same methods: the engine never knows which it drives.
"""

from __future__ import annotations

import time
from typing import Protocol

import torch

from minillm.config import EngineConfig
from minillm.engine.kv_cache import ContiguousKVCache, PagedKVCache
from minillm.engine.packing import Batch
from minillm.engine.request import Request
from minillm.model.tokenizer import EOS
from minillm.model.transformer import Transformer


class Picker(Protocol):
    """The pick seam: logits -> tokens. Told of each request first, it may refuse it (a reason)."""

    def on_submit(self, request: Request) -> str | None: ...

    def pick(self, logits: torch.Tensor, batch: Batch) -> list[int]: ...


class Greedy:
    """Each row's most likely token; never EOS for a request that ignores it."""

    def on_submit(self, request: Request) -> str | None:
        if not request.sampling.plain:
            return "this engine picks greedily: plug a sampling picker into its pick seam"
        return None

    def pick(self, logits: torch.Tensor, batch: Batch) -> list[int]:  # logits (R, V): R picks
        return without_eos(logits, batch.pickers).argmax(dim=-1).tolist()


def without_eos(logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
    """logits (R, V), EOS at -inf on the rows whose request ignores it (a copy only then)."""
    ignoring = [i for i, r in enumerate(requests) if r.ignore_eos]
    if ignoring:
        logits = logits.clone()
        logits[ignoring, EOS] = float("-inf")
    return logits


class WallClock:  # seconds since the engine started
    def __init__(self):
        self.start = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.start

    def wait_until(self, t: float) -> None:  # nothing to do until the next arrival at t
        time.sleep(max(0.0, t - self.now()))


class ModelRunner:
    def __init__(self, model: Transformer):
        self.model = model.eval()
        self.device = next(model.parameters()).device
        self.vocab_size, self.max_len = model.cfg.vocab_size, model.cfg.max_seq_len
        self.kv_cfg = model.cfg  # the heads its cache holds (a tensor-parallel rank: its share)
        self.clock = WallClock()

    def make_cache(self, cfg: EngineConfig, max_len: int):
        return make_cache(self.kv_cfg, cfg, max_len, self.device)

    def prepare(self, batch: Batch, cache) -> torch.Tensor:
        """The cache makes room for the rows' new tokens and plans the step; returns positions."""
        counts = batch.counts[0] if len(set(batch.counts)) == 1 else batch.counts  # one T: (B, T)
        return cache.prepare(batch.seats, counts, batch.padding_rows)

    @torch.no_grad()
    def run(self, batch: Batch, cache, picker: Picker) -> list[int]:
        """One forward over the batch; returns the token picked at each logit position."""
        positions = self.prepare(batch, cache)
        tokens = torch.tensor(batch.token_ids, device=self.device).view(positions.shape)
        at = torch.tensor(batch.logit_index, dtype=torch.long, device=self.device)  # (R,)
        logits = self.model(tokens, positions, cache, logits_at=at)  # (R, V)
        return picker.pick(logits, batch)


def make_cache(model_cfg, cfg: EngineConfig, max_len: int, device):
    """The KV cache an engine config asks for, for a model of `model_cfg`'s heads and layers."""
    if cfg.kv == "contiguous":  # (EngineConfig refuses prefix caching on it)
        return ContiguousKVCache(model_cfg, cfg.slots, max_len, device, cfg.block_size)
    num_blocks = cfg.num_blocks or cfg.slots * -(-max_len // cfg.block_size)
    return PagedKVCache(model_cfg, num_blocks, cfg.block_size, device, cfg.prefix_caching)
