"""A running server's last steps, kept up to date by small polls, and what the live view shows of them.

The app watches `python -m minillm serve` through GET /trace a few times a second. Asking for the
whole window every time would make the server serialize hundreds of steps per poll while its engine
waits (both live in one Python process), so after the first poll the app asks only for the steps
after the newest one it has (`?since_step=K`), and LiveWindow merges each reply into what it holds:

    reply: a trace window (steps renumbered from 0, config["first_step"] = the real number of its step 0)
      -> its steps and requests put back on the server's step numbers
      -> steps appended (beyond the last `keep`, the oldest go, and the requests only they concerned)
      -> trace(): the kept steps as a window again (minillm/serving/trace_window.py), read like any trace

However long the workshop runs, it holds `keep` steps and the requests alive in them: memory stays bounded.
"""

from __future__ import annotations

import re
import zlib
from collections import deque
from dataclasses import replace

import numpy as np

from minillm.layers.trace import RequestRecord, StepRecord, Trace
from minillm.model.tokenizer import decode
from minillm.runs.metrics import percentiles
from minillm.serving.trace_window import window
from viz.colors import REQUEST_PALETTE
from viz.player import Reply, TracePlayer
from viz.table import TraceTable, table_of
from viz.timeline import busy_per_step

STEP_FIELDS = ("arrival_step", "admit_step", "first_token_step", "finish_step")
SINCE_START = ("arrival_step", "admit_step", "first_token_step")  # a window clips these to its first step
STATUS_ORDER = {"running": 0, "preempted": 1, "waiting": 2}  # then everything that has ended


class LiveWindow:
    def __init__(self, keep: int = 300):
        if keep < 1:
            raise ValueError(f"keep must be at least 1 step, got {keep}")
        self.keep = keep
        self.config: dict | None = None  # the server's (without first_step); None: no reply yet
        self.steps: deque[StepRecord] = deque(maxlen=keep)  # on the server's step numbers
        self.requests: dict[str, RequestRecord] = {}  # id -> record, on the server's step numbers
        self.next_step = 0  # the number the server's next step will have, as of the last reply

    @property
    def since_step(self) -> int | None:
        """Ask for the steps after this one (None: nothing held yet, ask for the last `keep`)."""
        return self.steps[-1].step if self.steps else None

    def add(self, reply: Trace) -> int:
        """Merge one reply of GET /trace; returns how many new steps it brought."""
        first = reply.config.get("first_step", 0)
        config = {k: v for k, v in reply.config.items() if k != "first_step"}
        if self.config is not None and (config != self.config or first < self.next_step):
            self.clear()  # another server, or the same one restarted (its steps count from 0 again)
        if self.steps and reply.steps and first != self.steps[-1].step + 1:
            self.steps.clear()  # more than `keep` steps since the last poll: a window must be consecutive
        self.steps.extend(replace(s, step=s.step + first) for s in reply.steps)  # (the deque drops the oldest)
        for r in reply.requests:
            self.requests[r.id] = self._unclipped(r, first)
        self.config = config
        self.next_step = first + len(reply.steps)
        self._forget_old_requests()
        return len(reply.steps)

    def clear(self) -> None:
        self.config, self.next_step = None, 0
        self.steps.clear()
        self.requests.clear()

    def trace(self) -> Trace | None:
        """The kept steps and their requests as a trace window (steps from 0, config["first_step"])."""
        if self.config is None:
            return None
        first = self.steps[0].step if self.steps else self.next_step
        return window(self.config, list(self.requests.values()), list(self.steps), first)

    def _unclipped(self, r: RequestRecord, first: int) -> RequestRecord:
        """r on the server's step numbers. A reply shows what happened before its first step as happening at
        that step; an earlier reply saw it at its real step (or closer), so the earliest value seen wins."""
        real = {name: None if getattr(r, name) is None else getattr(r, name) + first for name in STEP_FIELDS}
        old = self.requests.get(r.id)
        if old is not None:
            for name in SINCE_START:
                known = [v for v in (getattr(old, name), real[name]) if v is not None]
                real[name] = min(known, default=None)
        return replace(r, **real)

    def _forget_old_requests(self) -> None:
        """Keep the requests still alive, or finished within the kept steps, or named by one of them."""
        first = self.steps[0].step if self.steps else self.next_step
        named = {entry[1] for s in self.steps for entry in s.seats}  # (a held seat names a finished request)
        wanted = lambda rid, r: r.finish_step is None or r.finish_step >= first or rid in named
        self.requests = {rid: r for rid, r in self.requests.items() if wanted(rid, r)}


def live_colors(ids) -> dict[str, str]:
    """A colour per request that stays put while the window slides (request_colors goes by the request's place
    in the list, which shifts as old requests leave): by the number in the server's id ("r17"), else a hash."""
    number = lambda rid: int(m.group()) if (m := re.search(r"\d+$", rid)) else zlib.crc32(rid.encode())
    return {rid: REQUEST_PALETTE[number(rid) % len(REQUEST_PALETTE)] for rid in ids}


def live_player(
    trace: Trace, keep: int, width: int = 1200, text_px: int = 12, height: int | None = None
) -> TracePlayer:
    """The window's player: its chart spans `keep` steps however few there are yet (the newest at the right
    once it is full, its axis in the server's step numbers), and request colours do not change from one poll to the
    next. width, text_px, height: the chart's (TracePlayer)."""
    colors = live_colors(r.id for r in trace.requests)
    return TracePlayer(trace, width, axis_steps=keep, text_px=text_px, height=height, colors=colors)


def window_figures(source: Trace | TraceTable) -> dict:
    """The window's figures: tokens/s over its span, seats busy now and on average, the queue, TTFT of the
    requests that got their first token in the window, the gaps between two tokens of one reply, KV blocks."""
    table = table_of(source)
    start_s = table.time_s[0] - table.wall_s[0]
    span_s = float(table.time_s[-1] - start_s)
    ttft = [
        r.first_token_s - r.arrival_s
        for r in table.requests
        if r.first_token_s is not None and r.arrival_s is not None and r.first_token_s >= start_s
    ]
    busy = busy_per_step(table)
    ttft_p, itl_p = percentiles(ttft, (50, 90)), percentiles(token_gaps(table), (50, 99))
    return {
        "span_s": span_s,
        "tokens_per_s": int(table.tokens.sum()) / span_s if span_s > 0 else None,
        "busy_now": int(busy[-1]),
        "busy_share": float(busy.sum() / (table.num_steps * table.num_seats)),
        "waiting": int(table.num_waiting[-1]),
        "ttft_p50_s": ttft_p["p50"],
        "ttft_p90_s": ttft_p["p90"],
        "itl_p50_s": itl_p["p50"],
        "itl_p99_s": itl_p["p99"],
        "kv_blocks_used": int(table.kv["stored"][-1] + table.kv["reserved"][-1]),
        "kv_blocks_total": int(table.kv["total"][-1]),
    }


def token_gaps(table: TraceTable) -> list[float]:
    """Seconds between consecutive tokens of one reply, over every reply (metrics.inter_token_gaps, from the
    table's entries: those that made tokens, by request and then by step)."""
    seats = table.entries
    made = np.flatnonzero(seats.produced > 0)
    order = made[np.lexsort((seats.step[made], seats.request[made]))]
    at, who = table.time_s[seats.step[order]], seats.request[order]
    same = who[1:] == who[:-1]
    return (at[1:] - at[:-1])[same].tolist()


def live_replies(player: TracePlayer, limit: int = 16, tail: int = 48) -> tuple[list[Reply], int]:
    """Each request of the window as it stands at the newest step, the ones that matter now first: running
    (by seat), back in the queue, waiting (in queue order), then the ones that ended, newest first. At most
    `limit` of them, and how many more there are. A reply is its tokens so far (the snapshot's, not only those
    made in the window), cut to its last `tail` characters: the end is where the typing happens."""
    table, step = player.table, player.last_step
    seat_of = {table.requests[i].id: seat for seat, i in enumerate(table.occupant[:, step].tolist()) if i >= 0}
    place = {rid: i for i, rid in enumerate(table.waiting[step])}  # the queue's head, in order
    rows = []
    for i, r in enumerate(table.requests):
        # (one that arrived after the newest step is in the queue now; the next step will say so)
        status = table.status_name(i, step) if r.arrival_step <= step else "waiting"
        rank = STATUS_ORDER.get(status, len(STATUS_ORDER))
        within = seat_of.get(r.id, 0) if status == "running" else place.get(r.id, len(place))
        ended = -(r.finish_step if r.finish_step is not None else r.arrival_step)  # the newest first
        text = decode(r.output_ids)
        text = text if len(text) <= tail else "…" + text[-tail:]
        reply = Reply(r.id, player.colors[r.id], status, player.prompts[i], text)
        rows.append(((rank, within, ended, i), reply))
    rows.sort(key=lambda row: row[0])
    return [reply for _, reply in rows[:limit]], max(0, len(rows) - limit)
