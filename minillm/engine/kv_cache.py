"""KV caches: where each sequence's keys and values live between decode steps (without one, every
new token re-reads the whole prompt and reply through the model).

ContiguousKVCache is the pre-paging design: each seat reserves one row of `max_len` positions per
layer up front, whether or not its sequence ever grows that long. PagedKVCache keeps one pool of
small blocks and hands them out as sequences grow (blocks.py, paged_books.py), so memory holds
real tokens, not reservations.

Both follow one protocol, used by the engine and the model's attention layers:
    positions = cache.prepare(seats, num_new)  # before a forward: the step's plan
    out = cache.attend(layer, q, k, v)         # inside it: store this step's k/v, attend over all
    cache.free(seat)                           # the sequence left: its memory is reusable
`num_new` is one number (every row runs as many tokens: a (B, T) rectangle) or one per row (a
ragged step, packing.py: rows laid end to end as (1, N), attending in groups of equal length).
"""

from __future__ import annotations

import torch

from minillm.config import ModelConfig
from minillm.engine.packing import StepPlan
from minillm.engine.paged_books import PagedKVBooks, row_counts
from minillm.errors import InputError
from minillm.model.attention import paged_gather


def kv_bytes_per_token(cfg: ModelConfig, dtype: torch.dtype = torch.float32) -> int:
    """Memory one token occupies in the cache: a key and a value vector per kv head, per layer."""
    return cfg.n_layers * 2 * cfg.n_kv_heads * cfg.head_dim * torch.finfo(dtype).bits // 8


class ContiguousKVCache:
    def __init__(self, cfg: ModelConfig, num_seats: int, max_len=None, device="cpu", block_size=16):
        """block_size: only for accounting and drawing (each row is cut into blocks of it)."""
        self.cfg, self.num_seats, self.block_size = cfg, num_seats, block_size
        self.max_len = max_len or cfg.max_seq_len
        self.blocks_per_seat = -(-self.max_len // block_size)
        self.num_blocks = num_seats * self.blocks_per_seat
        shape = (cfg.n_layers, num_seats, self.max_len, cfg.n_kv_heads, cfg.head_dim)
        self.k = torch.zeros(shape, device=device)  # (L, seats, max_len, Hkv, D)
        self.v = torch.zeros(shape, device=device)
        self.lengths = [0] * num_seats  # tokens stored per seat
        self.plan: StepPlan | None = None

    def prepare(self, seats: list[int], num_new: int | list[int], padding_rows=0) -> torch.Tensor:
        """Make room for each seat's new tokens after what it stores; plan the step. Returns their
        positions: (B, T) when num_new is one number, else (1, N), the rows laid end to end."""
        starts, counts = [self.lengths[s] for s in seats], row_counts(seats, num_new)
        if any(start + n > self.max_len for start, n in zip(starts, counts)):  # (nothing changed)
            raise InputError(f"seats {seats} would hold more than their rows of {self.max_len}")
        for seat, n in zip(seats, counts):
            self.lengths[seat] += n
        return self.plan_rows(seats, starts, num_new, padding_rows)

    def plan_rows(self, seats: list[int], starts: list[int], num_new, padding_rows: int = 0):
        """Plan a step from its rows' starts (also a tensor-parallel worker: parallel/worker.py)."""
        span = max(start + n for start, n in zip(starts, row_counts(seats, num_new)))  # keys read
        device = self.k.device
        plan = self.plan = StepPlan(seats, starts, num_new, padding_rows, span, device)
        seat_of_token = torch.tensor([plan.seats[r] for r in plan.row_of_token], device=device)
        plan.write_at = (seat_of_token.view(plan.shape), plan.positions)  # (B, T) each
        for group in plan.groups:
            group.keys = torch.tensor([plan.seats[r] for r in group.rows], device=device)  # (G,)
        return plan.positions

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q (B, T, H, D); k, v (B, T, Hkv, D) for the new tokens. Returns (B, T, H, D)."""
        plan, span = self.plan, self.plan.num_keys  # self.k, self.v: (L, seats, max_len, Hkv, D)
        self.k[(layer, *plan.write_at)] = k  # each new token at (seat, position)
        self.v[(layer, *plan.write_at)] = v
        rows = lambda g: (self.k[layer, g.keys, :span], self.v[layer, g.keys, :span])
        return plan.attend(q, rows)

    def read_tokens(self, seat: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values of the seat's first n tokens, every layer: (L, n, Hkv, D) each."""
        return self.k[:, seat, :n].clone(), self.v[:, seat, :n].clone()

    def write_tokens(self, seat: int, k: torch.Tensor, v: torch.Tensor) -> None:  # after its own
        start, n = self.lengths[seat], k.shape[1]
        self.k[:, seat, start : start + n], self.v[:, seat, start : start + n] = k, v
        self.lengths[seat] += n

    def free(self, seat: int) -> None:  # its row stays reserved: the contiguous layout's cost
        self.lengths[seat] = 0

    def truncate(self, seat: int, num_tokens: int) -> None:
        """Keep the seat's first `num_tokens` tokens (a lookahead the model did not keep)."""
        if not 0 <= num_tokens <= self.lengths[seat]:
            held = self.lengths[seat]
            raise ValueError(f"seat {seat} holds {held} tokens: cannot keep {num_tokens}")
        self.lengths[seat] = num_tokens

    # What a scheduler asks (KVSpace): every row was reserved when the cache was built, so
    # admitting or growing takes no more blocks (seats, not blocks, are the limit) and rows share
    # nothing.
    blocks_to_admit = blocks_to_grow = blocks_held = cached_prefix = staticmethod(lambda *_: 0)
    free_blocks = property(lambda self: self.num_blocks)

    def can_ever_hold(self, num_tokens: int) -> bool:
        return num_tokens <= self.max_len

    # --- what the trace asks ---------------------------------------------------------------
    def blocks_in_use(self, seats: list[int]) -> int:
        return len(seats) * self.blocks_per_seat

    def seat_tokens(self, seat: int) -> int:
        return self.lengths[seat]

    @property
    def reserved_tokens(self) -> int:  # every seat's whole row, from the start
        return self.num_seats * self.max_len

    @property
    def stored_tokens(self) -> int:
        return sum(self.lengths)


def slot_mapping(tables: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """Flat pool slot of each new token: its block (looked up in the table) * block_size + offset.
    tables (B, max_blocks), positions (B, T) -> (B * T,)"""
    physical = tables.gather(1, positions // block_size)  # (B, T)
    return (physical * block_size + positions % block_size).flatten()


class PagedKVCache(PagedKVBooks):
    def __init__(
        self, cfg: ModelConfig, num_blocks: int, block_size=16, device="cpu", prefix_caching=False
    ):
        super().__init__(num_blocks, block_size, prefix_caching)
        self.cfg = cfg
        shape = (cfg.n_layers, num_blocks, block_size, cfg.n_kv_heads, cfg.head_dim)
        self.k = torch.zeros(shape, device=device)  # (L, blocks, block_size, Hkv, D)
        self.v = torch.zeros(shape, device=device)
        self.layers = [(self.k[i], self.v[i]) for i in range(cfg.n_layers)]  # per layer, views
        self.k_slots, self.v_slots = self.k.flatten(1, 2), self.v.flatten(1, 2)  # (L, slots, ...)
        self.plan: StepPlan | None = None

    def prepare(self, seats: list[int], num_new: int | list[int], padding_rows=0) -> torch.Tensor:
        """Give each seat blocks for its new tokens; plan the step: block tables, slot mapping,
        masks. Returns the new tokens' positions: (B, T), or (1, N) for a ragged step."""
        starts = super().prepare(seats, num_new, padding_rows)
        return self.plan_rows(seats, starts, num_new, padding_rows, self.allocator.tables)

    def plan_rows(self, seats, starts, num_new, padding_rows: int, tables: dict[int, list[int]]):
        """Plan a step from its rows' block tables (also a tensor-parallel worker, given rank 0's:
        parallel/worker.py): slot mapping, masks, each group's blocks."""
        width, device = max(len(tables[seat]) for seat in seats), self.k.device  # longest row
        keys = width * self.block_size
        plan = self.plan = StepPlan(seats, starts, num_new, padding_rows, keys, device)
        rows = [tables[seat] + [0] * (width - len(tables[seat])) for seat in plan.seats]
        padded = torch.tensor(rows, device=device)  # (R, max_blocks), padded with block 0: masked
        if plan.rectangle:  # T positions on each row's table
            slots = slot_mapping(padded, plan.positions, self.block_size)
        else:  # one position on each token's table
            token_tables = padded[torch.tensor(plan.row_of_token, device=device)]  # (N, max_blocks)
            slots = slot_mapping(token_tables, plan.positions.view(-1, 1), self.block_size)
        plan.write_at = slots.view(plan.shape)  # (B, T): each new token's flat slot in the pool
        for group in plan.groups:
            group.keys = padded[group.rows]  # (G, max_blocks): the blocks its rows read
        return plan.positions

    def token_slots(self, seat: int, start: int, n: int) -> torch.Tensor:  # (n,) flat pool slots
        table = torch.tensor(self.allocator.tables[seat], device=self.k.device)
        positions = torch.arange(start, start + n, device=self.k.device)
        return table[positions // self.block_size] * self.block_size + positions % self.block_size

    def read_tokens(self, seat: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        slots = self.token_slots(seat, 0, n)
        return self.k_slots[:, slots], self.v_slots[:, slots]

    def write_tokens(self, seat: int, k: torch.Tensor, v: torch.Tensor) -> None:  # in new blocks
        start = self.seat_tokens(seat)
        self.allocator.append(seat, k.shape[1])
        slots = self.token_slots(seat, start, k.shape[1])
        self.k_slots[:, slots], self.v_slots[:, slots] = k, v

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q (B, T, H, D); k, v (B, T, Hkv, D) for the new tokens. Returns (B, T, H, D)."""
        (k_pool, v_pool), slots = self.layers[layer], self.plan.write_at  # pools; (B, T)
        self.k_slots[layer, slots], self.v_slots[layer, slots] = k, v  # each new token's slot
        blocks = lambda g: (paged_gather(k_pool, g.keys), paged_gather(v_pool, g.keys))
        return self.plan.attend(q, blocks)
