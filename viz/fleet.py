"""A fleet's engines, each drawn from its own trace, marked with what happened between them.

Each engine of a fleet writes an ordinary trace (viz/app/fleet_run.py in this process, card/fleet.py on simulated
cards); what makes them a fleet is what passed between them, and the marks say it:

  routed   a replica's trace says why the router sent it each request (config["routed"]: id -> [reason, blocks]):
           every seat run of the request gets a band of the reason's colour along its foot, and the step it arrives
           the event line says "r7 routed here: prefix hit (11 blocks)"
  handed   a prefill engine's trace ends a request "handed-over" at its first token, and the decode engine's trace
           has its copy arrive a step later: a notch in the request's colour on the end of its prefill run and on the
           start of its decode run, and for a few steps after it happens an arrowhead there, pointing at the decode
           engine; the event lines say "r3 handed over: 412 prompt tokens' KV to the decode engine" (events.py) and
           "r3's KV landed (412 prompt tokens)"

The figures a headline quotes: the share of prompt tokens the replicas' prefix caches served, and the most prompt
tokens that ran in a step in which someone was decoding (what a decoding user waited behind: lesson 13's measure).
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw

from minillm.layers.trace import Trace
from viz.colors import rgb255
from viz.events import in_words
from viz.live_window import live_colors
from viz.player import Frame, TracePlayer
from viz.raster import GAP, TOP, OccupancyRaster, font
from viz.table import TraceTable, table_of

# Why the router sent a request where it did (serving/routing.py's Choice.reason): a colour apart from the seat
# states' (orange, blue, purple, grey), its name in the legend, and what the event line says
REASONS = {
    "prefix_hit": ("#009e73", "prefix hit", "prefix hit"),  # its leading blocks are cached there
    "short_match": ("#56b4e9", "no match", "least loaded (no 2-block match)"),  # under 2 blocks cached anywhere
    "overloaded": ("#000000", "too busy", "least loaded (the cached one too busy)"),
    "least_loaded": ("#7f3c8d", "least loaded", "least loaded"),
    "round_robin": ("#888888", "round robin", "round robin"),
}
HIGHLIGHT_STEPS = 4  # a hand-over's arrowhead stays this many steps: playing at 20 steps/s draws a frame every 4


def routed(table: TraceTable) -> dict[str, tuple[str, int]]:
    """Request id -> (the router's reason, cached blocks it matched) of each request a replica served."""
    return {rid: (reason, blocks) for rid, (reason, blocks) in table.config.get("routed", {}).items()}


def seat_spans(table: TraceTable) -> dict[int, list[tuple[int, int, int]]]:
    """Request index -> its seated stretches, (seat, first step, last step), in step order."""
    entries, spans = table.entries, {}
    order = np.lexsort((entries.step, entries.seat, entries.request))  # by request, then seat, then step
    request, seat, step = entries.request[order], entries.seat[order], entries.step[order]
    new = np.ones(len(order), dtype=bool)
    new[1:] = (request[1:] != request[:-1]) | (seat[1:] != seat[:-1]) | (step[1:] != step[:-1] + 1)
    starts = np.flatnonzero(new)
    ends = np.append(starts[1:], len(order)) - 1
    for a, b in zip(starts, ends):
        spans.setdefault(int(request[a]), []).append((int(seat[a]), int(step[a]), int(step[b])))
    for runs in spans.values():
        runs.sort(key=lambda run: run[1])
    return spans


def handovers(table: TraceTable) -> list[tuple[str, int, int, int]]:
    """The hand-overs this engine's trace shows, (request id, step, seat, prompt tokens): on a prefill engine the step
    each request left (its first token made), on a decode engine the step its copy was first seated."""
    role, spans, out = table.config.get("role"), seat_spans(table), []
    if role not in ("prefill", "decode"):
        return out
    for i, r in enumerate(table.requests):
        handed = role == "decode" or r.finish_reason == "handed-over"  # (a decode engine serves only copies)
        if i not in spans or not handed:
            continue
        seat, first, last = spans[i][-1] if role == "prefill" else spans[i][0]
        out.append((r.id, last if role == "prefill" else first, seat, len(r.prompt_ids)))
    return sorted(out, key=lambda mark: mark[1])


def hit_rate(tables: list[TraceTable]) -> tuple[int, int]:
    """(prompt tokens served from a prefix cache, prompt tokens) over every request the engines served."""
    served = [r for t in tables for r in t.requests if not (r.finish_reason or "").startswith("rejected")]
    return sum(r.prompt_tokens_from_cache for r in served), sum(len(r.prompt_ids) for r in served)


def waited_behind(source: Trace | TraceTable) -> int:
    """The most prompt tokens that ran in one step in which some seat was decoding: what a decoding user waited for
    (the step's decode and prefill tokens: table.splits)."""
    splits = table_of(source).splits
    decode, prefill = splits[:, 0], splits[:, 1]
    return int(prefill[decode > 0].max(initial=0))


class FleetRaster(OccupancyRaster):
    """A seat chart with the fleet's marks: routing bands and the hand-overs' notches painted on (revealed with the
    runs), and an arrowhead drawn per frame on each hand-over of the last few steps."""

    def __init__(self, table: TraceTable, colors: dict[str, str], width: int, axis_steps: int | None, text_px: int,
                 height: int | None):  # fmt: skip
        super().__init__(table, width, axis_steps, text_px=text_px, height=height)
        self.colors, self.leaving = colors, table.config.get("role") == "prefill"
        self.marks = [] if self.stacked else handovers(table)  # (stacked: seats counted by state, none to mark)
        reasons = {} if self.stacked else routed(table)
        band, notch = max(3, self.row_h // 5), max(3, self.row_h // 8)
        for i, runs in seat_spans(table).items():
            reason = reasons.get(table.requests[i].id)
            for seat, first, last in runs if reason else []:  # a band in the reason's colour along the run's foot
                x0, x1 = self.left + self.left_px[first], self.left + self.right_px[last]
                bottom = self._row(seat)[1]
                self.full[bottom - band : bottom, x0:x1] = rgb255(REASONS[reason[0]][0])
        for rid, step, seat, _ in self.marks:  # the request's colour where it leaves, and again where it lands
            x = self.left + (self.right_px[step] if self.leaving else self.left_px[step])
            top, bottom = self._row(seat)
            self.full[top:bottom, x : x + notch] = rgb255(colors.get(rid, "#777777"))

    def _row(self, seat: int) -> tuple[int, int]:
        """A seat's rows of pixels, the white line under it left out."""
        top = TOP + seat * self.row_h
        return top, top + self.row_h - (GAP if self.row_h >= 8 else 0)

    def frame(self, upto: int) -> Image.Image:
        picture = super().frame(upto)
        draw = ImageDraw.Draw(picture)
        latest = {seat: (rid, step) for rid, step, seat, _ in self.marks if 0 <= upto - step < HIGHLIGHT_STEPS}
        for seat, (rid, step) in latest.items():  # (the newest in each seat: their names would overlap)
            self._arrowhead(draw, rid, step, seat)
        return picture

    def _arrowhead(self, draw: ImageDraw.ImageDraw, rid: str, step: int, seat: int) -> None:
        """A right-pointing arrowhead in the request's colour, outlined, and its id after it (a prompt's run, or a
        reply's first steps, are too narrow for a name): past the end of its prefill run, on the start of its decode
        run (the decode engine is the panel on the right)."""
        top, bottom = self._row(seat)
        size, middle = 0.8 * (bottom - top), (top + bottom) / 2
        base = self.left + (self.right_px[step] if self.leaving else self.left_px[step])
        points = [(base, middle - size / 2), (base + 0.8 * size, middle), (base, middle + size / 2)]
        draw.polygon(points, fill=self.colors.get(rid, "#777777"), outline="#000000", width=3)
        name_font = self.font or font(self.text_px)
        draw.text((base + 0.8 * size + 4, middle), rid, fill="#000000", font=name_font, anchor="lm")


class FleetPlayer(TracePlayer):
    """One engine of a fleet in the step player: its seat chart marked (FleetRaster), its requests in the fleet's
    colours (a request keeps its colour on every engine), and each step's event line led by what the fleet did."""

    def __init__(self, trace: Trace, colors: dict[str, str], width: int = 1100, axis_steps: int | None = None,
                 text_px: int = 12, height: int | None = None):  # fmt: skip
        self.fleet_colors = colors
        super().__init__(trace, width, axis_steps, text_px=text_px, height=height, colors=colors)
        table, self.role = self.table, self.table.config.get("role")
        self.notes: dict[int, list[str]] = {}  # step -> what the fleet did here then
        arrivals: dict[tuple[int, str], list[tuple[str, int]]] = {}  # (step, reason) -> (request, blocks matched)
        arrived = {r.id: r.arrival_step for r in table.requests}
        for rid, (reason, blocks) in routed(table).items():
            arrivals.setdefault((arrived[rid], reason), []).append((rid, blocks))
        for (step, reason), sent in sorted(arrivals.items()):
            cached = f", {'+'.join(str(b) for _, b in sent)} blocks" if reason == "prefix_hit" else ""
            who = in_words([rid for rid, _ in sent])
            self.notes.setdefault(step, []).append(f"{who} routed here: {REASONS[reason][2]}{cached}")
        if self.role == "decode":
            for r in table.requests:
                self.notes.setdefault(r.arrival_step, []).append(f"{r.id}'s KV landed ({len(r.prompt_ids)} prompt "
                                                                 "tokens)")  # fmt: skip
            made = table.produced(self.last_step)  # a copy arrives with its first token, made on the prefill engine
            self.carried = np.array([len(r.output_ids) + (r.finish_reason == "eos") for r in table.requests]) - made

    def seat_chart(self, table, width, axis_steps, axis_seconds, text_px, height) -> FleetRaster:
        return FleetRaster(table, self.fleet_colors, width, axis_steps, text_px, height)

    def frame(self, step: int) -> Frame:
        frame = super().frame(step)
        notes = self.notes.get(frame.step, [])
        if notes:
            frame.event = "; ".join(notes) + ("" if frame.event.startswith("no change") else f"; {frame.event}")
        return frame


def fleet_colors(traces: list[Trace]) -> dict[str, str]:
    """A colour per request that is the same on every engine of the fleet (by the number in its id, "r17")."""
    return live_colors({r.id for trace in traces for r in trace.requests})


def reason_counts(tables: list[TraceTable]) -> dict[str, int]:
    """How many requests the router sent for each reason, in REASONS' order (only the reasons it gave)."""
    given = [reason for t in tables for reason, _ in routed(t).values()]
    return {reason: given.count(reason) for reason in REASONS if reason in given}
