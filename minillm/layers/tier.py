"""A second tier: KV blocks kept in host memory under the device's prefix cache (SGLang's HiCache, vLLM's offloading
connector, LMCache). The device pool is small and fast; host memory is big and a copy away. So:

  1. write through   after each step, every block the prefix cache has just keyed (full and computed) is copied to
                     the host pool, once per key; the host pool keeps the least recently used out when it is full
  2. load on a hit   a request submitted whose prompt's blocks are on the device or in the host pool, further than
                     on the device alone, is submitted with a FromHost source: when it is seated, the device prefix
                     cache gives what it has, then the host's blocks are copied into fresh device blocks (in key
                     order, until one is missing) and keyed again; the request computes only the rest
  3. swap, not recompute   a preempted request loses its device blocks, but its full blocks were written through:
                     with `swap_above` tokens or more computed it comes back by copy (FromHost again); below that it
                     recomputes, as the core does (a short one is cheaper to run again than to copy back, on a card)

Every token is the model's own: the host pool holds the same numbers the device computed, keyed by the same hashes.
On a simulated card (no tensors) the pool keeps only its books, and a load's copy is charged to the clock at the
host link's bandwidth (the runner's host_copy_seconds: card/host_link.py); writing through overlaps the compute (a
copy engine of its own on a card), so it is not charged.

Seams: after the step (write through; swap decisions), admit with KV (FromHost). Needs paged KV with prefix caching.
Its state: the host pool (key -> slot, LRU order), how far each request's blocks are written through, its events, the
device blocks written and loaded this step (the trace reads them).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from minillm.engine.blocks import block_key
from minillm.engine.request import Request
from minillm.errors import ConfigError


class HostPool:
    """KV blocks in host memory, found by their prefix key; the least recently used leaves first."""

    def __init__(self, cache, num_blocks: int):
        self.num_blocks, self.block_size = num_blocks, cache.block_size
        self.slot_of: OrderedDict[bytes, int] = OrderedDict()  # key -> slot, least recently used first
        self.free = list(range(num_blocks))
        self.k = self.v = None  # (L, blocks, block_size, Hkv, D) each; none on a simulated card (books only)
        if hasattr(cache, "k"):
            shape = (cache.k.shape[0], num_blocks, *cache.k.shape[2:])
            pin = cache.k.is_cuda  # (pinned host memory: the copy runs at the link's full speed)
            self.k = torch.zeros(shape, dtype=cache.k.dtype, pin_memory=pin)
            self.v = torch.zeros(shape, dtype=cache.v.dtype, pin_memory=pin)

    def __contains__(self, key: bytes) -> bool:
        return key in self.slot_of

    def check(self) -> None:
        """Every slot either holds one key or is free, never both (the engine's debug mode: layers/books.py)."""
        held = list(self.slot_of.values())
        assert len(held) + len(self.free) == self.num_blocks, "a host slot was lost or counted twice"
        assert not set(held) & set(self.free) and len(set(held)) == len(held), "a host slot is held and free"

    def put(self, key: bytes, cache, block: int) -> bool:
        """Copy device block `block` in under `key` (True), or just mark it used if it is here already (False)."""
        if key in self.slot_of:
            self.slot_of.move_to_end(key)
            return False
        if not self.free:
            _, slot = self.slot_of.popitem(last=False)  # the least recently used makes room
            self.free.append(slot)
        slot = self.free.pop()
        self.slot_of[key] = slot
        if self.k is not None:
            self.k[:, slot].copy_(cache.k[:, block], non_blocking=True)
            self.v[:, slot].copy_(cache.v[:, block], non_blocking=True)
        return True

    def load(self, key: bytes, cache, block: int) -> None:
        """Copy the host block under `key` into device block `block`."""
        slot = self.slot_of[key]
        self.slot_of.move_to_end(key)
        if self.k is not None:
            cache.k[:, block].copy_(self.k[:, slot], non_blocking=True)
            cache.v[:, block].copy_(self.v[:, slot], non_blocking=True)


def prefix_keys(token_ids: list[int], block_size: int) -> list[bytes]:
    """The keys of the full blocks before the last token (the allocator's cached_prefix rule: the last token is run)."""
    keys, key = [], b""
    for start in range(0, len(token_ids) - block_size, block_size):
        key = block_key(key, token_ids[start : start + block_size])
        keys.append(key)
    return keys


@dataclass
class FromHost:
    """A request's blocks that the host pool holds, loaded into its seat when it is seated (the admit-with-KV seam)."""

    tier: Tier
    request: Request
    keys: list[bytes]  # its prefix keys, one per full block, as far as the device or the host held them

    @property
    def tokens(self) -> int:  # (what the admit-with-KV seam counts as computed)
        return len(self.keys) * self.tier.host.block_size

    def store(self, cache, seat: int, start: int) -> int:
        """After the device's own cached blocks (`start` tokens): copy the host's, in order, until one is missing."""
        alloc, size, loaded = cache.allocator, cache.block_size, 0
        for key in self.keys[start // size :]:
            if key not in self.tier.host:
                break  # (it left the host pool since): the request computes from here
            alloc.append(seat, size)
            self.tier.host.load(key, cache, alloc.tables[seat][-1])
            self.tier.moves["from_host"].append(alloc.tables[seat][-1])
            loaded += size
        self.tier.loaded(self.request, start, loaded)
        return loaded


class Tier:
    """The host pool under the device's prefix cache: writes blocks through, loads them back, swaps the preempted."""

    def __init__(self, engine, host_blocks: int, swap_above: int = 0):
        if engine.cfg.kv != "paged" or not engine.cfg.prefix_caching:
            raise ConfigError("a second KV tier keeps prefix-cached blocks: it needs kv='paged' and prefix caching on")
        if getattr(engine.runner, "tp", 1) > 1 and hasattr(engine.cache, "k"):
            raise ConfigError("a second KV tier is not served with tensor parallelism yet: each rank has its own cache")
        self.engine, self.swap_above = engine, swap_above
        self.host = HostPool(engine.cache, host_blocks)
        self.written: dict[str, int] = {}  # request id -> its blocks already written through
        self.judged: set[tuple[str, int]] = set()  # (id, preemptions): a preempted request's way back, chosen once
        self.keys: dict[str, tuple[int, list[bytes]]] = {}  # id -> (its tokens then, its prefix keys): hashed once
        self.events = engine.meta.setdefault("tier_events", {"written": 0, "loaded": 0, "swapped": 0, "recomputed": 0})
        engine.meta |= {"host_blocks": host_blocks, "swap_above": swap_above}  # (the trace keeps the rule it chose by)
        self.moves: dict[str, list[int]] = {"to_host": [], "from_host": []}  # this step's (the Recorder clears them)
        engine.observers.append(self.after_step)  # (before the Recorder's: a step's record holds its own writes)

    def source_for(self, request: Request) -> FromHost | None:
        """A FromHost if the host pool holds more of the request's prefix than the device does, else None."""
        known = self.keys.get(request.id)
        if known is None or known[0] != request.num_tokens:  # (a waiting request is asked every step: hash it once)
            known = self.keys[request.id] = (request.num_tokens, prefix_keys(request.tokens, self.host.block_size))
        keys, on_device = known[1], self.engine.cache.allocator.block_of
        device = next((i for i, key in enumerate(keys) if key not in on_device), len(keys))  # (cached_prefix's run)
        reach = next((i for i in range(device, len(keys)) if keys[i] not in self.host), len(keys))
        return FromHost(self, request, keys[:reach]) if reach > device else None

    def before_step(self) -> None:
        """Whoever is about to be seated (arriving this step, or waiting) gets what the host holds of its prefix: the
        queue's order may have changed the pools since it was submitted. A preempted request comes back by copy only
        from `swap_above` tokens (below: it recomputes, past what the device still caches)."""
        engine = self.engine
        now, idle = engine.clock.now(), not engine.waiting and not engine.running()
        due = engine.pending[0].arrival_s if idle and engine.pending else None  # (idle: the clock jumps to it)
        arriving = [r for r in engine.pending if arrives(r, engine.step_no, now if due is None else max(now, due))]
        for r in [*engine.waiting, *arriving]:
            if r.id in engine.brought:
                continue
            if r.preemptions:
                turn = (r.id, r.preemptions)
                if turn in self.judged:
                    continue
                self.judged.add(turn)
                swap = r.num_tokens >= self.swap_above
                self.events["swapped" if swap else "recomputed"] += 1
                if not swap:
                    continue
            source = self.source_for(r)
            if source is not None:  # the admit-with-KV seam's books, as a submit with KV sets them
                engine.brought[r.id], r.num_computed = source, source.tokens

    def loaded(self, request: Request, start: int, tokens: int) -> None:
        self.events["loaded"] += tokens // self.engine.cfg.block_size
        if not request.preemptions:  # (the first admission's prompt tokens not computed: the hit rate counts them)
            prompt = len(request.prompt_ids)
            request.prompt_tokens_from_cache += min(start + tokens, prompt) - min(start, prompt)
        price = getattr(self.engine.runner, "host_copy_seconds", None)  # (a simulated card: the copy takes time)
        if price is not None and tokens:
            self.engine.clock.advance(price(tokens))

    def after_step(self, engine, step) -> None:
        """Write the blocks keyed this step through to the host pool (the finished' too: they hold them still)."""
        alloc = engine.cache.allocator
        for r in [*engine.running(), *step.finished]:
            keyed = alloc.hashed.get(r.seat, (0, b""))[0] if r.seat is not None else 0
            table = alloc.tables.get(r.seat, [])
            for i in range(self.written.get(r.id, 0), keyed):
                if self.host.put(alloc.key_of[table[i]], engine.cache, table[i]):
                    self.events["written"] += 1
                    self.moves["to_host"].append(table[i])
            self.written[r.id] = keyed
        for r in [*step.finished, *step.plan.preempt]:  # (a preempted one's table starts over)
            self.written.pop(r.id, None)
        for rid in [rid for rid in self.keys if rid not in engine.live]:  # (finished or aborted: not asked again)
            del self.keys[rid]


def arrives(r: Request, step: int, now: float) -> bool:
    return r.arrival_step <= step if r.arrival_s is None else r.arrival_s <= now
