"""KV caches: where each sequence's keys and values live between decode steps.

Without a cache every new token re-reads the whole prompt and reply through the model.
With one, a step only computes the new tokens and reads the rest back from memory.

ContiguousKVCache is the pre-paging design: each seat reserves one row of `max_len`
positions per layer up front, whether or not its sequence ever grows that long.
PagedKVCache keeps one shared pool of small blocks and hands them out as sequences grow
(see blocks.py), so memory holds real tokens, not reservations. PagedKVBooks is its
bookkeeping alone (the allocator and what a scheduler may ask) without any tensors: what a
simulated card needs, whose pool would be gigabytes.

Both follow one protocol, used by the engine and the model's attention layers:
    positions = cache.prepare(seats, num_new)   # before a forward: who, and how many new tokens
    out = cache.attend(layer, q, k, v)          # inside it: store this step's k/v, attend over all
    cache.free(seat)                            # the sequence left: its memory is reusable
`num_new` is one number (every row runs as many tokens: a (B, T) rectangle) or one per row
(a ragged step, see packing.py: rows laid end to end as (1, N), attending in groups of equal length).
"""

from __future__ import annotations

import torch

from minillm.config import ModelConfig
from minillm.engine.packing import RaggedRows
from minillm.engine.paged_books import PagedKVBooks, row_counts
from minillm.errors import InputError
from minillm.model.attention import paged_gather


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
        self._rows: RaggedRows | None = None
        self._seats: torch.Tensor | None = None  # (R,) seat of each row

    def prepare(self, seats: list[int], num_new: int | list[int], padding_rows: int = 0) -> torch.Tensor:
        """Make room for each seat's new tokens after what it stores. Returns their positions:
        (B, T) when num_new is one number, else (1, N) with the rows laid end to end."""
        counts = row_counts(seats, num_new)
        for seat, n in zip(seats, counts):
            if self.lengths[seat] + n > self.max_len:
                raise InputError(
                    f"seat {seat} would hold {self.lengths[seat] + n} tokens, "
                    f"more than its reserved row of {self.max_len}"
                )
        starts = [self.lengths[s] for s in seats]
        for seat, n in zip(seats, counts):
            self.lengths[seat] += n
        rectangle = isinstance(num_new, int) and not padding_rows
        self._rows = RaggedRows(starts, counts, padding_rows, rectangle, self.k.device)
        self._seats = torch.tensor([seats[i] for i in self._rows.copy_of], device=self.k.device)
        return self._rows.positions.view(self._rows.shape)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q (B, T, H, D); k, v (B, T, Hkv, D) for the new tokens. Returns (B, T, H, D)."""
        rows, k_rows, v_rows = self._rows, self.k[layer], self.v[layer]  # (seats, max_len, Hkv, D)
        k_rows[self._seats[rows.row_of_token], rows.positions] = k.flatten(0, 1)  # each new token at (seat, position)
        v_rows[self._seats[rows.row_of_token], rows.positions] = v.flatten(0, 1)
        span = int(rows.positions.max()) + 1  # longest context in this batch
        keys_of = lambda group: (k_rows[self._seats[group], :span], v_rows[self._seats[group], :span])
        return rows.attend_by_group(q.flatten(0, 1), keys_of, lambda keys: span).view(q.shape)

    def free(self, seat: int) -> None:
        """Forget a seat's tokens. Its row stays reserved: that is the contiguous layout's cost."""
        self.lengths[seat] = 0

    # --- what a scheduler asks -----------------------------------------------------------------
    # A seat's row was paid for when the cache was built, so admitting or growing costs no blocks.
    def blocks_to_admit(self, num_tokens: int, token_ids: list[int] | None = None, leaving: list[int] = ()) -> int:
        return 0

    def blocks_to_grow(self, seat: int, num_new: int = 1) -> int:
        return 0

    def blocks_held(self, seat: int) -> int:
        return 0

    def cached_prefix(self, token_ids: list[int]) -> int:
        return 0  # no sharing: every seat has its own row

    def can_ever_hold(self, num_tokens: int) -> bool:
        return num_tokens <= self.max_len

    @property
    def free_blocks(self) -> int:
        return self.num_blocks  # never the limit: seats are

    # --- what the engine asks ------------------------------------------------------------------
    def claim_prefix(self, seat: int, token_ids: list[int]) -> int:
        return 0

    def commit(self, seat: int, token_ids: list[int]) -> None:
        pass

    def block_map(self, seats: list[int]) -> dict[int, list[int]]:
        """Blocks of memory each given seat holds: its whole row, however few tokens it stores."""
        first = {s: s * self.blocks_per_seat for s in seats}
        return {s: list(range(first[s], first[s] + self.blocks_per_seat)) for s in seats}

    def blocks_in_use(self, seats: list[int]) -> int:
        return len(seats) * self.blocks_per_seat

    def seat_tokens(self, seat: int) -> int:
        return self.lengths[seat]

    @property
    def cached_free_blocks(self) -> int:
        return 0

    def cached_free_block_ids(self) -> list[int]:
        return []

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


class PagedKVCache(PagedKVBooks):
    def __init__(
        self,
        cfg: ModelConfig,
        num_blocks: int,
        block_size: int = 16,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        prefix_caching: bool = False,
    ):
        super().__init__(num_blocks, block_size, prefix_caching)
        self.cfg = cfg
        shape = (cfg.n_layers, num_blocks, block_size, cfg.n_kv_heads, cfg.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)  # (L, num_blocks, block_size, Hkv, D)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self._rows: RaggedRows | None = None
        self._slot_mapping: torch.Tensor | None = None  # (N,) flat pool slot of each new token
        self._block_tables: torch.Tensor | None = None  # (R, max_blocks) one table per row

    def prepare(self, seats: list[int], num_new: int | list[int], padding_rows: int = 0) -> torch.Tensor:
        """Give each seat blocks for its new tokens; build block tables and the slot mapping. Returns the
        new tokens' positions: (B, T) when num_new is one number, else (1, N) with the rows laid end to end."""
        starts = super().prepare(seats, num_new, padding_rows)
        device, rectangle = self.k.device, isinstance(num_new, int) and not padding_rows
        rows = self._rows = RaggedRows(starts, row_counts(seats, num_new), padding_rows, rectangle, device)
        tables = [self.allocator.tables[seats[i]] for i in rows.copy_of]
        width = max(len(t) for t in tables)
        padded = [t + [0] * (width - len(t)) for t in tables]  # pad with any valid id: masked anyway
        self._block_tables = torch.tensor(padded, device=device)  # (R, max_blocks)
        if rectangle:
            positions = rows.positions.view(rows.shape)  # (B, T)
            self._slot_mapping = slot_mapping(self._block_tables, positions, self.block_size)
        else:  # one table row per token
            per_token = self._block_tables[rows.row_of_token]  # (N, max_blocks)
            self._slot_mapping = slot_mapping(per_token, rows.positions[:, None], self.block_size)
        return rows.positions.view(rows.shape)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q (B, T, H, D); k, v (B, T, Hkv, D) for the new tokens. Returns (B, T, H, D)."""
        k_pool, v_pool = self.k[layer], self.v[layer]  # (num_blocks, block_size, Hkv, D)
        k_pool.view(-1, *k_pool.shape[2:])[self._slot_mapping] = k.flatten(0, 1)  # scatter into slots
        v_pool.view(-1, *v_pool.shape[2:])[self._slot_mapping] = v.flatten(0, 1)
        tables = self._block_tables
        keys_of = lambda group: (paged_gather(k_pool, tables[group]), paged_gather(v_pool, tables[group]))
        return self._rows.attend_by_group(q.flatten(0, 1), keys_of, lambda keys: keys.shape[1]).view(q.shape)


def kv_waste(cache: ContiguousKVCache | PagedKVBooks) -> float:
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
