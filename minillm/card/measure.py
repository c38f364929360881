"""Timing real steps on this machine: what the benchmarks and the cost model's check (`whatif --validate`) share.

Shared machines are noisy, so a time is the median of repeats after a warm-up, and on a GPU each
repeat waits for the device to finish (kernels run asynchronously).

The KV cache is filled by reserving each sequence's tokens and writing random keys and values,
not by running every prompt through the model: a step's time depends on how many tokens are
cached, not on what they hold, and 128 prompts of 512 tokens through a 100M-parameter model
would take minutes to set up a step that takes a fraction of a second.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import torch

from minillm.engine.kv_cache import ContiguousKVCache, PagedKVCache
from minillm.model.transformer import Transformer


def count_torch_calls(fn) -> int:
    """Torch calls from Python while fn() runs (counted, not timed), the unit the fixed cost per op is
    priced in. Attribute reads (.shape, .device) are free and not counted."""
    return sum(torch_calls(fn).values())


def torch_calls(fn) -> Counter:
    """count_torch_calls, itemized: {(caller, op): calls}, where caller is the innermost function outside
    torch that made the call (e.g. 'RMSNorm.forward', 'Attention.forward' for its nn.Linear) and op the
    torch function's name ('linear', 'mul', '__getitem__')."""
    from torch.overrides import TorchFunctionMode

    torch_dir = str(Path(torch.__file__).parent)
    calls: Counter = Counter()

    class Count(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            op = getattr(func, "__name__", "")
            if op != "__get__":
                frame = sys._getframe(1)
                while frame is not None and frame.f_code.co_filename.startswith(torch_dir):
                    frame = frame.f_back  # (an nn.Linear's forward is torch's: name who called the module)
                calls[(frame.f_code.co_qualname if frame else "?", op)] += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return calls


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


def filled_cache(model: Transformer, seats: int, context: int, room: int, layout: str = "paged", block_size=16):
    """A cache whose first `seats` seats each hold `context` tokens of random keys and values, with room for
    `room` more tokens per seat."""
    device = next(model.parameters()).device
    if layout == "paged":
        blocks = seats * -(-(context + room) // block_size)
        cache = PagedKVCache(model.cfg, num_blocks=blocks, block_size=block_size, device=device)
    else:
        cache = ContiguousKVCache(model.cfg, seats, max_len=model.cfg.max_seq_len, device=device)
    if context:
        cache.prepare(list(range(seats)), context)  # the same blocks, in the same order, a prefill would take
    cache.k.normal_()
    cache.v.normal_()
    return cache


@torch.no_grad()
def decode_step_time(model: Transformer, batch: int, context: int, layout: str, repeats: int, block_size: int = 16):
    """Median seconds of one batched decode step: `batch` sequences with about `context` cached tokens
    (each timed step adds one token, so the context grows by `repeats` + 1 over the measurement)."""
    device = next(model.parameters()).device
    cache = filled_cache(model, batch, context, repeats + 4, layout, block_size)  # (the warm-up calls add tokens too)
    seats, tokens = list(range(batch)), torch.randint(0, 256, (batch, 1), device=device)
    return median_time(lambda: model(tokens, cache.prepare(seats, 1), cache), repeats, device)


@torch.no_grad()
def prefill_chunk_time(model: Transformer, chunk: int, before: int, repeats: int, block_size: int = 16) -> float:
    """Median seconds of one prompt chunk of `chunk` tokens after `before` cached ones (paged; logits at its last
    token). Each call runs on a fresh seat holding `before` tokens, so every chunk meets the same context."""
    device = next(model.parameters()).device
    seats = repeats + 3
    cache = filled_cache(model, seats, before, chunk, "paged", block_size)
    fresh, tokens = iter(range(seats)), torch.randint(0, 256, (1, chunk), device=device)
    return median_time(lambda: model(tokens, cache.prepare([next(fresh)], chunk), cache, last_only=True), repeats,
                       device)  # fmt: skip


def step_clock(device: torch.device):
    """The clock a step is timed by. On a CPU running torch on one thread: the process's CPU time, which on a quiet
    machine is the wall clock's time and on a shared one leaves out the time other programs held the core (on
    this project's busy 2-core machine the wall clock read 30-130% more, the CPU time the same within 5%).
    Otherwise (a GPU, or several threads): the wall clock."""
    if device.type == "cpu" and torch.get_num_threads() == 1:
        return time.process_time
    return time.perf_counter


def timed_samples(fn, device: torch.device, budget_s: float, least: int = 6, most: int = 30, warmup: int = 2):
    """Seconds of `fn` over as many calls as fit in `budget_s` (at least `least`, at most `most`), after a warm-up:
    a 2 ms step gets `most` samples, a 2 s step `least`, so a sweep over sizes stays minutes long."""
    for _ in range(warmup):
        fn()
    clock, times = step_clock(device), []
    while len(times) < least or (len(times) < most and sum(times) + times[-1] <= budget_s):
        sync(device)
        start = clock()
        fn()
        sync(device)
        times.append(clock() - start)
    return times


@torch.no_grad()
def step_calls(model: Transformer, batch: int, context: int, new: int = 1) -> int:
    """Torch calls from Python in one paged step of `model`, counted (not timed) on the real forward: `batch` rows of
    `new` tokens each after `context` cached ones (decode: new = 1; a prompt chunk: batch = 1, new = its length)."""
    device = next(model.parameters()).device
    cache = filled_cache(model, batch, context, new)
    tokens, seats = torch.randint(0, 256, (batch, new), device=device), list(range(batch))
    return count_torch_calls(lambda: model(tokens, cache.prepare(seats, new), cache, last_only=new > 1))


def calls_for_layers(layers: int, batch: int = 1, context: int = 16, new: int = 1) -> int:
    """The same count for a model of `layers` layers of any width: how many calls a step makes depends on the
    code and the depth, not on the sizes, so a 16-wide stand-in counts them in milliseconds."""
    from minillm.config import ModelConfig

    cfg = ModelConfig(dim=16, n_layers=layers, n_heads=2, n_kv_heads=1, ffn_dim=16, max_seq_len=context + new + 16)
    return step_calls(Transformer(cfg).eval(), batch, context, new)
