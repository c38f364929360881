"""Everything the app shows at one moment of a trace, precomputed once per trace so a frame is cheap.

A TracePlayer holds one run; a Timeline says which step of each run the player shows. The tiny
model's runs advance together a step at a time (the lessons count in steps). A simulated card's
runs advance together in simulated seconds: there a continuous step, with its newcomers' prompt
chunks, takes longer than a static one, and arrivals come at times, not steps, so comparing two
runs at the same step number would compare different moments.

Per frame, nothing loops over the whole trace: the pictures are revealed from rasters painted
once, the figures are lookups in arrays (progress.py), the requests' statuses need one step's seats.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minillm.engine.trace import Trace
from minillm.model.tokenizer import decode
from minillm.runs.metrics import summarize
from viz.budget import TokenSplit, bar_scale, token_budget, token_splits
from viz.colors import STALLED, request_colors
from viz.events import describe, step_events
from viz.kv_blocks import blocks_per_row, kv_block_bytes, kv_block_refs, kv_blocks_rgb, kv_memory
from viz.progress import RunProgress
from viz.raster import TEXT_PX, OccupancyRaster, nice_tick_step, png_bytes
from viz.replies import RequestStatuses
from viz.seats import seat_table

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


@dataclass
class Frame:
    step: int  # this trace's step (a shorter run stays on its last step)
    occupancy_png: bytes
    kv_png: bytes | None  # the block map; None when the run recorded no block tables (a simulated card)
    kv: dict[str, int]  # kv_blocks.kv_memory: the pool in blocks (for a bar)
    shared_blocks: int  # blocks in two or more requests' tables (prefix caching; 0 without a block map)
    tokens: TokenSplit  # this step's tokens: decode, prefill, padding
    metrics: dict  # progress.RunProgress.at(step)
    waiting: list[str]  # the head of the queue
    event: str  # what happened in this step, in a line (events.py): "seat 2 freed, E admitted"
    replies: list[Reply]  # requests that have arrived, in workload order (none for a simulated card's placeholders)
    not_arrived: int


class TracePlayer:
    def __init__(self, trace: Trace, width: int = 1100, axis_steps: int | None = None,
                 axis_seconds: float | None = None, text_px: int = TEXT_PX, height: int | None = None):  # fmt: skip
        """axis_steps / axis_seconds: the span of the occupancy chart's x axis, shared by the runs shown together;
        text_px: the chart's smallest lettering (the presenter view's is larger); height: the chart's, in pixels."""
        if not trace.steps:
            raise ValueError("this trace has no steps to replay (were all its requests rejected?)")
        table = seat_table(trace)
        self.trace = trace
        self.last_step = len(trace.steps) - 1
        self.simulated = trace.config.get("clock") == "simulated"
        self.colors = request_colors(trace)
        self.occupancy = OccupancyRaster(trace, width, axis_steps, axis_seconds, table, text_px, height)
        self.text_px = text_px  # the chart's smallest lettering, in its pixels
        self.kv_cell = int(np.clip(width // blocks_per_row(trace), 5, 16))
        self.has_block_map = any(s.kv_tables for s in trace.steps)
        self.has_stalled = bool((table.state == STALLED).any())
        self.kv_block_bytes = kv_block_bytes(trace)  # for a pool drawn as a bar: its size in GiB
        self.progress = RunProgress(trace, table)
        self.splits = token_splits(trace, table)
        self.budget, self.bar_tokens = token_budget(trace), bar_scale(trace, self.splits)
        self.statuses = RequestStatuses(trace, table)
        self.prompts = [r.prompt or decode(r.prompt_ids) for r in trace.requests]
        self.summary = summarize(trace)  # the whole run, for comparisons

    @property
    def end_s(self) -> float:
        return float(self.progress.end_s[-1])

    def frame(self, step: int) -> Frame:
        step = int(np.clip(step, 0, self.last_step))
        record = self.trace.steps[step]
        kv_png, shared = None, 0
        if self.has_block_map:
            kv_png = png_bytes(kv_blocks_rgb(self.trace, step, self.kv_cell, self.colors))
            shared = int((kv_block_refs(self.trace, step) > 1).sum())
        arrived = [i for i, r in enumerate(self.trace.requests) if r.arrival_step <= step]
        metrics = self.progress.at(step)
        return Frame(
            step=step,
            occupancy_png=png_bytes(self.occupancy.frame(step)),
            kv_png=kv_png,
            kv=kv_memory(record, self.trace.config["block_size"]),
            shared_blocks=shared,
            tokens=TokenSplit(*map(int, self.splits[step])),
            metrics=metrics,
            waiting=list(record.waiting[:WAITING_SHOWN]),
            event=describe(step_events(self.trace, step), metrics["busy_seats"]),
            replies=[] if self.simulated else self.replies(step, arrived),
            not_arrived=len(self.trace.requests) - len(arrived),
        )

    def replies(self, step: int, arrived: list[int]) -> list[Reply]:
        record = self.trace.steps[step]
        seat_state = {rid: state for _, rid, state, _, _ in record.seats}
        made = {rid: n for _, rid, _, _, n in record.seats}
        produced = self.statuses.produced(step)
        out = []
        for i in arrived:
            r = self.trace.requests[i]
            status = self.statuses.status(r, step, seat_state)
            reply = Reply(r.id, self.colors[r.id], status, self.prompts[i], decode(r.output_ids[: produced[i]]))
            if r.id in record.drafts:
                draft, kept = record.drafts[r.id], record.accepted[r.id]
                own = r.output_ids[produced[i] - made[r.id] + kept : produced[i]]  # (none when it was the EOS)
                reply.guesses = (decode(draft[:kept]), decode(own), decode(draft[kept:]))
            out.append(reply)
        return out


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
