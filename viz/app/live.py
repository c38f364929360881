"""The live view: a running `python -m minillm serve`, watched as requests arrive (the workshop's projector).

    streamlit run app.py -- --live http://127.0.0.1:8000      (or this tab's sidebar: the server's URL, connect)

A few times a second a fragment with a timer asks the server for the steps it took since the last poll
(GET /trace?since_step=K), merges them into the last WINDOW_STEPS steps (viz/live_window.py) and draws the
newest one: who sits in each seat, the queue, the KV blocks, every reply as it streams, and the window's
figures. Nothing is recorded here: the server keeps the trace, the app only looks at its end (with its --api-key).
"""

from __future__ import annotations

import os
import statistics
import time
from collections import deque

import httpx
import streamlit as st

from minillm.layers.trace import Trace
from minillm.runs import trace_file
from viz.app import presenter
from viz.app.playback import kv_html, png_html
from viz.html import (
    figures_html,
    headline_html,
    occupancy_legend,
    queue_html,
    replies_html,
    token_budget_html,
)
from viz.live_window import LiveWindow, live_player, live_replies, window_figures
from viz.player import TracePlayer

DEFAULT_URL = "http://127.0.0.1:8000"
WINDOW_STEPS = 300  # the steps on screen: a few seconds of a busy server
DEFAULT_REDRAWS = 4
REDRAWS_PER_S = [1, 2, 4]  # choices: each redraw is one poll; fewer leave more of a shared machine to the engine
TIMEOUT = httpx.Timeout(3.0, connect=2.0)  # a poll that takes longer says so, and the next one tries again
IDLE_S = 2.0  # no new step for this long: say the engine is idle (the picture is of its last steps)
REPLIES_SHOWN = {False: 12, True: 5}  # normal view, presenter view: whole bubbles, none cut off by a scroll box
FRAMES_TIMED = 20  # the frame interval shown is the median over this many frames
INSTRUCTOR_LINE = "python -m minillm serve --host 0.0.0.0"
STUDENT_LINE = (  # docs/workshop.md, The room as the crowd: a student's one line
    "curl http://ROOM-ADDRESS:8000/v1/chat/completions -H 'Content-Type: application/json' "
    """-d '{"messages": [{"role": "user", "content": "count down from 40"}], "stream": true}'"""
)


class ServerError(Exception):
    """The server cannot be watched right now; the message says why and what to do, in one line."""


def server_url(text: str) -> str:
    """What someone types (or passes to --live) as the server's root URL: "host:8000" gains http://, and the API
    root a client uses (http://host:8000/v1) loses its /v1."""
    url = text.strip().rstrip("/")
    if not url:
        raise ServerError("no server URL: type one in the sidebar, e.g. " + DEFAULT_URL)
    if "://" not in url:
        url = f"http://{url}"
    return url.removesuffix("/v1")


class LiveFeed:
    """One server, polled: an HTTP client, the window it fills, the player of its newest state, and timings."""

    def __init__(self, url: str, api_key: str | None = None):
        self.url, self.new_step_at = url, time.monotonic()  # (when a poll last brought a new step)
        auth = {"Authorization": f"Bearer {api_key}"} if api_key else None  # (serve --api-key guards /trace)
        self.client, self.window = httpx.Client(timeout=TIMEOUT, headers=auth), LiveWindow(WINDOW_STEPS)
        self.player, self.frame = None, None  # (TracePlayer, Frame): the newest state and its drawing
        self.size = presenter.ChartSize(1200, 12)  # how the chart is drawn (the view sets it before each poll)
        self.drawn_size = self.size
        self.frame_starts: deque[float] = deque(maxlen=FRAMES_TIMED + 1)

    def poll(self) -> int:
        """Ask for the steps after the newest one held and merge them; returns how many came."""
        params = {"last_steps": WINDOW_STEPS}
        if self.window.since_step is not None:
            params["since_step"] = self.window.since_step
        new = self.window.add(self._get_trace(params))
        if new or self.player is None or self.drawn_size != self.size:  # (a new step, or the presenter toggled)
            self._rebuild()
        if new:
            self.new_step_at = time.monotonic()
        return new

    def _get_trace(self, params: dict) -> Trace:
        where = f"{self.url}/trace"
        try:
            response = self.client.get(where, params=params)
        except httpx.ConnectError:
            raise ServerError(
                f"Cannot reach {self.url}: nothing answers there. Is `python -m minillm serve` running, and is "
                "the URL in the sidebar its address? (This view retries by itself.)"
            ) from None
        except httpx.TimeoutException:
            raise ServerError(f"{self.url} did not answer within {TIMEOUT.read:g} s (retrying).") from None
        except (httpx.HTTPError, httpx.InvalidURL) as e:
            raise ServerError(f"Cannot ask {where}: {e}") from None
        if response.status_code == 401:
            raise ServerError(f"{where} asks for the server's API key (--api-key): type it in the sidebar.")
        if response.status_code == 404:
            raise ServerError(f"{where} does not exist: this view needs minillm's server (python -m minillm serve).")
        if response.status_code != 200:
            raise ServerError(f"{where} answered {response.status_code}: {response.text[:200]}")
        try:
            return trace_file.loads(response.content)
        except trace_file.TraceError as e:
            raise ServerError(f"{where} did not send a minillm trace: {e}") from None

    def _rebuild(self) -> None:
        """A new player for the window (cheap: a few hundred steps), and its newest frame."""
        trace = self.window.trace()
        if trace is None or not trace.steps:
            self.player = self.frame = None
            return
        try:
            self.player = live_player(trace, WINDOW_STEPS, self.size.width, self.size.text_px, self.size.height)
            self.frame = self.player.frame(self.player.last_step)
            self.drawn_size = self.size
        except (TypeError, ValueError, KeyError, IndexError) as e:
            self.player = self.frame = None
            raise ServerError(f"Cannot draw {self.url}'s trace: {type(e).__name__}: {e}") from None

    def tick(self) -> float | None:
        """Note that a frame starts now; the median time between the last frames, in ms (None: too few yet)."""
        self.frame_starts.append(time.perf_counter())
        times = list(self.frame_starts)
        gaps = [b - a for a, b in zip(times, times[1:])]
        return 1000 * statistics.median(gaps) if len(gaps) >= 2 else None

    def close(self) -> None:
        self.client.close()


# --- connecting -----------------------------------------------------------------------------------------
def open_on(url: str) -> None:
    """The app was started with --live URL: watch that server from the first frame (once per browser session)."""
    if "live_connected" not in st.session_state:
        st.session_state.live_url, st.session_state.live_connected = url, True


def feed() -> LiveFeed | None:
    return st.session_state.get("live_feed")


def connect() -> None:
    disconnect()
    try:
        st.session_state.live_feed = LiveFeed(server_url(st.session_state.live_url), st.session_state.live_key)
    except ServerError as e:
        st.session_state.live_problem = str(e)
        return
    st.session_state.live_connected, st.session_state.live_problem = True, None


def disconnect() -> None:
    """Stop polling; the last picture stays on screen (a moment to explain what it shows)."""
    st.session_state.live_connected = False
    if feed() is not None:
        feed().close()


def sidebar(where=None, button_at=None) -> None:
    """The server's URL, the redraw rate and the students' line (the presenter view: in a popover in `where`), and
    connect / disconnect (the presenter view: in `button_at`, on screen, not inside the popover)."""
    bar = presenter.settings("live server: URL, redraws, the students' line", where, "server")
    if bar is st.sidebar:
        bar.header("Live server")
    st.session_state.setdefault("live_url", DEFAULT_URL)
    bar.text_input("server URL", key="live_url", persist_state="page", on_change=connect,
                   help="where `python -m minillm serve` listens (its --host and --port)")  # fmt: skip
    bar.text_input("API key", key="live_key", type="password", on_change=connect,
                   help="the server's --api-key, if it has one (default: $MINILLM_API_KEY)")  # fmt: skip
    bar.select_slider("redraws per second", REDRAWS_PER_S, DEFAULT_REDRAWS, key="live_redraws",
                      help="each redraw asks the server for its new steps; on a laptop that also runs the server, "
                      "fewer redraws leave more of its cores to the engine")  # fmt: skip
    button = button_at or bar
    if st.session_state.live_connected:
        button.button(
            "disconnect", icon=":material/pause:", key="live_disconnect", on_click=disconnect, width="stretch"
        )
    else:
        button.button("connect", icon=":material/play_arrow:", key="live_connect", on_click=connect, type="primary",
                      width="stretch")  # fmt: skip
    bar.caption("The instructor (the room's network: see docs/workshop.md, The room as the crowd):")
    bar.code(INSTRUCTOR_LINE, language="bash", wrap_lines=True)  # (inline code would not wrap: cut in a sidebar)
    bar.caption("Each student, with the instructor's address:")
    bar.code(STUDENT_LINE, language="bash", wrap_lines=True)


# --- drawing ------------------------------------------------------------------------------------------
def _ms(seconds: float | None) -> str:
    return "–" if seconds is None else f"{1000 * seconds:,.0f}"


def figures(player: TracePlayer, f: dict) -> str:
    """The window's figures (live_window.window_figures) as a row of big numbers."""
    slots = player.table.num_seats
    return figures_html([
        ("tokens/s", "–" if f["tokens_per_s"] is None else f"{f['tokens_per_s']:,.0f}", f"over {f['span_s']:.1f} s",
         "output tokens made in the window's steps / the time they span"),
        ("busy seats", f"{f['busy_now']} of {slots}", f"{f['busy_share']:.0%} over the window",
         "seats that ran tokens in the newest step (and the share of seat-steps that did, over the window)"),
        ("waiting", str(f["waiting"]), "", "arrived, no seat yet"),
        ("TTFT p50, ms", _ms(f["ttft_p50_s"]), f"p90 {_ms(f['ttft_p90_s'])}",
         "arrival to first token (the engine's clock), requests whose first token came in the window"),
        ("ITL p50, ms", _ms(f["itl_p50_s"]), f"p99 {_ms(f['itl_p99_s'])}",
         "gap between two tokens of one reply, within the window"),
        ("KV blocks", f"{f['kv_blocks_used']} of {f['kv_blocks_total']}", "", "blocks held by requests, newest step"),
    ])  # fmt: skip


def draw(live: LiveFeed, interval_ms: float | None) -> None:
    """The newest step of the window: figures, seats, the step's tokens, queue, KV blocks, replies."""
    player, frame = live.player, live.frame
    table, config = player.table, player.table.config
    first, last = config["first_step"], config["first_step"] + player.last_step
    idle = time.monotonic() - live.new_step_at
    state = f"engine idle for {idle:.0f} s" if idle > IDLE_S else f"step {last:,}"
    redrawn = "" if interval_ms is None else f" · redrawn every {interval_ms / 1000:.2g} s"  # (no developer's figures)
    st.caption(f"{state} · the last {player.last_step + 1} steps ({first:,} to {last:,}){redrawn}")
    f = window_figures(table)
    if presenter.on():  # the room's one number: how much the server makes, and how full it is
        rate = "–" if f["tokens_per_s"] is None else f"{f['tokens_per_s']:,.0f}"
        parts = [("tokens/s", rate), ("seats busy", f"{f['busy_now']} of {config['slots']}")]
        label = f"The server, over the last {f['span_s']:.1f} s:"
        st.markdown(headline_html(label, parts, one_line=True) + figures(player, f), unsafe_allow_html=True)
    else:
        st.markdown(figures(player, f), unsafe_allow_html=True)
    chart = png_html(frame.occupancy_png, f"who sits in each seat, steps {first} to {last}", player.text_px, True)
    st.markdown(f"<div>{occupancy_legend(player.has_stalled)}{chart}</div>", unsafe_allow_html=True)
    st.markdown(token_budget_html(frame.tokens, player.budget, player.bar_tokens), unsafe_allow_html=True)
    left, right = st.columns([4, 7])
    with left:
        st.markdown(queue_html(frame.waiting, player.colors, frame.metrics["queue_length"]), unsafe_allow_html=True)
        st.markdown(kv_html(player, frame), unsafe_allow_html=True)  # (the step player's: one KV memory picture)
    with right:
        replies, more = live_replies(player, REPLIES_SHOWN[presenter.on()])
        more_note = f"<div style='color:#777'>… and {more} more in the window</div>" if more else ""
        st.markdown(replies_html(replies, max_height=None) + more_note, unsafe_allow_html=True)


def _live_frame(connected: bool) -> None:
    """One frame (a fragment: only this part of the page redraws, on the timer while connected)."""
    live = feed()
    if live is None:
        st.info("Not watching a server yet: start one (`python -m minillm serve`), check its URL, press connect.")
        return
    url = live.url
    live.size = presenter.chart_size(1)
    interval_ms = live.tick()
    if connected:
        try:
            live.poll()
        except ServerError as e:
            st.error(str(e))
            if live.player is not None:
                st.caption("Below: the last steps received before it stopped answering.")
    if live.player is None:
        if connected and live.window.config is not None:
            st.info(f"Connected to {url}: the engine has not taken a step yet. Send it a request (see the sidebar).")
        return
    if not connected:
        st.info(f"Paused (disconnected from {url}): the last steps received. Connect to follow the server again.")
    draw(live, interval_ms)


def show() -> None:
    st.session_state.setdefault("live_connected", False)
    st.session_state.setdefault("live_problem", None)
    st.session_state.setdefault("live_key", os.environ.get("MINILLM_API_KEY", ""))
    settings_at, button_at, title_at = presenter.settings_row([1.5, 1.9, 8])  # (the presenter view: one row)
    sidebar(settings_at, button_at)
    if st.session_state.live_connected and feed() is None:
        connect()  # opened with --live, or the feed went with an old session's state
    if st.session_state.live_problem:
        st.error(st.session_state.live_problem)
        return
    connected = st.session_state.live_connected
    (title_at or st).subheader(f"live: {feed().url}" if feed() else "live")
    timer = 1 / st.session_state.live_redraws if connected else None
    st.fragment(_live_frame, run_every=timer, key="live_frame")(connected)
