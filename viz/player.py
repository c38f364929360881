"""Everything the app shows at one moment of a trace, precomputed once per trace so a frame is cheap.

A TracePlayer holds one run; a Timeline says which step of each run the player shows. The tiny
model's runs advance together a step at a time (the lessons count in steps). A simulated card's
runs advance together in simulated seconds: there a continuous step, with its newcomers' prompt
chunks, takes longer than a static one, and arrivals come at times, not steps, so comparing two
runs at the same step number would compare different moments.

Per frame, nothing reads the trace: the pictures are revealed from rasters painted once, the figures
are lookups in arrays (progress.py), the requests' statuses a column of the trace's table (table.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from minillm.layers.trace import KV_MOVES, Trace
from minillm.model.tokenizer import VOCAB_SIZE, decode
from viz.budget import TokenSplit, bar_scale
from viz.colors import STALLED
from viz.events import describe, step_events
from viz.kv_blocks import blocks_per_row, kv_block_bytes, kv_block_refs, kv_blocks_rgb
from viz.progress import RunProgress
from viz.raster import TEXT_PX, OccupancyRaster, nice_tick_step, png_bytes
from viz.table import NOT_ARRIVED, table_of

WAITING_SHOWN = 24  # queue chips drawn; the rest is a count


@dataclass
class Reply:
    id: str
    color: str
    status: str
    prompt: str
    text: str  # the reply so far
    guesses: tuple[str, str, str] | None = None  # speculative decoding, this step: (guesses kept, the model's own
    # token after them, guesses rejected); the first two end `text`
    allowed: tuple[int, int] | None = None  # a constrained row that picked this step: (tokens its mask allowed, of
    # how many)
    constrained: bool = False  # a constraint holds this reply to a pattern
    service: str = ""  # HTML after its status: its class and whether it met its targets (viz/targets.py)


@dataclass
class Frame:
    step: int  # this trace's step (a shorter run stays on its last step)
    occupancy_png: bytes
    kv_png: bytes | None  # the block map; None when the run recorded no block tables (a simulated card)
    kv: dict[str, int]  # kv_blocks.kv_memory: the pool in blocks (for a bar)
    shared_blocks: int  # blocks in two or more requests' tables (prefix caching, n replies; 0 without a block map)
    tokens: TokenSplit  # this step's tokens: decode, prefill, padding
    metrics: dict  # progress.RunProgress.at(step)
    waiting: list[str]  # the head of the queue
    event: str  # what happened in this step, in a line (events.py): "seat 2 freed, E admitted"
    replies: list[Reply]  # requests that have arrived, in workload order (none for a simulated card's placeholders)
    not_arrived: int
    allowed: dict[str, int]  # constrained rows that picked this step: request id -> tokens their masks allowed
    marks: dict[str, str] = field(default_factory=dict)  # request id -> HTML after its queue chip (viz/targets.py)
    more_figures: list[tuple[str, str, str, str]] = field(default_factory=list)  # after the panel's figures
    moves: dict[str, int] = field(default_factory=dict)  # the trace's kv_moves counted: blocks copied, written to
    # host memory, loaded from it this step (marked on the block map)


class TracePlayer:
    legend_items: tuple[str, ...] = ()  # HTML after the seat states in the seat charts' legend (viz/targets.py)

    def __init__(self, trace: Trace, width: int = 1100, axis_steps: int | None = None,
                 axis_seconds: float | None = None, text_px: int = TEXT_PX, height: int | None = None,
                 colors: dict[str, str] | None = None):  # fmt: skip
        """axis_steps / axis_seconds: the span of the occupancy chart's x axis, shared by the runs shown together;
        text_px: the chart's smallest lettering (the presenter view's is larger); height: the chart's, in pixels;
        colors: request id -> colour (default: the table's, by the request's place in the workload)."""
        if not trace.steps:
            raise ValueError("this trace has no steps to replay (were all its requests rejected?)")
        self.trace = trace  # (for downloads: every picture reads the table)
        self.table = table = table_of(trace)
        self.last_step = table.num_steps - 1
        self.simulated = table.config.get("clock") == "simulated"
        self.colors = colors or table.colors
        self.occupancy = self.seat_chart(table, width, axis_steps, axis_seconds, text_px, height)
        self.text_px = text_px  # the chart's smallest lettering, in its pixels
        self.kv_cell = int(np.clip(width // blocks_per_row(table), 5, 16))
        self.has_block_map = table.has_block_map
        self.moves = [step.kv_moves for step in trace.steps]  # (the table keeps none: a column of the trace's own)
        self.move_kinds = [k for k in KV_MOVES if any(k in moves for moves in self.moves)]  # (the caption's line)
        self.has_sharing = bool(table.config.get("prefix_caching")) or any(map(shares, table.kv_tables))
        self.has_stalled = bool((table.entries.state == STALLED).any())
        self.kv_block_bytes = kv_block_bytes(table)  # for a pool drawn as a bar: its size in GiB
        self.progress = RunProgress(table)
        self.budget, self.bar_tokens = table.budget, bar_scale(table)
        self.prompts = [r.prompt or decode(r.prompt_ids) for r in table.requests]
        self.carried = np.zeros(len(table.requests), dtype=int)  # reply tokens each request brought from elsewhere
        self.summary = table.summary  # the whole run, for comparisons

    def seat_chart(self, table, width, axis_steps, axis_seconds, text_px, height) -> OccupancyRaster:
        """The seat chart, painted once and revealed frame by frame (a fleet's marks it: viz/fleet.py)."""
        return OccupancyRaster(table, width, axis_steps, axis_seconds, text_px=text_px, height=height)

    @property
    def end_s(self) -> float:
        return float(self.progress.end_s[-1])

    def frame(self, step: int) -> Frame:
        step = int(np.clip(step, 0, self.last_step))
        table = self.table
        kv_png, shared = None, 0
        if self.has_block_map:
            kv_png = png_bytes(kv_blocks_rgb(table, step, self.kv_cell, self.colors, moves=self.moves[step]))
            shared = int((kv_block_refs(table, step) > 1).sum())
        arrived = np.flatnonzero(table.status[:, step] != NOT_ARRIVED).tolist()
        metrics = self.progress.at(step)
        return Frame(
            step=step,
            occupancy_png=png_bytes(self.occupancy.frame(step)),
            kv_png=kv_png,
            kv=table.kv_memory(step),
            shared_blocks=shared,
            tokens=TokenSplit(*map(int, table.splits[step])),
            metrics=metrics,
            waiting=list(table.waiting[step][:WAITING_SHOWN]),
            event=describe(step_events(table, step), metrics["busy_seats"]),
            replies=[] if self.simulated else self.replies(step, arrived),
            not_arrived=len(table.requests) - len(arrived),
            allowed=dict(table.allowed[step]),
            moves={name: len(blocks) for name, blocks in self.moves[step].items()},
        )

    def replies(self, step: int, arrived: list[int]) -> list[Reply]:
        table = self.table
        made, produced = table.made_at(step), table.produced(step) + self.carried
        guesses, allowed, constrained = table.guesses.get(step, {}), table.allowed[step], table.constrained
        out = []
        for i in arrived:
            r = table.requests[i]
            reply = Reply(r.id, self.colors[r.id], table.status_name(i, step), self.prompts[i],
                          decode(r.output_ids[: produced[i]]), constrained=r.id in constrained)  # fmt: skip
            if r.id in guesses:
                draft, kept = guesses[r.id]
                own = r.output_ids[produced[i] - made[r.id] + kept : produced[i]]  # (none when it was the EOS)
                reply.guesses = (decode(draft[:kept]), decode(own), decode(draft[kept:]))
            if r.id in allowed:
                reply.allowed = (allowed[r.id], VOCAB_SIZE)
            out.append(reply)
        return out


def shares(tables: dict[str, list[int]]) -> bool:
    """Whether a block sits in two tables (n replies to one prompt share theirs without prefix caching too)."""
    held = [block for blocks in tables.values() for block in blocks]
    return len(set(held)) < len(held)


@dataclass(frozen=True)
class Timeline:
    """The player's positions 0..last, and the step each run shows at a position.

    unit "step": position = step (a run that has finished stays on its last step).
    unit "s": position x tick_s = a moment on the simulated clock; each run shows the last step
    it had started by then.
    """

    unit: str
    last: int
    tick_s: float = 1.0

    @classmethod
    def of(cls, players: list[TracePlayer]) -> Timeline:
        if players and all(p.simulated for p in players):
            end = max(p.end_s for p in players)
            tick = float(nice_tick_step(end, 1000))  # at most about a thousand positions to play through
            return cls("s", int(np.ceil(end / tick - 1e-9)), tick)
        return cls("step", max((p.last_step for p in players), default=0))

    def step_of(self, player: TracePlayer, position: int) -> int:
        if self.unit == "step":
            return min(position, player.last_step)
        started = np.searchsorted(player.progress.start_s, position * self.tick_s, side="right") - 1
        return int(np.clip(started, 0, player.last_step))

    def seconds(self, position: int) -> float:
        return position * self.tick_s

    def label(self, position: int) -> str:
        if self.unit == "step":  # steps count from 0: "of 995" read as 995 steps, one short of the notebooks' count
            return f"step {position} (of {self.last + 1} steps: 0–{self.last})"
        return f"{self.seconds(position):.{decimals(self.tick_s)}f} s of {self.seconds(self.last):.1f} s (simulated)"

    def speed_label(self, positions_per_s: float) -> str:
        if self.unit == "step":
            return f"{positions_per_s:g} step{'' if positions_per_s == 1 else 's'}/s"
        return f"{positions_per_s * self.tick_s:g} s per s"


def decimals(tick: float) -> int:
    return max(0, -int(np.floor(np.log10(tick)))) if tick < 1 else 0
