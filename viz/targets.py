"""Who goes first, drawn: each request's class, and whether it met its targets, at the step shown.

A run whose requests carry a service (a class, a priority, targets: minillm/layers/service.py, e.g. the mixed
crowd's chat users and batch jobs) is played by a ServicePlayer; any other run by the plain TracePlayer, unchanged
(`player_of` picks). On the seat chart:

  class    a pattern over every seat a request holds: the most urgent class plain, the next striped (verdicts.py)
  missed   a red band along the top of its seat from the step the miss is known (a TTFT target passed while it
           waited: the whole stay), and a red disc with a cross where it finishes
  met      a green disc with a tick where it finishes (a target is met only by finishing: verdicts.py)
  pending  nothing yet

The queue's chips get a red cross once a waiting request has missed a target; each chat window says the request's
class, targets and verdict; the panel's figures add how many met their targets so far (per class in its tooltip).
"""

from __future__ import annotations

from bisect import bisect_right
from html import escape

import numpy as np
from PIL import Image, ImageDraw

from minillm.layers.trace import Trace
from viz.colors import rgb255
from viz.html import swatch
from viz.player import Frame, TracePlayer
from viz.raster import TOP, OccupancyRaster
from viz.table import NEVER, TraceTable
from viz.verdicts import MET, MISSED, PATTERNS, PENDING, has_services, targets_words, verdicts_of

MET_COLOR, MISSED_COLOR = "#1a9850", "#b2182b"  # a green and a dark red the seat states' colours are far from
LIGHTEN = 0.45  # a striped class's stripes: the seat's colour this much of the way to white


def stripes(pattern: str, height: int, width: int, period: int) -> np.ndarray:
    """(height, width) bool: where a pattern's stripes fall ("plain": nowhere)."""
    y, x = np.ogrid[:height, :width]
    up, down = (x + y) % period < period * 0.4, (x - y) % period < period * 0.4  # "/" and "\\" (y grows downwards)
    return {"striped": up, "back-striped": down, "crossed": up | down}.get(pattern, np.zeros((height, width), bool))


class ServiceRaster(OccupancyRaster):
    """The seat chart with each request's class painted on as a pattern and its verdict as a band (both revealed
    with the runs, column by column: a column shows what was known at its step), and the finish marks drawn per
    frame. Stacked seats (a simulated card's many) count seats by state: there is no request to mark."""

    def __init__(self, table: TraceTable, verdicts, width: int, axis_steps: int | None, axis_seconds: float | None,
                 text_px: int, height: int | None):  # fmt: skip
        super().__init__(table, width, axis_steps, axis_seconds, text_px=text_px, height=height)
        self.verdicts, self.badges, self.badge_steps = verdicts, [], []
        self.disc = int(min(self.row_h - self.gap - 4, 1.15 * text_px))
        if self.stacked:
            return
        owner = np.full((self.slots, self.n + 1), -1, dtype=np.int64)
        owner[:, : self.n] = table.occupant
        owner = owner[:, self.step_of_px]  # (slots, plot_w): the request in each seat at each pixel column
        pattern = np.append([k % len(PATTERNS) if k >= 0 else 0 for k in verdicts.cls], 0)[owner]
        known, final = np.append(verdicts.known, NEVER)[owner], np.append(verdicts.final, PENDING)[owner]
        verdict = np.where(self.step_of_px[None, :] >= known, final, PENDING)
        rows, band = self.row_h - self.gap, max(3, self.row_h // 5)
        period = max(6, text_px // 2 + 4)
        for seat in range(self.slots):
            top = TOP + seat * self.row_h
            area = self.full[top : top + rows, self.left : self.left + self.plot_w]  # (a view: painted in place)
            for k in set(pattern[seat].tolist()) - {0}:
                where = stripes(PATTERNS[k], rows, self.plot_w, period) & (pattern[seat] == k)[None, :]
                area[where] = (area[where] * (1 - LIGHTEN) + 255 * LIGHTEN).astype(np.uint8)
            for code, color in ((MET, MET_COLOR), (MISSED, MISSED_COLOR)):
                area[:band, verdict[seat] == code] = rgb255(color)
        seat_at, ends = lambda i, step: np.flatnonzero(table.occupant[:, step] == i), {}
        for i in np.argsort(verdicts.finish, kind="stable"):
            step = int(verdicts.finish[i])
            if step >= self.n or verdicts.cls[i] < 0 or self.disc < 8 or not len(seat_at(i, step)):
                continue
            seat = int(seat_at(i, step)[0])  # its mark ends where its run does, after the seat's last mark
            x0 = max(self.left, self.left + int(self.right_px[step]) - self.disc - 2, ends.get(seat, 0) + 1)
            x0 = min(x0, self.left + self.plot_w - self.disc - 1)
            ends[seat] = x0 + self.disc
            self.badges.append((step, seat, x0, int(verdicts.final[i])))
            self.badge_steps.append(step)

    def label_span(self, seat: int, last: int, upto: int, x0: int, x1: int) -> tuple[int, int]:
        """A run's label keeps clear of the marks drawn on it by `upto`: those left of its middle push it right."""
        for _, at, left, _ in self.badges[: bisect_right(self.badge_steps, upto)]:
            if at == seat and left < x1 and left + self.disc > x0:
                x0, x1 = (max(x0, left + self.disc + 2), x1) if 2 * left + self.disc < x0 + x1 else (x0, min(x1, left))
        return x0, x1

    def frame(self, upto: int) -> Image.Image:
        picture = super().frame(upto)
        draw, d = ImageDraw.Draw(picture), self.disc
        for _, seat, x0, verdict in self.badges[: bisect_right(self.badge_steps, upto)]:
            top = TOP + seat * self.row_h + (self.row_h - self.gap - d) / 2
            draw.ellipse([x0, top, x0 + d, top + d], fill=MET_COLOR if verdict == MET else MISSED_COLOR,
                         outline="white", width=max(1, d // 12))  # fmt: skip
            at = lambda points, x0=x0, top=top: [(x0 + fx * d, top + fy * d) for fx, fy in points]
            line = max(2, d // 7)
            if verdict == MET:
                draw.line(at([(0.26, 0.52), (0.43, 0.7), (0.75, 0.32)]), fill="white", width=line, joint="curve")
            else:
                draw.line(at([(0.32, 0.32), (0.68, 0.68)]), fill="white", width=line)
                draw.line(at([(0.68, 0.32), (0.32, 0.68)]), fill="white", width=line)
        return picture


class ServicePlayer(TracePlayer):
    """A run whose requests carry services: its seat chart marked (ServiceRaster), its queue's chips crossed once a
    target is missed, its chat windows and figures saying who met their targets so far."""

    def __init__(self, trace: Trace, *args, **kwargs):
        self.verdicts = verdicts_of(trace)  # (before the seat chart is painted: it reads them)
        super().__init__(trace, *args, **kwargs)
        self.index = {r.id: i for i, r in enumerate(self.table.requests)}
        self.legend_items = legend_items(self.verdicts.classes)

    def seat_chart(self, table, width, axis_steps, axis_seconds, text_px, height) -> ServiceRaster:
        return ServiceRaster(table, self.verdicts, width, axis_steps, axis_seconds, text_px, height)

    def frame(self, step: int) -> Frame:
        frame = super().frame(step)
        now, v = self.verdicts.at(frame.step), self.verdicts
        frame.marks = {rid: MISSED_MARK for rid in frame.waiting if now[self.index[rid]] == MISSED}
        frame.more_figures = [targets_figure(v.counts(frame.step), v.classes)]
        for reply in frame.replies:
            i = self.index[reply.id]
            if v.cls[i] >= 0:
                reply.service = service_html(self.table.requests[i].service, int(now[i]), v.why(i, frame.step))
        return frame


def player_of(trace: Trace, *args, **kwargs) -> TracePlayer:
    """The player for a trace: a ServicePlayer when its requests carry services, else the plain TracePlayer."""
    return (ServicePlayer if has_services(trace) else TracePlayer)(trace, *args, **kwargs)


# --- the words and marks beside the chart ----------------------------------------------------------------------------
MISSED_MARK = (f'<span data-missed title="past a target it can no longer meet" style="color:{MISSED_COLOR};'
               'font-weight:700;margin-right:0.3em">✗</span>')  # fmt: skip
CSS_STRIPES = {  # a striped class's swatch, as the chart paints it (over a decode seat's blue)
    "striped": "repeating-linear-gradient(-45deg, #80b8d8 0 3px, #0072b2 3px 7px)",
    "back-striped": "repeating-linear-gradient(45deg, #80b8d8 0 3px, #0072b2 3px 7px)",
    "crossed": "repeating-linear-gradient(-45deg, #80b8d8 0 3px, transparent 3px 7px), "
    "repeating-linear-gradient(45deg, #80b8d8 0 3px, #0072b2 3px 7px)",
}


def disc(mark: str, color: str) -> str:
    return (f'<span style="display:inline-block;width:1.1em;height:1.1em;line-height:1.1em;border-radius:50%;'
            f'background:{color};color:white;text-align:center;font-size:0.85em;font-weight:700;margin-right:0.3em;'
            f'vertical-align:middle">{mark}</span>')  # fmt: skip


def legend_items(classes: list[str]) -> tuple[str, ...]:
    """The legend's words for the marks: each class's pattern (when there are several), met and missed."""
    items = []
    for k, name in enumerate(classes if len(classes) > 1 else []):
        pattern = PATTERNS[k % len(PATTERNS)]
        look = "#0072b2" if pattern == "plain" else CSS_STRIPES[pattern]
        items.append(f'<span data-class="{escape(name)}">{swatch(look)}{escape(name)}</span>')
    tip = "red band along a seat: from the step a miss was known (a TTFT target or a deadline passed)"
    items.append(f"<span data-verdict>{disc('✓', MET_COLOR)}met targets</span>")
    items.append(f'<span data-verdict title="{tip}">{disc("✗", MISSED_COLOR)}missed</span>')
    return tuple(items)


def service_html(service: dict, verdict: int, why: str) -> str:
    """A chat window's line after the status: its class and targets, and where it stands against them."""
    say = {PENDING: ("#555555", "targets pending"), MET: (MET_COLOR, "met its targets"),
           MISSED: (MISSED_COLOR, f"✗ missed: {why}")}[verdict]  # fmt: skip
    tip = f"{service.get('cls', 'default')}: {targets_words(service)}, priority {service.get('priority', 0)}"
    return (f' <span data-service="{escape(service.get("cls", "default"))}" title="{escape(tip)}" '
            f'style="color:{say[0]}">· {escape(service.get("cls", "default"))}: {escape(say[1])}</span>')  # fmt: skip


def targets_figure(counts: dict[str, dict[str, int]], classes: list[str]) -> tuple[str, str, str, str]:
    """The panel's figure: requests that met their targets so far, how many missed, and per class in the tooltip."""
    total = counts[""]
    per_class = "; ".join(f"{c}: {counts[c]['met']} met, {counts[c]['missed']} missed, {counts[c]['pending']} pending"
                          for c in classes)  # fmt: skip
    tip = f"requests that arrived, by what is known at this step ({per_class})"
    return ("met targets", str(total["met"]), f"{total['missed']} missed, {total['pending']} pending", tip)
