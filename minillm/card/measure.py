"""Timing a decode step on this machine: what the benchmarks and the cost model's check (`whatif --validate`) share.

Shared machines are noisy, so a time is the median of repeats after a warm-up, and on a GPU each
repeat waits for the device to finish (kernels run asynchronously).
"""

from __future__ import annotations

import statistics
import time

import torch

from minillm.engine.kv_cache import ContiguousKVCache, PagedKVCache
from minillm.model.transformer import Transformer


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def median_time(fn, repeats: int, device: torch.device, warmup: int = 3) -> float:
    for _ in range(warmup):  # a fresh process's first calls run up to twice as slow (allocations, caches)
        fn()
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@torch.no_grad()
def decode_step_time(model: Transformer, batch: int, context: int, layout: str, repeats: int, block_size: int = 16):
    """Median seconds of one batched decode step: `batch` sequences with about `context` cached tokens
    (each timed step adds one token, so the context grows by `repeats` + 1 over the measurement)."""
    device = next(model.parameters()).device
    longest = context + repeats + 4  # (the warm-up calls add tokens too)
    if layout == "paged":
        blocks = batch * -(-longest // block_size)
        cache = PagedKVCache(model.cfg, num_blocks=blocks, block_size=block_size, device=device)
    else:
        cache = ContiguousKVCache(model.cfg, batch, max_len=model.cfg.max_seq_len, device=device)
    prompt = torch.randint(0, 256, (1, context), device=device)
    for seat in range(batch):
        model(prompt, cache.prepare([seat], context), cache, last_only=True)
    seats, tokens = list(range(batch)), torch.randint(0, 256, (batch, 1), device=device)
    return median_time(lambda: model(tokens, cache.prepare(seats, 1), cache), repeats, device)
