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

from minillm.trace import Trace
from viz.colors import FUTURE, STATE_RGB
from viz.occupancy import occupancy_grid, occupancy_labels, seat_runs

LEFT, RIGHT, TOP, BOTTOM, GAP = 64, 12, 4, 24, 2  # margins and the white line between seats, in pixels


@cache
def font(size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(str(Path(matplotlib.get_data_path()) / "fonts/ttf/DejaVuSans.ttf"), size)


def png_bytes(image: np.ndarray | Image.Image) -> bytes:
    """Fast PNG: light compression, since these images live a fraction of a second."""
    buffer = io.BytesIO()
    (image if isinstance(image, Image.Image) else Image.fromarray(image)).save(buffer, "PNG", compress_level=1)
    return buffer.getvalue()


def nice_tick_step(n: int, max_ticks: int = 10) -> int:
    """1, 2, 5, 10, 20, 50, ...: the first that puts at most `max_ticks` ticks on n steps."""
    step = 1
    while n / step > max_ticks:
        lead = step // 10 ** (len(str(step)) - 1)
        step = step * 5 // 2 if lead == 2 else step * 2
    return step


class OccupancyRaster:
    """The occupancy chart of one trace, painted once for the whole run and then revealed step by step."""

    def __init__(self, trace: Trace, width: int = 1100, axis_steps: int | None = None):
        """axis_steps: how many steps the x axis spans (default: this run's); share it to compare two runs."""
        grid, labels = occupancy_grid(trace), occupancy_labels(trace)
        self.slots, self.n = grid.shape
        self.axis_steps = max(axis_steps or 0, self.n)
        self.plot_w = width - LEFT - RIGHT
        self.row_h = int(np.clip(260 // max(self.slots, 1), 14, 40))
        self.font = font(min(15, self.row_h - 6))
        self.runs = seat_runs(grid, labels)
        # pixel column -> the step it shows (several steps share a pixel when the run is long)
        step_of_px = np.arange(self.plot_w) * self.axis_steps // self.plot_w
        self.px_of_step = np.searchsorted(step_of_px, np.arange(self.axis_steps + 1))  # first pixel of each step
        padded = np.full((self.slots, self.axis_steps), FUTURE, dtype=grid.dtype)  # after the run ends: blank
        padded[:, : self.n] = grid
        rows = STATE_RGB[padded[:, step_of_px]]  # (slots, plot_w, 3)
        rows = np.repeat(rows, self.row_h, axis=0).reshape(self.slots, self.row_h, self.plot_w, 3)
        rows[:, self.row_h - GAP :] = 255
        height = TOP + self.slots * self.row_h + BOTTOM
        canvas = np.full((height, width, 3), 255, dtype=np.uint8)
        self.plot_bottom = TOP + self.slots * self.row_h
        canvas[TOP : self.plot_bottom, LEFT : LEFT + self.plot_w] = rows.reshape(-1, self.plot_w, 3)
        self.full = canvas
        self.axes = self._axes_image(height, width)

    def _axes_image(self, height: int, width: int) -> np.ndarray:
        """Seat names and step ticks: drawn once, pasted under every frame."""
        image = Image.new("RGB", (width, height), "white")
        draw = ImageDraw.Draw(image)
        for seat in range(self.slots):
            y = TOP + seat * self.row_h + (self.row_h - GAP) / 2
            draw.text((LEFT - 6, y), f"seat {seat}", fill="#333333", font=font(12), anchor="rm")
        tick = nice_tick_step(self.axis_steps)
        for step in range(0, self.axis_steps, tick):
            x = LEFT + self.px_of_step[step]
            draw.line([(x, self.plot_bottom), (x, self.plot_bottom + 4)], fill="#555555")
            draw.text((x, self.plot_bottom + 5), str(step), fill="#333333", font=font(11), anchor="mt")
        return np.asarray(image).copy()

    def frame(self, upto: int) -> Image.Image:
        """The chart with steps 0..upto filled in, a cursor at upto, and one label per visible run."""
        upto = int(np.clip(upto, 0, self.n - 1))
        cut = LEFT + self.px_of_step[upto + 1]
        image = self.axes.copy()
        image[TOP : self.plot_bottom, LEFT:cut] = self.full[TOP : self.plot_bottom, LEFT:cut]
        image[TOP : self.plot_bottom, max(LEFT, cut - 1) : cut + 1] = 0  # the "now" cursor
        picture = Image.fromarray(image)
        draw = ImageDraw.Draw(picture)
        for seat, first, last, rid, held in self.runs:
            if first > upto:
                continue
            x0, x1 = LEFT + self.px_of_step[first], LEFT + self.px_of_step[min(last, upto) + 1]
            options = [f"{rid} done, seat held", rid] if held else [rid]
            text = next((t for t in options if draw.textlength(t, font=self.font) + 6 <= x1 - x0), None)
            if text:
                y = TOP + seat * self.row_h + (self.row_h - GAP) / 2
                draw.text(((x0 + x1) / 2, y), text, fill="#7a1f1f" if held else "white", font=self.font, anchor="mm")
        return picture
