"""Packing a step: rows of different lengths -> one flat batch for ONE model forward.

Each step, every running request that the scheduler gave tokens is one *row*: a decode row runs
1 token (the one it produced last step), a prefill row runs a chunk of its prompt (maybe all of it).
Rows have different lengths, so they are laid end to end instead of padded to the longest:

    rows      A: decode (1)   B: decode (1)   C: prefill chunk (5)
    tokens    [a7]            [b3]            [c0 c1 c2 c3 c4]       -> (1, N) with N = 7
    positions [41]            [12]            [ 0  1  2  3  4]

The matmuls (projections, MLP) don't care where a row ends: they run over all N tokens at once,
reading each weight once. Attention does care: a token may only see its own row's keys. The caches
attend row group by row group, where a group is the rows with the same length (all decode rows
together as (G, 1); each prompt chunk as (1, T)), so no decode row is padded to a chunk's length.
Logits are needed only at each row's last token, and only rows that reach the end of their
sequence (decode rows, and a prompt's last chunk) produce a token this step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from minillm.engine.request import Request
from minillm.model.attention import attend, visible_mask


@dataclass
class Batch:
    requests: list[Request]  # one row each, in row order
    counts: list[int]  # tokens each row runs this step
    starts: list[int]  # position of each row's first new token (= tokens already in its cache)
    token_ids: list[int]  # (N,) every row's new tokens, row after row, then any padding rows
    samples: list[bool]  # True: the row ends its sequence, its last logits pick the next token
    padding_rows: int = 0  # static batching's held seats: copies of the first decode row, computed for nothing
    last_index: list[int] = field(default_factory=list)  # (R,) flat index of each row's last token

    @property
    def seats(self) -> list[int]:
        return [r.seat for r in self.requests]

    @property
    def num_tokens(self) -> int:
        return sum(self.counts)

    @property
    def sampled(self) -> list[Request]:
        return [r for r, s in zip(self.requests, self.samples) if s]


def pack(rows: list[tuple[Request, int]], padding_rows: int = 0) -> Batch:
    """Lay the rows' new tokens end to end. rows: (request, tokens it runs this step), each count >= 1.

    padding_rows: extra copies of the first decode row (1 token) to compute and throw away, as a
    fixed-shape batch does for seats whose request has finished; ignored when there is no decode row.
    """
    requests, counts = [r for r, _ in rows], [n for _, n in rows]
    starts = [r.num_computed for r in requests]
    token_ids: list[int] = []
    last_index: list[int] = []
    for request, count in rows:
        token_ids += request.pending_slice(count)
        last_index.append(len(token_ids) - 1)
    samples = [r.num_computed + n == r.num_tokens for r, n in rows]
    if 1 not in counts:
        padding_rows = 0
    if padding_rows:
        token_ids += [token_ids[last_index[counts.index(1)]]] * padding_rows
    return Batch(requests, counts, starts, token_ids, samples, padding_rows, last_index)


@dataclass
class RowGroup:
    """Rows of the same length, which attend together as one (G, T) block."""

    rows: list[int]  # row numbers (padding rows continue the numbering after the real rows)
    length: int  # T: tokens per row
    token_index: list[int] | None  # flat indices of the group's tokens, row after row; None: the whole batch in order


def row_groups(counts: list[int], padding_rows: int = 0) -> list[RowGroup]:
    """Group rows by length. Padding rows are copies of a 1-token row and join the 1-token group."""
    counts = counts + [1] * padding_rows
    starts, total = [], 0
    for n in counts:
        starts.append(total)
        total += n
    by_length: dict[int, list[int]] = {}
    for row, n in enumerate(counts):
        by_length.setdefault(n, []).append(row)
    if len(by_length) == 1:  # a rectangle (all decode rows, or one prompt): no gathering needed
        ((length, rows),) = by_length.items()
        return [RowGroup(rows, length, None)]
    return [
        RowGroup(rows, length, [starts[row] + t for row in rows for t in range(length)])
        for length, rows in by_length.items()
    ]


class RaggedRows:
    """The rows of one forward as a cache sees them: positions of every new token, and the groups that attend.

    rows_by_token gives, per token, the row it belongs to; each group's `rows` index per-row tensors
    (seats, block tables) and its `positions` are (G, T). Padding rows copy the first 1-token row."""

    def __init__(self, starts: list[int], counts: list[int], padding_rows: int, rectangle: bool, device):
        self.copy_of = list(range(len(starts)))  # row -> the row whose seat it uses (itself, or the one padding copies)
        if padding_rows:
            first = counts.index(1)
            starts, counts = starts + [starts[first]] * padding_rows, counts + [1] * padding_rows
            self.copy_of += [first] * padding_rows
        flat = [start + t for start, n in zip(starts, counts) for t in range(n)]
        self.positions = torch.tensor(flat, device=device)  # (N,)
        self.rectangle = rectangle  # (B, T) in, (B, T) out
        self.shape = (len(counts), counts[0]) if rectangle else (1, len(flat))
        self.row_of_token = torch.repeat_interleave(
            torch.arange(len(counts), device=device), torch.tensor(counts, device=device)
        )
        self.groups = []  # (token index (G*T,) or None, rows (G,), positions (G, T))
        for g in row_groups(counts):
            index = None if g.token_index is None else torch.tensor(g.token_index, device=device)
            positions = self.positions if index is None else self.positions[index]
            self.groups.append((index, torch.tensor(g.rows, device=device), positions.view(len(g.rows), g.length)))

    def attend_by_group(self, q: torch.Tensor, keys_of, mask_width) -> torch.Tensor:
        """Attention for every group. q (N, H, D); keys_of(rows) -> keys, values (G, S, Hkv, D). Returns (N, H, D)."""
        out = q if len(self.groups) == 1 else torch.empty_like(q)
        for index, rows, positions in self.groups:
            G, T = positions.shape
            q_group = (q if index is None else q[index]).view(G, T, *q.shape[1:])  # (G, T, H, D)
            keys, values = keys_of(rows)
            result = attend(q_group, keys, values, visible_mask(positions, mask_width(keys))).flatten(0, 1)
            if index is None:
                out = result
            else:
                out[index] = result
        return out
