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
    positions = cache.prepare(seats, num_new)   # before a forward: who, how many new tokens (the step's plan)
    out = cache.attend(layer, q, k, v)          # inside it: store this step's k/v, attend over all
    cache.free(seat)                            # the sequence left: its memory is reusable
`num_new` is one number (every row runs as many tokens: a (B, T) rectangle) or one per row
(a ragged step, see packing.py: rows laid end to end as (1, N), attending in groups of equal length).
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
        self.plan: StepPlan | None = None

    def prepare(self, seats: list[int], num_new: int | list[int], padding_rows: int = 0) -> torch.Tensor:
        """Make room for each seat's new tokens after what it stores; plan the step. Returns their positions:
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
        return self.plan_rows(seats, starts, num_new, padding_rows)

    def plan_rows(self, seats: list[int], starts: list[int], num_new: int | list[int], padding_rows: int = 0):
        """Plan a step whose rows start at `starts` of their seats' rows (prepare, or a tensor-parallel worker given
        the plan by rank 0: parallel/worker.py). Returns the new tokens' positions."""
        counts = row_counts(seats, num_new)
        span = max(start + n for start, n in zip(starts, counts))  # the longest context: keys each row reads
        plan = self.plan = StepPlan(seats, starts, num_new, padding_rows, span, self.k.device)
        seat_of_token = torch.tensor([plan.seats[r] for r in plan.row_of_token], device=self.k.device)
        plan.write_at = (seat_of_token.view(plan.shape), plan.positions)  # (B, T) each: (seat, position) of a token
        for group in plan.groups:
            group.keys = torch.tensor([plan.seats[r] for r in group.rows], device=self.k.device)  # (G,) its seats
        return plan.positions

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q (B, T, H, D); k, v (B, T, Hkv, D) for the new tokens. Returns (B, T, H, D)."""
        plan, span = self.plan, self.plan.num_keys  # self.k, self.v: (L, seats, max_len, Hkv, D)
        self.k[(layer, *plan.write_at)], self.v[(layer, *plan.write_at)] = k, v  # each new token at (seat, position)
        return plan.attend(q, lambda group: (self.k[layer, group.keys, :span], self.v[layer, group.keys, :span]))

    def read_tokens(self, seat: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values of the seat's first n tokens, every layer: (L, n, Hkv, D) each (a hand-over)."""
        return self.k[:, seat, :n].clone(), self.v[:, seat, :n].clone()

    def write_tokens(self, seat: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store computed keys and values (L, n, Hkv, D) after what the seat holds, as if a forward had."""
        start, n = self.lengths[seat], k.shape[1]
        self.k[:, seat, start : start + n], self.v[:, seat, start : start + n] = k, v
        self.lengths[seat] += n

    def free(self, seat: int) -> None:
        """Forget a seat's tokens. Its row stays reserved: that is the contiguous layout's cost."""
        self.lengths[seat] = 0

    def truncate(self, seat: int, num_tokens: int) -> None:
        """Keep the seat's first `num_tokens` tokens (rejected draft tokens go: the next ones overwrite them)."""
        if not 0 <= num_tokens <= self.lengths[seat]:
            raise ValueError(f"seat {seat} holds {self.lengths[seat]} tokens: cannot keep {num_tokens}")
        self.lengths[seat] = num_tokens

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
        self.layers = [(self.k[i], self.v[i]) for i in range(cfg.n_layers)]  # views: (num_blocks, block_size, Hkv, D)
        self.k_slots, self.v_slots = self.k.flatten(1, 2), self.v.flatten(1, 2)  # (L, slots, Hkv, D): where writes go
        self.plan: StepPlan | None = None

    def prepare(self, seats: list[int], num_new: int | list[int], padding_rows: int = 0) -> torch.Tensor:
        """Give each seat blocks for its new tokens; plan the step: block tables, slot mapping, masks. Returns the
        new tokens' positions: (B, T) when num_new is one number, else (1, N) with the rows laid end to end."""
        starts = super().prepare(seats, num_new, padding_rows)
        return self.plan_rows(seats, starts, num_new, padding_rows, self.allocator.tables)

    def plan_rows(self, seats: list[int], starts: list[int], num_new: int | list[int], padding_rows: int,
                  tables: dict[int, list[int]]) -> torch.Tensor:  # fmt: skip
        """Plan a step from its rows' block tables (prepare, or a tensor-parallel worker given the tables by rank 0:
        parallel/worker.py): slot mapping, masks, each group's blocks. Returns the new tokens' positions."""
        width = max(len(tables[seat]) for seat in seats)  # blocks of the longest row
        plan = self.plan = StepPlan(seats, starts, num_new, padding_rows, width * self.block_size, self.k.device)
        tables = [tables[seat] for seat in plan.seats]  # each padded to `width` with block 0: masked
        padded = torch.tensor([t + [0] * (width - len(t)) for t in tables], device=self.k.device)  # (R, max_blocks)
        if plan.rectangle:  # T positions on each row's table
            slots = slot_mapping(padded, plan.positions, self.block_size)
        else:  # one position on each token's table
            token_tables = padded[torch.tensor(plan.row_of_token, device=self.k.device)]  # (N, max_blocks)
            slots = slot_mapping(token_tables, plan.positions.view(-1, 1), self.block_size)
        plan.write_at = slots.view(plan.shape)  # (B, T): each new token's flat slot in the pool
        for group in plan.groups:
            group.keys = padded[group.rows]  # (G, max_blocks): the blocks its rows read
        return plan.positions

    def token_slots(self, seat: int, start: int, n: int) -> torch.Tensor:
        """(n,) flat pool slots of the seat's tokens start .. start + n - 1."""
        table = torch.tensor(self.allocator.tables[seat], device=self.k.device)
        positions = torch.arange(start, start + n, device=self.k.device)
        return table[positions // self.block_size] * self.block_size + positions % self.block_size

    def read_tokens(self, seat: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values of the seat's first n tokens, every layer: (L, n, Hkv, D) each (a hand-over)."""
        slots = self.token_slots(seat, 0, n)
        return self.k_slots[:, slots], self.v_slots[:, slots]

    def write_tokens(self, seat: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store computed keys and values (L, n, Hkv, D) after what the seat holds, in blocks given to it now."""
        start = self.seat_tokens(seat)  # (a prefix cache may have given it the first blocks)
        self.allocator.append(seat, k.shape[1])
        slots = self.token_slots(seat, start, k.shape[1])
        self.k_slots[:, slots], self.v_slots[:, slots] = k, v

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q (B, T, H, D); k, v (B, T, Hkv, D) for the new tokens. Returns (B, T, H, D)."""
        (k_pool, v_pool), slots = self.layers[layer], self.plan.write_at  # (num_blocks, block_size, Hkv, D); (B, T)
        self.k_slots[layer, slots], self.v_slots[layer, slots] = k, v  # each new token into its slot
        return self.plan.attend(q, lambda group: (paged_gather(k_pool, group.keys), paged_gather(v_pool, group.keys)))


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
