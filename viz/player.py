"""Everything the app shows at one step of a trace, precomputed once per trace so a frame is cheap."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minillm.metrics import summarize
from minillm.tokenizer import decode
from minillm.trace import Trace
from viz.colors import request_colors
from viz.kv_blocks import blocks_per_row, kv_blocks_rgb
from viz.raster import OccupancyRaster, png_bytes
from viz.replies import produced_counts, status_at_step


@dataclass
class Reply:
    id: str
    color: str
    status: str
    prompt: str
    text: str  # the reply so far


@dataclass
class Frame:
    step: int  # this trace's step (a shorter run stays on its last step)
    occupancy_png: bytes
    kv_png: bytes
    metrics: dict  # metrics.summarize(trace, upto=step)
    waiting: list[str]
    replies: list[Reply]  # requests that have arrived, in workload order
    not_arrived: int


class TracePlayer:
    def __init__(self, trace: Trace, width: int = 1100, axis_steps: int | None = None):
        if not trace.steps:
            raise ValueError("this trace has no steps to replay (were all its requests rejected?)")
        self.trace = trace
        self.last_step = len(trace.steps) - 1
        self.colors = request_colors(trace)
        self.occupancy = OccupancyRaster(trace, width, axis_steps)
        self.kv_cell = int(np.clip(width // blocks_per_row(trace), 5, 16))
        self.produced = produced_counts(trace)
        self.summary = summarize(trace)  # the whole run, for comparisons

    def frame(self, step: int) -> Frame:
        step = int(np.clip(step, 0, self.last_step))
        replies = [
            Reply(
                id=r.id,
                color=self.colors[r.id],
                status=status_at_step(self.trace, r.id, step),
                prompt=r.prompt or decode(r.prompt_ids),
                text=decode(r.output_ids[: self.produced[r.id][step]]),
            )
            for r in self.trace.requests
            if r.arrival_step <= step
        ]
        return Frame(
            step=step,
            occupancy_png=png_bytes(self.occupancy.frame(step)),
            kv_png=png_bytes(kv_blocks_rgb(self.trace, step, self.kv_cell, self.colors)),
            metrics=summarize(self.trace, upto=step),
            waiting=list(self.trace.steps[step].waiting),
            replies=replies,
            not_arrived=len(self.trace.requests) - len(replies),
        )
