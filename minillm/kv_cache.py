"""KV caches: where each sequence's keys and values live between decode steps.

Without a cache every new token re-reads the whole prompt and reply through the model.
With one, a step only computes the new token and reads the rest back from memory.

ContiguousKVCache is the pre-paging design: each seat reserves one row of `max_len`
positions per layer up front, whether or not its sequence ever grows that long.
PagedKVCache keeps one shared pool of small blocks and hands them out as sequences grow
(see blocks.py), so memory holds real tokens, not reservations.

Both follow one protocol, used by the engine and the model's attention layers:
    positions = cache.prepare(seats, num_new)   # before a forward: who, and how many new tokens
    out = cache.attend(layer, q, k, v)          # inside it: store this step's k/v, attend over all
    cache.free(seat)                            # the sequence left: its memory is reusable
"""

from __future__ import annotations

import torch

from minillm.attention import attend, paged_gather, visible_mask
from minillm.blocks import BlockAllocator, BlockPoolExhausted
from minillm.config import ModelConfig
from minillm.errors import InputError


def kv_bytes_per_token(cfg: ModelConfig, dtype: torch.dtype = torch.float32) -> int:
    """Memory one token occupies in the cache: a key and a value vector per kv head, per layer."""
    return cfg.n_layers * 2 * cfg.n_kv_heads * cfg.head_dim * torch.finfo(dtype).bits // 8


class ContiguousKVCache:
    def __init__(
        self,
        cfg: ModelConfig,
        num_seats: int,
        max_len: int | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        block_size: int = 16,  # only for accounting and drawing: rows are cut into blocks of this size
    ):
        self.cfg, self.num_seats, self.block_size = cfg, num_seats, block_size
        self.max_len = max_len or cfg.max_seq_len
        self.blocks_per_seat = -(-self.max_len // block_size)
        self.num_blocks = num_seats * self.blocks_per_seat
        shape = (cfg.n_layers, num_seats, self.max_len, cfg.n_kv_heads, cfg.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)  # (L, seats, max_len, Hkv, D)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.lengths = [0] * num_seats  # tokens stored per seat
        self._seats: torch.Tensor | None = None  # (B,) seats in this forward
        self._positions: torch.Tensor | None = None  # (B, T) positions of the new tokens

    def prepare(self, seats: list[int], num_new: int) -> torch.Tensor:
        """Make room for `num_new` tokens after what each seat stores. Returns their positions (B, T)."""
        for seat in seats:
            if self.lengths[seat] + num_new > self.max_len:
                raise InputError(
                    f"seat {seat} would hold {self.lengths[seat] + num_new} tokens, "
                    f"more than its reserved row of {self.max_len}"
                )
        device = self.k.device
        start = torch.tensor([self.lengths[s] for s in seats], device=device)  # (B,)
        self._seats = torch.tensor(seats, device=device)
        self._positions = start[:, None] + torch.arange(num_new, device=device)  # (B, T)
        for seat in seats:
            self.lengths[seat] += num_new
        return self._positions

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q (B, T, H, D); k, v (B, T, Hkv, D) for the new tokens. Returns (B, T, H, D)."""
        seats, positions = self._seats, self._positions
        self.k[layer][seats[:, None], positions] = k  # write each new token at (seat, position)
        self.v[layer][seats[:, None], positions] = v
        span = int(positions.max()) + 1  # longest context in this batch
        keys = self.k[layer][seats, :span]  # (B, span, Hkv, D)
        values = self.v[layer][seats, :span]
        return attend(q, keys, values, visible_mask(positions, span))

    def pad_rows(self, total: int) -> torch.Tensor:
        """Repeat row 0 until the batch has `total` rows: wasted work, as a fixed-shape batch does.
        Returns the padded positions (total, T)."""
        extra = total - len(self._seats)
        self._seats = torch.cat([self._seats, self._seats[:1].expand(extra)])
        self._positions = torch.cat([self._positions, self._positions[:1].expand(extra, -1)])
        return self._positions

    def free(self, seat: int) -> None:
        """Forget a seat's tokens. Its row stays reserved: that is the contiguous layout's cost."""
        self.lengths[seat] = 0

    # --- what a scheduler asks -----------------------------------------------------------------
    # A seat's row was paid for when the cache was built, so admitting or growing costs no blocks.
    def blocks_to_admit(self, num_tokens: int) -> int:
        return 0

    def blocks_to_grow(self, seat: int, num_new: int = 1) -> int:
        return 0

    def blocks_held(self, seat: int) -> int:
        return 0

    def can_ever_hold(self, num_tokens: int) -> bool:
        return num_tokens <= self.max_len

    @property
    def free_blocks(self) -> int:
        return self.num_blocks  # never the limit: seats are

    def block_map(self, seats: list[int]) -> dict[int, list[int]]:
        """Blocks of memory each given seat holds: its whole row, however few tokens it stores."""
        first = {s: s * self.blocks_per_seat for s in seats}
        return {s: list(range(first[s], first[s] + self.blocks_per_seat)) for s in seats}

    # --- memory accounting -------------------------------------------------------------------
    @property
    def reserved_tokens(self) -> int:
        """Token slots set aside: every seat's whole row, from the start."""
        return self.num_seats * self.max_len

    @property
    def stored_tokens(self) -> int:
        return sum(self.lengths)


def slot_mapping(block_tables: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """Flat pool slot of each new token: its block (looked up in the table) * block_size + offset.

    block_tables (B, max_blocks), positions (B, T) -> (B * T,)
    """
    physical = block_tables.gather(1, positions // block_size)  # (B, T)
    return (physical * block_size + positions % block_size).flatten()


class PagedKVCache:
    def __init__(
        self,
        cfg: ModelConfig,
        num_blocks: int,
        block_size: int = 16,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
    ):
        self.cfg, self.num_blocks, self.block_size = cfg, num_blocks, block_size
        self.allocator = BlockAllocator(num_blocks, block_size)
        shape = (cfg.n_layers, num_blocks, block_size, cfg.n_kv_heads, cfg.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)  # (L, num_blocks, block_size, Hkv, D)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self._positions: torch.Tensor | None = None  # (B, T)
        self._slot_mapping: torch.Tensor | None = None  # (B * T,) flat pool slot of each new token
        self._block_tables: torch.Tensor | None = None  # (B, max_blocks)

    def prepare(self, seats: list[int], num_new: int) -> torch.Tensor:
        """Give each seat blocks for `num_new` more tokens; build block tables and the slot mapping."""
        alloc = self.allocator
        needed = sum(alloc.new_blocks_needed(s, num_new) for s in seats)
        if needed > alloc.num_free:  # check the whole batch first, so a failure changes nothing
            raise BlockPoolExhausted(
                f"KV cache is full: this step needs {needed} new block(s) but only {alloc.num_free} of "
                f"{alloc.num_blocks} are free; preempt a sequence first, or give the cache more blocks"
            )
        starts = [alloc.lengths.get(s, 0) for s in seats]
        for s in seats:
            alloc.append(s, num_new)
        device = self.k.device
        tables = [alloc.tables[s] for s in seats]
        width = max(len(t) for t in tables)
        padded = [t + [0] * (width - len(t)) for t in tables]  # pad with any valid id: masked anyway
        self._block_tables = torch.tensor(padded, device=device)  # (B, max_blocks)
        self._positions = torch.tensor(starts, device=device)[:, None] + torch.arange(num_new, device=device)
        self._slot_mapping = slot_mapping(self._block_tables, self._positions, self.block_size)
        return self._positions

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q (B, T, H, D); k, v (B, T, Hkv, D) for the new tokens. Returns (B, T, H, D)."""
        k_pool, v_pool = self.k[layer], self.v[layer]  # (num_blocks, block_size, Hkv, D)
        k_pool.view(-1, *k_pool.shape[2:])[self._slot_mapping] = k.flatten(0, 1)  # scatter into slots
        v_pool.view(-1, *v_pool.shape[2:])[self._slot_mapping] = v.flatten(0, 1)
        keys = paged_gather(k_pool, self._block_tables)  # (B, max_blocks * block_size, Hkv, D)
        values = paged_gather(v_pool, self._block_tables)
        return attend(q, keys, values, visible_mask(self._positions, keys.shape[1]))

    def pad_rows(self, total: int) -> torch.Tensor:
        """Repeat row 0 until the batch has `total` rows (decode only): rewriting the same slot is harmless.
        Returns the padded positions (total, 1)."""
        extra = total - len(self._block_tables)
        self._block_tables = torch.cat([self._block_tables, self._block_tables[:1].expand(extra, -1)])
        self._positions = torch.cat([self._positions, self._positions[:1].expand(extra, -1)])
        self._slot_mapping = torch.cat([self._slot_mapping, self._slot_mapping[:1].expand(extra)])
        return self._positions

    def free(self, seat: int) -> None:
        self.allocator.free(seat)

    # --- what a scheduler asks -----------------------------------------------------------------
    def blocks_to_admit(self, num_tokens: int) -> int:
        return self.allocator.blocks_for(num_tokens)

    def blocks_to_grow(self, seat: int, num_new: int = 1) -> int:
        return self.allocator.new_blocks_needed(seat, num_new)

    def blocks_held(self, seat: int) -> int:
        return len(self.allocator.tables.get(seat, []))

    def can_ever_hold(self, num_tokens: int) -> bool:
        return self.allocator.blocks_for(num_tokens) <= self.num_blocks

    @property
    def free_blocks(self) -> int:
        return self.allocator.num_free

    def block_map(self, seats: list[int]) -> dict[int, list[int]]:
        return {s: list(self.allocator.tables.get(s, [])) for s in seats}

    @property
    def lengths(self) -> dict[int, int]:
        return self.allocator.lengths

    # --- memory accounting -------------------------------------------------------------------
    @property
    def reserved_tokens(self) -> int:
        """Token slots in blocks that some sequence holds (free blocks are anyone's)."""
        return self.allocator.num_used * self.block_size

    @property
    def stored_tokens(self) -> int:
        return sum(self.allocator.lengths.values())


def kv_waste(cache: ContiguousKVCache | PagedKVCache) -> float:
    """Share of reserved token slots that hold no token: (reserved - stored) / reserved."""
    reserved = cache.reserved_tokens
    return (reserved - cache.stored_tokens) / reserved if reserved else 0.0


def sequences_that_fit(
    cfg: ModelConfig, memory_bytes: int, seq_len: int, layout: str, block_size: int = 16, max_len: int | None = None
) -> int:
    """How many sequences of `seq_len` tokens fit in `memory_bytes` of KV memory under a layout."""
    per_token = kv_bytes_per_token(cfg)
    if layout == "contiguous":  # every seat pays for a whole max_len row
        return memory_bytes // (per_token * (max_len or cfg.max_seq_len))
    if layout == "paged":  # every sequence pays for the blocks it fills
        blocks = memory_bytes // (per_token * block_size)
        return blocks // -(-seq_len // block_size)
    raise ValueError(f"unknown layout {layout!r}; choose contiguous or paged")
