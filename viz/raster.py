"""Pictures as numpy pixels instead of matplotlib figures: the app redraws them several times a second.

A matplotlib savefig of the occupancy chart costs 100+ ms; painting a precomputed pixel
array and a few labels with PIL costs a few ms, which keeps playback smooth.
"""

from __future__ import annotations

import io
from functools import cache
from pathlib import Path

import matplotlib
import numpy as np
from PIL import Image, ImageDraw, ImageFont

from minillm.layers.trace import Trace
from viz.colors import EMPTY, FUTURE, STATE_RGB
from viz.occupancy import SEAT_ROWS, seat_runs, stacked
from viz.table import TraceTable, table_of

RIGHT, TOP, GAP = 12, 4, 2  # margins and the white line between seats, in pixels
TEXT_PX = 12  # seat names and ticks; the presenter view asks for more (the left and bottom margins grow with it)


@cache
def font(size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(str(Path(matplotlib.get_data_path()) / "fonts/ttf/DejaVuSans.ttf"), size)


def png_bytes(image: np.ndarray | Image.Image) -> bytes:
    """Fast PNG: light compression, since these images live a fraction of a second."""
    buffer = io.BytesIO()
    (image if isinstance(image, Image.Image) else Image.fromarray(image)).save(buffer, "PNG", compress_level=1)
    return buffer.getvalue()


def nice_tick_step(n: float, max_ticks: int = 10) -> float:
    """1, 2, 5, 10, 20, 50, ... (or 0.1, 0.2, 0.5, ... for spans in seconds): the first that puts at most
    `max_ticks` ticks on a span of n."""
    step = 10.0 ** np.floor(np.log10(max(n, 1e-9) / max_ticks))
    for mantissa in (1, 2, 5, 10):
        if n / (mantissa * step) <= max_ticks:
            return int(mantissa * step) if mantissa * step >= 1 else float(mantissa * step)
    return 10 * step


def row_height(slots: int) -> int:
    """Pixels per seat: 4 seats get 40 px rows; 256 seats get thin 1 px lines (the chart stays under 300 px)."""
    return int(np.clip(280 // max(slots, 1), 1, 40))


class OccupancyRaster:
    """The occupancy chart of one trace, painted once for the whole run and then revealed step by step.

    The x axis counts steps (the tiny model: every run advances a step at a time), or seconds
    (a simulated card: a static step and a continuous one take different times, so two runs are
    compared on one clock, and the gaps while the engine waits for the next arrival show empty).
    More than SEAT_ROWS seats are drawn stacked by state (occupancy.py), labelled with seat counts.
    """

    def __init__(self, source: Trace | TraceTable, width: int = 1100, axis_steps: int | None = None,
                 axis_seconds: float | None = None, text_px: int = TEXT_PX, height: int | None = None):  # fmt: skip
        """axis_steps / axis_seconds: what the x axis spans (default: this run's steps); share it to compare runs.
        text_px: the smallest lettering (seat names, ticks, request ids); height: the picture's height in pixels
        (default: row_height's rows). A window of a live server's steps is labelled with their real numbers."""
        table = table_of(source)
        states, requests = table.states, table.occupant
        self.slots, self.n = states.shape
        self.stacked = self.slots > SEAT_ROWS
        if self.stacked:
            states = stacked(states)
        self.text_px, self.left, self.bottom = text_px, round(5.4 * text_px), round(1.5 * text_px) + 6
        self.first_step = table.config.get("first_step", 0)  # (a window: the server's number of its step 0)
        self.plot_w = width - self.left - RIGHT
        self.row_h = row_height(self.slots) if height is None else max(1, (height - TOP - self.bottom) // self.slots)
        gap = GAP if self.row_h >= 8 else 0
        names_fit = self.row_h >= text_px + 6 and not self.stacked  # a request's id no smaller than the ticks
        self.font = font(min(text_px + 3, self.row_h - 6)) if names_fit else None
        self.runs = seat_runs(states, requests) if self.font else []
        px = np.arange(self.plot_w)
        if axis_seconds is None:  # pixel -> the step it shows (several steps share a pixel when the run is long)
            self.axis = max(axis_steps or 0, self.n)
            step_of_px = px * self.axis // self.plot_w
            edges = np.searchsorted(step_of_px, np.arange(self.axis + 1))  # first pixel of each step, and the end
            self.left_px, self.right_px = edges[: self.n], edges[1 : self.n + 1]
        else:  # pixel -> the step running at that moment, or none (the engine idle, waiting for an arrival)
            end, start = table.time_s, table.time_s - table.wall_s
            self.axis = max(axis_seconds, end[-1])
            scale = self.plot_w / self.axis
            moment = (px + 0.5) / scale
            step_of_px = np.searchsorted(end, moment)  # the first step that ends at or after the moment
            running = (step_of_px < self.n) & (moment >= start[np.minimum(step_of_px, self.n - 1)])
            step_of_px = np.where(running, step_of_px, self.n)  # n: the blank column below
            self.left_px = np.floor(start * scale).astype(int)
            self.right_px = np.maximum(np.ceil(end * scale).astype(int), self.left_px + 1)
        self.seconds = axis_seconds is not None
        self.step_of_px, self.gap = np.minimum(step_of_px, self.n), gap  # (n: no step there; for marks painted on)
        padded = np.full((self.slots, self.n + 1), FUTURE, dtype=states.dtype)  # column n: idle or after the end
        padded[:, : self.n] = states
        if self.seconds:
            padded[:, self.n] = EMPTY
        rows = STATE_RGB[padded[:, np.minimum(step_of_px, self.n)]]  # (slots, plot_w, 3)
        rows = np.repeat(rows, self.row_h, axis=0).reshape(self.slots, self.row_h, self.plot_w, 3)
        if gap:
            rows[:, self.row_h - gap :] = 255
        height = TOP + self.slots * self.row_h + self.bottom
        canvas = np.full((height, width, 3), 255, dtype=np.uint8)
        self.plot_bottom = TOP + self.slots * self.row_h
        canvas[TOP : self.plot_bottom, self.left : self.left + self.plot_w] = rows.reshape(-1, self.plot_w, 3)
        self.full = canvas
        self.names = table.ids
        self.axes = self._axes_image(height, width, gap)

    def _axes_image(self, height: int, width: int, gap: int) -> np.ndarray:
        """Seat names (or, stacked, seat counts from the bottom) and ticks (steps or seconds): drawn once, pasted
        under every frame."""
        image = Image.new("RGB", (width, height), "white")
        draw = ImageDraw.Draw(image)
        left, label_font = self.left, font(self.text_px)
        if self.stacked:
            for count in np.linspace(0, self.slots, 5).round().astype(int):
                y = min(max(self.plot_bottom - count * self.row_h, TOP + self.text_px // 2), self.plot_bottom - 4)
                draw.line([(left - 4, y), (left, y)], fill="#555555")
                draw.text((left - 6, y), str(count), fill="#333333", font=label_font, anchor="rm")
        else:
            every = max(1, -(-(self.text_px + 2) // self.row_h))  # seat names at least a line apart
            for seat in range(0, self.slots, every):
                y = max(self.text_px * 0.6, TOP + seat * self.row_h + (self.row_h - gap) / 2)  # (keep the first in)
                draw.text((left - 6, y), f"seat {seat}", fill="#333333", font=label_font, anchor="rm")
        for x, label in self.ticks():
            draw.line([(x, self.plot_bottom), (x, self.plot_bottom + 4)], fill="#555555")
            draw.text((x, self.plot_bottom + 5), label, fill="#333333", font=label_font, anchor="mt")
        return np.asarray(image).copy()

    def ticks(self) -> list[tuple[int, str]]:
        """(x pixel, label) of each tick: round steps (a live window's in the server's numbers) or seconds, as many
        as fit with their labels apart."""
        widest = len(f"{self.axis:.0f} s" if self.seconds else f"{self.first_step + self.axis:,}")  # (characters)
        max_ticks = int(np.clip(self.plot_w // ((widest + 3) * 0.8 * self.text_px), 2, 10))
        tick = nice_tick_step(self.axis, max_ticks)
        tick = tick if self.seconds else max(1, int(tick))
        scale = self.plot_w / self.axis
        first = -(-self.first_step // tick) * tick - self.first_step  # a window's first round step number
        out, width = [], self.left + self.plot_w + RIGHT
        for value in np.arange(first, self.axis, tick):
            x = self.left + int(round(value * scale)) if self.seconds else self.left + int(np.ceil(value * scale))
            label = f"{value:g} s" if self.seconds else f"{int(value) + self.first_step:,}"
            if x + font(self.text_px).getlength(label) / 2 <= width:  # (a label past the picture's edge: cut)
                out.append((x, label))
        return out

    def frame(self, upto: int) -> Image.Image:
        """The chart with steps 0..upto filled in, a cursor at upto's end, and one label per visible run."""
        upto = int(np.clip(upto, 0, self.n - 1))
        cut = self.left + min(int(self.right_px[upto]), self.plot_w)
        image = self.axes.copy()
        image[TOP : self.plot_bottom, self.left : cut] = self.full[TOP : self.plot_bottom, self.left : cut]
        image[TOP : self.plot_bottom, max(self.left, cut - 1) : cut + 1] = 0  # the "now" cursor
        picture = Image.fromarray(image)
        if not self.runs:
            return picture
        draw = ImageDraw.Draw(picture)
        for seat, first, last, index, held in self.runs:
            if first > upto:
                continue
            x0, x1 = self.left + self.left_px[first], self.left + self.right_px[min(last, upto)]
            x0, x1 = self.label_span(seat, last, upto, x0, x1)
            rid = self.names[index]
            options = [f"{rid} done, seat held", rid] if held else [rid]
            text = next((t for t in options if draw.textlength(t, font=self.font) + 6 <= x1 - x0), None)
            if text:
                y = TOP + seat * self.row_h + (self.row_h - GAP) / 2
                draw.text(((x0 + x1) / 2, y), text, fill="white", font=self.font, anchor="mm")
        return picture

    def label_span(self, seat: int, last: int, upto: int, x0: int, x1: int) -> tuple[int, int]:
        """Where a run's label may go, from x0 to x1: all of it here (marks drawn on the run keep their room)."""
        return x0, x1
