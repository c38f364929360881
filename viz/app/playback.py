"""The step player: transport buttons, a slider, and one panel per run, redrawn frame by frame.

Every view that replays traces uses it (the tiny model's runs, a simulated card's runs). Its state
lives in st.session_state under a prefix, so each view keeps its own place and speed. Playing
redraws only the player (a fragment with a timer); a frame only looks things up in the players
(viz/player.py), so it costs the same at step 3 of the seed story and at step 20,000 of a simulated run.
"""

from __future__ import annotations

import base64
import time
from html import escape

import streamlit as st

from minillm.model.tokenizer import VOCAB_SIZE
from viz.app import presenter
from viz.html import (
    caption_html,
    event_html,
    figures_html,
    frame_html,
    kv_legend,
    kv_memory_html,
    occupancy_legend,
    queue_html,
    replies_html,
    token_budget_html,
)
from viz.player import Timeline, TracePlayer, decimals

SPEEDS = [1, 2, 5, 10, 20, 50, 100]
# positions (steps, or ticks of the simulated clock) per second of playback
FRAME_S = 0.2  # the shortest time between two frames


class Transport:
    """The player's state (position, playing, speed) in st.session_state, under a prefix per view."""

    def __init__(self, prefix: str = "", position: int = 0, speed: int = 20):
        self.prefix = prefix
        defaults = {"step": position, "playing": False, "speed": speed, "tick_at": 0.0, "carry": 0.0}
        for name, value in defaults.items():
            st.session_state.setdefault(self.key(name), value)

    def key(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def __getattr__(self, name: str):
        try:
            return st.session_state[self.key(name)]
        except KeyError:
            raise AttributeError(name) from None

    def set(self, **values) -> None:
        for name, value in values.items():
            st.session_state[self.key(name)] = value

    def interval(self) -> float:
        """Seconds between two frames: a frame per position, at most 1 / FRAME_S a second."""
        return max(FRAME_S, 1 / self.speed)

    def timer(self) -> float | None:
        return self.interval() if self.playing else None

    def due(self) -> int:
        """Positions to advance now: by the clock, not per frame, so a slow machine plays at the same speed."""
        now = time.perf_counter()
        owed = min(now - self.tick_at, 1.0) * self.speed + self.carry  # a stalled tab does not jump ahead
        steps = max(1, int(owed))
        self.set(tick_at=now, carry=owed - steps)
        return steps

    def go_to(self, position: int) -> None:
        self.set(step=position, playing=False)

    def shift(self, delta: int, last: int) -> None:
        self.go_to(min(max(self.step + delta, 0), last))

    def toggle(self, last: int) -> None:
        if not self.playing and self.step >= last:
            self.set(step=0)  # play again from the start
        self.set(playing=not self.playing, tick_at=time.perf_counter() - self.interval(), carry=0.0)


def controls(transport: Transport, timeline: Timeline) -> None:
    """Transport buttons (keyboard: Home, ← or PageUp, Space, → or PageDown: a clicker sends PageUp and PageDown),
    speed, and the position slider."""
    last, key = timeline.last, transport.key
    widths = [1, 1, 1.9, 1, 2.8, 8] if presenter.on() else [1.4, 1.4, 2.2, 1.4, 3.6, 8]  # (each holds its longest text)
    row = st.columns(widths, vertical_alignment="center")
    icon = lambda name: f":material/{name}:"
    row[0].button("", icon=icon("skip_previous"), key=key("restart"), on_click=transport.go_to, args=(0,),
                  shortcut="Home", help="to the start (Home)")  # fmt: skip
    row[1].button("", icon=icon("chevron_left"), key=key("back"), on_click=transport.shift, args=(-1, last),
                  shortcut="Left", help="a step back (← or PageUp)")  # fmt: skip
    label, symbol = ("pause", "pause") if transport.playing else ("play", "play_arrow")
    row[2].button(label, icon=icon(symbol), key=key("play"), on_click=transport.toggle, args=(last,), shortcut="Space",
                  help="play or pause (Space)")  # fmt: skip
    row[3].button("", icon=icon("chevron_right"), key=key("forward"), on_click=transport.shift, args=(1, last),
                  shortcut="Right", help="a step forward (→ or PageDown)")  # fmt: skip
    clicker_keys(transport, last, row[0])
    row[4].selectbox("speed", SPEEDS, key=key("speed"), format_func=timeline.speed_label, label_visibility="collapsed")
    if last == 0:
        return
    if timeline.unit == "step":
        row[5].slider("step", 0, last, key=key("step"), label_visibility="collapsed")
    else:  # a slider in simulated seconds, kept in step with the position
        digits = decimals(timeline.tick_s)  # (rounded, or the browser's copy differs in the last bit: a false "move")
        st.session_state[key("seconds")] = round(timeline.seconds(transport.step), digits)

        def seek() -> None:
            transport.set(step=round(st.session_state[key("seconds")] / timeline.tick_s))

        row[5].slider("time", 0.0, round(timeline.seconds(last), digits), step=timeline.tick_s, key=key("seconds"),
                      format="%.1f s", on_change=seek, label_visibility="collapsed")  # fmt: skip


CLICKER_KEYS = {"PageUp": -1, "PageDown": 1}  # a clicker's back and forward: a step, as ← and →


def clicker_keys(transport: Transport, last: int, where) -> None:
    """A button takes one shortcut: PageUp and PageDown (a presenter's clicker) get buttons of their own, in a
    container the CSS takes out of the layout and out of sight (presenter.ALWAYS); the keys still reach them."""
    keys = where.container(key=transport.key(presenter.HIDDEN_KEYS))
    for name, delta in CLICKER_KEYS.items():
        keys.button("", key=transport.key(name.lower()), on_click=transport.shift, args=(delta, last), shortcut=name,
                    help=f"a step {'back' if delta < 0 else 'forward'} ({name})")  # fmt: skip


def png_html(png: bytes, alt: str, text_px: float | None = None, chart: bool = False, hover: str = "") -> str:
    """The picture inline, as wide as its column. text_px: its smallest lettering in the PNG's pixels, for the
    browser check (docs/screenshot.py --check-lettering) to scale by the width it is shown at; chart: a seat chart
    (the presenter view caps its height on wide screens; --check-layout measures where it falls); hover: a tooltip."""
    data = base64.b64encode(png).decode()
    marks = (f' data-text-px="{text_px:g}"' if text_px else "") + (" data-chart" if chart else "")
    marks += f' title="{escape(hover)}"' if hover else ""
    style = "width:100%;display:block;object-position:left top"  # (Streamlit's scale-down: never blown up)
    return f'<img src="data:image/png;base64,{data}" alt="{alt}"{marks} style="{style}">'


def _num(value, fmt: str) -> str:
    return "–" if value is None else format(value, fmt)


TTFT_TIP = (
    "Median time to first token of the requests that have arrived. A request still waiting for its first token "
    "counts with its wait so far (a lower bound on its TTFT), so keeping people waiting does not look good."
)


def figures(player: TracePlayer, m: dict, more: list | tuple = ()) -> str:
    """The run's figures at this frame: tokens, seats busy now (the articles' figure) and so far, the queue,
    TTFT p50 (waiting requests counted by their wait so far) and TPOT p50; in steps, or simulated seconds; `more`
    after them (the frame's: who met their targets so far, viz/targets.py)."""
    still = f"{m['waiting_for_first_token']} still waiting" if m["waiting_for_first_token"] else ""
    if player.simulated:
        first = ("tokens/s so far", _num(m["tokens_per_s_so_far"], ",.0f"), "", "output tokens / simulated seconds")
        tpot_ms = None if m["tpot_p50_s"] is None else 1000 * m["tpot_p50_s"]
        ttft = ("TTFT p50, s", _num(m["ttft_p50_s"], ".2f"), still, TTFT_TIP)
        tpot = ("TPOT p50, ms", _num(tpot_ms, ".0f"), "", "time per output token, finished requests")
    else:  # (the token bar counts the tokens computed, prompt chunks included: it says how many came out)
        first = ("new tokens", str(m["tokens"]), "this step", "output tokens produced in this step")
        ttft = ("TTFT p50, steps", _num(m["ttft_p50_steps"], ".0f"), still, TTFT_TIP)
        tpot = ("TPOT p50, steps", _num(m["tpot_p50_steps"], ".1f"), "", "steps per output token, finished requests")
    return figures_html([
        first,
        ("busy now", f"{m['utilization_now']:.0%}", f"{m['busy_seats']} of {seats(player.progress.slots)}",
         "seats that ran tokens in this step"),
        ("busy so far", f"{m['utilization_so_far']:.0%}", "", "busy seat-steps / all seat-steps, up to this step"),
        ("waiting", str(m["queue_length"]), "", "arrived, no seat yet"),
        ttft,
        tpot,
        *more,
    ], widest=WIDEST_FIGURES)  # fmt: skip


WIDEST_FIGURES = ["100%", "9,999"]  # a frame's widest values: every panel, every frame, the same cells


def seats(n: int) -> str:
    return f"{n} seat{'' if n == 1 else 's'}"


def panel_html(title: str, player: TracePlayer, frame, position: int) -> str:
    """One run at one step, as HTML: its title, figures, seats, what happened this step, the step's tokens, queue,
    KV memory, replies. The presenter view puts what the room watches first (seats, the step's event, the queue:
    at 1280x720 all of it on the first screen, and the KV memory wholly under it; at 1920x1080 the KV map too), the
    figures after; the normal view the seats and the event, then the figures, tokens, queue and KV memory.
    data-step: the step it draws (its run's: a finished run stays on its last); data-position: the caption's."""
    done = ""
    if frame.step >= player.last_step:
        done = f" (done in {player.end_s:.1f} s)" if player.simulated else f" (done in {player.last_step + 1:,} steps)"
    head = (f'<div data-title="{escape(title)}" style="font-size:1.25rem;font-weight:600;line-height:1.2">'
            f"{escape(title + done)}</div>")  # fmt: skip
    alt = f"who sits in each seat, up to step {frame.step}"
    chart = png_html(frame.occupancy_png, alt, player.text_px, True, masks_hover(frame))
    event = event_html(frame.step, frame.event)
    queue = queue_html(frame.waiting, player.colors, frame.metrics["queue_length"], frame.marks)
    made = None if player.simulated else frame.metrics["tokens"]
    tokens = token_budget_html(frame.tokens, player.budget, player.bar_tokens, made)
    numbers, kv = figures(player, frame.metrics, frame.more_figures), kv_html(player, frame)
    if presenter.on():
        parts = [f"<div>{chart}{event}{queue}</div>", kv, numbers, tokens]
    else:
        parts = [f"<div>{chart}{event}</div>", numbers, tokens, queue, kv]
    if frame.replies:
        parts.append(replies_html(frame.replies, frame.not_arrived))
    else:
        m, rejected = frame.metrics, player.progress.rejected
        parts.append(f"<div><b>Requests</b>: {m['finished']} finished, {m['running']} running, {m['queue_length']} "
                     f"waiting, {frame.not_arrived} not arrived yet" + (f", {rejected} rejected" if rejected else "")
                     + "</div>")  # fmt: skip
    column = f"display:flex;flex-direction:column;gap:{0.25 if presenter.on() else 0.5}rem;min-width:0"
    return (f'<div data-panel="{escape(title)}" data-step="{frame.step}" data-position="{position}" '
            f'style="{column}">{head}{"".join(parts)}</div>')  # fmt: skip


def masks_hover(frame) -> str:
    """The seat chart's tooltip at a step where constrained rows picked: how many tokens each one's mask allowed."""
    if not frame.allowed:
        return ""
    rows = ", ".join(f"{rid} {n} of {VOCAB_SIZE}" for rid, n in frame.allowed.items())
    return f"step {frame.step}, tokens each constrained row's mask allowed: {rows}"


def kv_html(player: TracePlayer, frame) -> str:
    """The KV pool at this step: the block map (the tiny model), or a bar (a simulated card: thousands of blocks)."""
    config = player.table.config
    if frame.kv_png is None:
        return kv_memory_html(frame.kv, player.kv_block_bytes)
    sharing = ""
    if config.get("prefix_caching"):
        sharing = (f"; {frame.shared_blocks} shared by several requests, {frame.kv['cached']} free blocks "
                   "keep a cached prefix")  # fmt: skip
    elif player.has_sharing:  # (n replies to one prompt share their prompt's blocks without prefix caching too)
        sharing = f"; {frame.shared_blocks} shared by several requests"
    head = (f"<div data-kv><b>KV memory</b>: {frame.kv['stored'] + frame.kv['reserved']} of {frame.kv['total']} "
            f"blocks in use ({config['kv']}, {config['block_size']} tokens per block){sharing}</div>")  # fmt: skip
    moves = moves_html(frame.moves, player.move_kinds) if player.move_kinds else ""
    picture = png_html(frame.kv_png, f"KV blocks at step {frame.step}")
    return f"<div>{head}{moves}{picture}{kv_legend(bool(config.get('prefix_caching')))}</div>"


# The block map's marks for the trace's kv_moves (viz/kv_blocks.py's MOVE_MARKS) in words
MOVE_WORDS = {"to_host": "▲ {}written to host memory", "from_host": "▼ {}loaded from host memory",
              "copied": "◸ {}copied on write"}  # fmt: skip


def moves_html(counts: dict[str, int], kinds: list[str]) -> str:
    """The blocks this step moved, under the KV line, on every frame of a run that moves any (a line that came and
    went would shift the map): how many of each when some moved, else what each of the run's marks means."""
    if any(counts.values()):
        said = [words.format(f"{counts[k]} ") for k, words in MOVE_WORDS.items() if counts.get(k)]
        text = "Blocks moved this step: " + ", ".join(said)
    else:
        marks = [words.format("") for k, words in MOVE_WORDS.items() if k in kinds]
        text = f"Blocks moved: none this step (marks: {', '.join(marks)})"
    return f'<div data-kv-moves style="font-size:0.9em">{escape(text)}</div>'


def play(players: list[tuple[str, TracePlayer]], transport: Transport, headline=None, legend: str | None = None
         ) -> None:  # fmt: skip
    """Draw the player: `headline(players)` once (it is about the whole run), then the transport and the panels;
    while playing, a timer redraws only that part of the page. legend: the seat charts' (default: their states)."""
    if headline:
        headline(players)
    timer = transport.timer()
    st.fragment(_player, run_every=timer, key=transport.key("player"))(players, transport, timer, legend)


def _player(players, transport: Transport, timer: float | None, legend: str | None = None) -> None:
    """One frame: the transport row (widgets), then the caption, the legend and every panel as ONE block of HTML,
    every frame looked up first (panels sent one by one showed different steps while playing: 158, 151 and 145)."""
    timeline = Timeline.of([p for _, p in players])
    if transport.timer() != timer:  # play / pause / speed changed: the fragment's timer is set by a full run
        st.rerun(scope="app")
    if transport.playing:
        position = min(transport.step + transport.due(), timeline.last)
        transport.set(step=position, playing=position < timeline.last)
    position = min(transport.step, timeline.last)
    transport.set(step=position)
    frames = [(title, player, player.frame(timeline.step_of(player, position))) for title, player in players]
    controls(transport, timeline)
    marks = tuple(dict.fromkeys(item for _, p in players for item in p.legend_items))  # (a run's class marks, once)
    legend = legend or occupancy_legend(any(p.has_stalled for _, p in players), more=marks)
    panels = "".join(panel_html(title, player, frame, position) for title, player, frame in frames)
    block = frame_html(caption_html(timeline.label(position), transport.playing, position), legend, panels, len(frames))
    st.markdown((SLIDER_NUMBER_HIDDEN if transport.playing else "") + block, unsafe_allow_html=True)


# While playing, the slider (a widget of its own) shows the new step 1-20 ms after the frame's block, under load at
# times a frame late (docs/screenshot.py --measure): its number hidden then (room kept), the caption says the step.
SLIDER_NUMBER_HIDDEN = '<style>[data-testid="stSliderThumbValue"] { visibility: hidden; }</style>'
