"""A preempted user's KV, priced: compute it again, or copy it back from host memory (layers/tier.py's swap_above)?

vLLM V1 recomputes (its RFC #54644 measures recomputation wasting 10-23% of the time under memory pressure); engines
with a second tier (SGLang's HiCache, vLLM's offloading connector) can copy the blocks back instead. Which is cheaper
depends on the card, the model and how busy the step is:

    recompute   the preempted user's tokens run again as a prompt chunk inside a busy step. That step streams the
                weights for its decode rows anyway, so a short chunk costs almost nothing more (the step stays
                memory-bound); a long one makes the step compute-bound and costs its FLOPs
    copy back   tokens x KV bytes per token over the card's host link (PCIe: card/host_link.py), plus the link's
                fixed cost; the copy out cost nothing on the step (written through as blocks filled)

So: recompute below a length, copy back above it, and the crossover is where a chunk turns the step compute-bound.
"""

from __future__ import annotations

from minillm.card.hardware import Device
from minillm.card.host_link import host_copy_seconds
from minillm.card.modelspec import ModelSpec
from minillm.card.tensor_parallel import tp_step


def recompute_seconds(spec: ModelSpec, card: Device, tokens: int, batch: int, context: int, dtype="bf16",
                      kv_dtype="bf16", tp: int = 1) -> float:  # fmt: skip
    """What running `tokens` tokens again (from the start) adds to a step of `batch` decode rows at `context`."""
    decode = [(1, context)] * batch
    busy = tp_step(spec, card, decode + [(tokens, 0)], dtype, kv_dtype, tp).time_s
    return busy - (tp_step(spec, card, decode, dtype, kv_dtype, tp).time_s if batch else 0.0)


def swap_seconds(spec: ModelSpec, card: Device, tokens: int, kv_dtype="bf16", tp: int = 1) -> float:
    """Copying `tokens` tokens of KV back from host memory (on each card of a tp-wide engine, at once)."""
    return host_copy_seconds(spec, card, tokens, kv_dtype, tp)


def crossover(spec: ModelSpec, card: Device, batch: int, context: int, dtype="bf16", kv_dtype="bf16", tp: int = 1,
              longest: int | None = None) -> int | None:  # fmt: skip
    """The fewest tokens from which copying back is cheaper than computing again (1: always; None: never, up to
    `longest` tokens, default the model's context)."""
    longest = longest or spec.max_context or 131_072
    cheaper = lambda n: (
        swap_seconds(spec, card, n, kv_dtype, tp)
        < recompute_seconds(  # noqa: E731
            spec, card, n, batch, context, dtype, kv_dtype, tp
        )
    )
    if not cheaper(longest):
        return None
    low, high = 0, longest  # cheaper(high); not known below low + 1
    while high - low > 1:  # (recomputing grows faster than copying once the chunk is compute-bound: one crossing)
        middle = (low + high) // 2
        low, high = (low, middle) if cheaper(middle) else (middle, high)
    return high
