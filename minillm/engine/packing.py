"""Packing a step: rows of different lengths -> one flat batch for ONE model forward.

Each step, every running request the scheduler gave tokens is one *row*: a decode row runs 1
token (the one it produced last step), a prefill row a chunk of its prompt (maybe all of it). Rows
have different lengths, so they are laid end to end instead of padded to the longest:

    rows      A: decode (1)   B: decode (1)   C: prefill chunk (5)
    tokens    [a7]            [b3]            [c0 c1 c2 c3 c4]       -> (1, N) with N = 7
    positions [41]            [12]            [ 0  1  2  3  4]

The matmuls (projections, MLP) don't care where a row ends: they run over all N tokens at once,
reading each weight once. Attention does care: a token may only see its own row's keys. The
caches attend group by group, a group being the rows of one length (all decode rows together as
(G, 1); each prompt chunk as (1, T)), so no decode row is padded to a chunk's length. Logits are
needed only at each row's last token, and only rows that reach the end of their sequence (decode
rows, a prompt's last chunk) produce a token. A row with a *lookahead* (tokens a layer proposed
past its end: engine.py's seams) runs them too, with logits at its last real token and each one.
"""

from __future__ import annotations

import itertools
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
    padding_rows: int = 0  # static batching's held seats: a decode row's copies, for nothing
    last_index: list[int] = field(default_factory=list)  # (R,) flat index of each row's last token
    lookahead: list[int] = field(default_factory=list)  # (R,) tokens each row runs past its end
    logit_index: list[int] = field(default_factory=list)  # flat indices where a token is picked
    logit_rows: list[int] = field(default_factory=list)  # the row of each of them

    @property
    def seats(self) -> list[int]:
        return [r.seat for r in self.requests]

    @property
    def num_tokens(self) -> int:
        return sum(self.counts)

    @property
    def sampled(self) -> list[Request]:
        return [r for r, s in zip(self.requests, self.samples) if s]

    @property
    def pickers(self) -> list[Request]:
        """(R,) whose pick each logit position is (a row with a lookahead: once per position)."""
        return [self.requests[row] for row in self.logit_rows]


def pack(rows: list[tuple[Request, int]], padding_rows: int = 0) -> Batch:
    """Lay the rows' new tokens end to end. rows: (request, tokens it runs, >= 1). padding_rows:
    copies of the first decode row to compute and throw away, as a fixed-shape batch does for
    seats whose request has finished (none without a decode row)."""
    requests, counts = [r for r, _ in rows], [n for _, n in rows]
    starts = [r.num_computed for r in requests]
    token_ids: list[int] = []
    last_index: list[int] = []
    for request, count in rows:
        token_ids += request.pending_slice(count)
        last_index.append(len(token_ids) - 1)
    samples = [r.num_computed + n >= r.num_tokens for r, n in rows]
    ahead = [max(0, r.num_computed + n - r.num_tokens) for r, n in rows]  # run past the end
    picks = [(row, last) for row, (last, s) in enumerate(zip(last_index, samples)) if s]
    logit_index = [i for row, last in picks for i in range(last - ahead[row], last + 1)]
    logit_rows = [row for row, _ in picks for _ in range(ahead[row] + 1)]
    if 1 not in counts:
        padding_rows = 0
    if padding_rows:
        token_ids += [token_ids[last_index[counts.index(1)]]] * padding_rows
    picked = dict(lookahead=ahead, logit_index=logit_index, logit_rows=logit_rows)
    return Batch(requests, counts, starts, token_ids, samples, padding_rows, last_index, **picked)


@dataclass
class RowGroup:
    """Rows of the same length, which attend together as one (G, T) block."""

    rows: list[int]  # row numbers (padding rows continue the numbering after the real rows)
    length: int  # T: tokens per row
    token_index: list[int] | None  # flat indices of its tokens, row by row; None: the whole batch
    mask: torch.Tensor | None = None  # (G, T, S) added to the scores: 0 may see a key, -inf not
    index: torch.Tensor | None = None  # token_index as a tensor
    keys: torch.Tensor | None = None  # where its rows' keys live (tables, or seats): the cache


def row_groups(counts: list[int], padding_rows: int = 0) -> list[RowGroup]:
    """Group rows by length. Padding rows copy a 1-token row and join the 1-token group."""
    counts = counts + [1] * padding_rows
    starts = [0, *itertools.accumulate(counts)]  # where each row's tokens begin
    by_length: dict[int, list[int]] = {}
    for row, n in enumerate(counts):
        by_length.setdefault(n, []).append(row)
    if len(by_length) == 1:  # a rectangle (all decode rows, or one prompt): no gathering needed
        ((length, rows),) = by_length.items()
        return [RowGroup(rows, length, None)]
    index = lambda rows, length: [starts[row] + t for row in rows for t in range(length)]
    return [RowGroup(rows, length, index(rows, length)) for length, rows in by_length.items()]


class StepPlan:
    """One forward's rows as a cache sees them, computed once per step in Python and reused by
    every layer (no layer recomputes it, none waits for a tensor's value): each row's seat, the new
    tokens' positions and rows, and the groups that attend together, with masks over `num_keys`
    keys. Padding rows copy the first 1-token row. The forward is (B, T) when num_new is one
    number (padding only with T = 1), else (1, N)."""

    def __init__(self, seats, starts, num_new: int | list[int], padding_rows, num_keys, device):
        counts = [num_new] * len(seats) if isinstance(num_new, int) else list(num_new)
        self.rectangle = isinstance(num_new, int) and (num_new == 1 or not padding_rows)
        if padding_rows:
            first = counts.index(1)
            seats = seats + [seats[first]] * padding_rows
            starts = starts + [starts[first]] * padding_rows
            counts = counts + [1] * padding_rows
        flat = [start + t for start, n in zip(starts, counts) for t in range(n)]
        self.shape = (len(counts), counts[0]) if self.rectangle else (1, len(flat))
        self.seats, self.num_keys, self.groups = seats, num_keys, row_groups(counts)  # (R,) seats
        self.positions = torch.tensor(flat, device=device).view(self.shape)  # (B, T)
        self.row_of_token = [row for row, n in enumerate(counts) for _ in range(n)]  # (N,)
        self.write_at = None  # where each new token's key and value go, shaped (B, T): the cache
        for g in self.groups:
            shape = (len(g.rows), g.length)
            if g.token_index is None:  # the whole batch, in order
                positions = self.positions.view(shape)
            else:
                positions = torch.tensor([flat[i] for i in g.token_index], device=device)
                positions = positions.view(shape)
            visible = visible_mask(positions, num_keys)
            g.mask = torch.where(visible, 0.0, float("-inf"))  # sdpa's form, once for every layer
            g.index = None if g.token_index is None else torch.tensor(g.token_index, device=device)

    def attend(self, q: torch.Tensor, keys_of) -> torch.Tensor:
        """Every group attends over its rows' keys: keys_of(group) -> keys, values (G, S, Hkv, D).
        q (B, T, H, D)."""
        if self.rectangle:  # one group: the whole batch as it is
            return attend(q, *keys_of(self.groups[0]), self.groups[0].mask)
        flat, out = q.flatten(0, 1), torch.empty_like(q).flatten(0, 1)  # (N, H, D)
        for g in self.groups:
            rows = flat if g.index is None else flat[g.index]
            q_group = rows.unflatten(0, (-1, g.length))  # (G, T, H, D)
            at = slice(None) if g.index is None else g.index
            out[at] = attend(q_group, *keys_of(g), g.mask).flatten(0, 1)
        return out.view(q.shape)
