"""minillm in the browser: watch one engine serve a crowd, step by step.

    streamlit run app.py

The engine runs once per configuration (cached); playing only replays the recorded trace,
so scrubbing back and forth is instant and every picture comes from the trace alone.
"""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import time
from pathlib import Path

import streamlit as st
import torch

from minillm.checkpoint import load_model
from minillm.errors import MinillmError
from minillm.run import run_workload
from minillm.scheduler import SCHEDULERS
from minillm.trace import Trace, TraceError
from minillm.workload import SEED_STORY_SLOTS, WORKLOADS, ChatKnobs
from viz import plot_occupancy
from viz.html import kv_legend, occupancy_legend, queue_html, replies_html
from viz.player import TracePlayer

MY_SCHEDULER_FILE = Path(__file__).parent / "lessons" / "exercises" / "lesson04_continuous.py"
NOT_IMPLEMENTED = "my scheduler is not implemented yet: open lessons/04_continuous_batching.ipynb"
VIEWS = {  # view -> the schedulers shown, left to right
    "static vs continuous": ["static", "continuous"],
    "static": ["static"],
    "continuous": ["continuous"],
    "my scheduler": ["mine"],
    "my scheduler vs continuous": ["mine", "continuous"],
}
TITLES = {"static": "static batching", "continuous": "continuous batching", "mine": "my scheduler"}
SPEEDS = [1, 2, 5, 10, 20, 50, 100]  # engine steps per second of playback
FRAME_S = 0.2  # the shortest time between two frames
RATES = [0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 1000.0]  # mean arrivals per step


# --- running the engine (cached: it runs once per configuration) -------------------------------
@st.cache_resource(show_spinner="Loading the model…")
def cached_model(device: str):
    # The tiny model's CPU ops are too small to split: a second thread mostly waits, and when anything else
    # uses the cores it waits a lot (seed story: 1.8 s on one thread, 29-49 s on two, on a busy 2-core machine).
    torch.set_num_threads(1)
    return load_model(device=device)


def my_scheduler_source() -> str:
    return MY_SCHEDULER_FILE.read_text() if MY_SCHEDULER_FILE.is_file() else ""


def load_my_scheduler():
    """A fresh MyContinuousScheduler from the lesson's exercise file (ImportError if there is none yet)."""
    if not MY_SCHEDULER_FILE.is_file():
        raise ImportError(f"{MY_SCHEDULER_FILE} does not exist")
    spec = importlib.util.spec_from_file_location("lesson04_continuous", MY_SCHEDULER_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "MyContinuousScheduler"):
        raise ImportError("lesson04_continuous.py defines no MyContinuousScheduler")
    scheduler = module.MyContinuousScheduler()
    if not hasattr(scheduler, "name"):
        scheduler.name = "mine"
    return scheduler


@st.cache_data(max_entries=16, show_spinner=False)
def cached_run(scheduler: str, source: str, device: str, settings: str) -> dict:
    """One engine run as a trace dict. `source` (the student's file) is only a cache key: edits rerun it."""
    policy = load_my_scheduler() if scheduler == "mine" else SCHEDULERS[scheduler]()
    settings = json.loads(settings)
    workload, knobs = settings.pop("workload"), settings.pop("knobs")
    knobs = ChatKnobs(**knobs) if knobs else None
    return run_workload(cached_model(device), workload, policy, knobs=knobs, **settings).to_dict()


@st.cache_resource(max_entries=8, show_spinner=False)  # a long contiguous trace is tens of MB
def cached_trace(scheduler: str, source: str, device: str, settings: str) -> Trace:
    """The run as a Trace object, shared (cache_resource): replaying never copies it."""
    return Trace.from_dict(cached_run(scheduler, source, device, settings))


@st.cache_resource(max_entries=8, show_spinner=False)
def cached_player(_trace: Trace, run_key: str, width: int, axis_steps: int) -> TracePlayer:
    return TracePlayer(_trace, width, axis_steps)


def trace_for(scheduler: str, settings: dict, device: str) -> tuple[Trace, str]:
    """The run's trace and its cache key (the student's file is part of the key: an edit reruns it)."""
    source = my_scheduler_source() if scheduler == "mine" else ""
    key = [scheduler, source, device, json.dumps(settings, sort_keys=True)]
    with st.spinner(f"Running the engine: {TITLES[scheduler]} on {settings['workload']}…"):
        return cached_trace(*key), json.dumps(key)


@st.cache_resource(max_entries=2, show_spinner="Reading the trace…")
def cached_upload(data: bytes) -> TracePlayer | str:
    trace = load_uploaded_trace(data)
    return trace if isinstance(trace, str) else TracePlayer(trace, 1200)


def load_uploaded_trace(data: bytes) -> Trace | str:
    """A trace from an uploaded file, or the one-line reason it is not a valid minillm trace."""
    try:
        trace = Trace.loads(data)
        TracePlayer(trace, 400).frame(0)  # valid on paper is not enough: it must also draw
        return trace
    except TraceError as e:
        return str(e)
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
        return f"invalid minillm trace: {type(e).__name__}: {e}"


# --- the sidebar --------------------------------------------------------------------------------
def sidebar() -> tuple[dict, str, str]:
    """Settings of the run (the cache key), the device and the view."""
    bar = st.sidebar
    bar.header("Workload")
    workload = bar.selectbox("workload", WORKLOADS, key="workload", help="seed-story: the lessons' 8 users")
    knobs, seed = None, 0
    if workload != "seed-story":
        knobs = {
            "requests": bar.slider("requests", 1, 128, 32, key="requests"),
            "rate": bar.select_slider("arrivals per step", RATES, 0.5, key="rate", help="1000: all at once"),
            "mean_reply": bar.slider("mean reply length (tokens)", 5, 300, 80, key="mean_reply"),
            "spread": bar.slider("reply-length spread", 0.0, 1.0, 1.0, key="spread", help="0: all equal; 1: long tail"),
        }
        seed = bar.number_input("seed", 0, 10_000, 0, key="seed")
    bar.header("Engine")
    story = workload == "seed-story"
    slots = bar.slider("seats", 1, 16, SEED_STORY_SLOTS if story else 8, key=f"slots-{story}")
    kv = bar.radio("KV layout", ["paged", "contiguous"], horizontal=True, key="kv")
    block_size = bar.select_slider("block size (tokens)", [4, 8, 16, 32, 64], 16, key="block_size")
    num_blocks = None
    if kv == "paged":
        num_blocks = bar.number_input("KV blocks (0: as much memory as contiguous)", 0, 4096, 0, key="num_blocks")
    devices = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
    device = bar.radio("device", devices, horizontal=True, key="device") if len(devices) > 1 else "cpu"
    bar.header("View")
    view = bar.radio("scheduler", list(VIEWS), key="view")
    settings = {"workload": workload, "knobs": knobs, "seed": int(seed), "slots": slots, "kv": kv}
    settings |= {"block_size": block_size, "num_blocks": int(num_blocks) if num_blocks else None}
    return settings, device, view


def remember_upload() -> None:
    upload = st.session_state.get("upload")
    st.session_state.upload_bytes = upload.getvalue() if upload is not None else None


def exports(players: list[tuple[str, TracePlayer]]) -> None:
    """Downloads are built only when clicked, and clicking does not rerun the app."""
    bar = st.sidebar
    bar.header("Save / load a trace")
    for title, player in players:
        trace, name = player.trace, f"minillm-{player.trace.config['workload']}-{title.replace(' ', '-')}"
        bar.download_button(
            f"⬇ trace JSON ({title})",
            data=lambda t=trace: json.dumps(t.to_dict()),
            file_name=f"{name}.json",
            mime="application/json",
            on_click="ignore",
        )
        bar.download_button(
            f"⬇ occupancy PNG ({title})",
            data=lambda t=trace: figure_png(plot_occupancy(t)),
            file_name=f"{name}.png",
            mime="image/png",
            on_click="ignore",
        )
    bar.file_uploader("replay a saved trace (.json)", type=["json"], key="upload", on_change=remember_upload)


def figure_png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=150)
    return buffer.getvalue()


# --- playback -----------------------------------------------------------------------------------
def frame_interval(speed: int) -> float:
    """Seconds between two frames at a speed in steps per second: a frame per step, at most 1 / FRAME_S a second."""
    return max(FRAME_S, 1 / speed)


def steps_due(speed: int) -> int:
    """Steps to advance now: by the clock, not per frame, so a slow machine plays at the same speed (fewer frames)."""
    state, now = st.session_state, time.perf_counter()
    owed = min(now - state.tick_at, 1.0) * speed + state.carry  # a stalled tab does not jump ahead
    steps = max(1, int(owed))
    state.tick_at, state.carry = now, owed - steps
    return steps


def go_to(step: int) -> None:
    st.session_state.step, st.session_state.playing = step, False


def shift(delta: int, last: int) -> None:
    go_to(min(max(st.session_state.step + delta, 0), last))


def toggle_play(last: int) -> None:
    state = st.session_state
    if not state.playing and state.step >= last:
        state.step = 0  # play again from the start
    state.playing = not state.playing
    state.tick_at, state.carry = time.perf_counter() - frame_interval(state.speed), 0.0  # the first frame is due now


def controls(last: int) -> None:
    """Transport buttons (keyboard: Home, ←, Space, →), speed, and the step slider."""
    state = st.session_state
    row = st.columns([1.4, 1.4, 2.2, 1.4, 2.2, 9], vertical_alignment="center")
    icon = lambda name: f":material/{name}:"
    row[0].button("", icon=icon("skip_previous"), key="restart", on_click=go_to, args=(0,), shortcut="Home")
    row[1].button("", icon=icon("chevron_left"), key="back", on_click=shift, args=(-1, last), shortcut="Left")
    label, symbol = ("pause", "pause") if state.playing else ("play", "play_arrow")
    row[2].button(label, icon=icon(symbol), key="play", on_click=toggle_play, args=(last,), shortcut="Space")
    row[3].button("", icon=icon("chevron_right"), key="forward", on_click=shift, args=(1, last), shortcut="Right")
    row[4].selectbox("speed", SPEEDS, key="speed", format_func=lambda s: f"{s} steps/s", label_visibility="collapsed")
    if last > 0:
        row[5].slider("step", 0, last, key="step", label_visibility="collapsed")


def show_png(png: bytes, alt: str) -> None:
    """Inline the picture in the page: st.image's media files can vanish mid-playback and show as broken."""
    data = base64.b64encode(png).decode()
    st.markdown(f'<img src="data:image/png;base64,{data}" alt="{alt}" style="width:100%">', unsafe_allow_html=True)


def panel(title: str, player: TracePlayer, step: int) -> None:
    """One run at one step: metrics, seats, queue, KV memory, replies."""
    frame = player.frame(step)
    m = frame.metrics
    done = f" (finished at step {player.last_step})" if step > player.last_step else ""
    st.subheader(f"{title}{done}")
    cols = st.columns(5)
    cols[0].metric("tokens this step", player.trace.steps[frame.step].tokens)
    cols[1].metric("seats busy so far", f"{m['slot_utilization']:.0%}")
    cols[2].metric("waiting", m["queue_length"])
    cols[3].metric("TTFT p50, steps", "–" if m["ttft_p50_steps"] is None else f"{m['ttft_p50_steps']:.0f}")
    cols[4].metric("TPOT p50, steps", "–" if m["tpot_p50_steps"] is None else f"{m['tpot_p50_steps']:.1f}")
    show_png(frame.occupancy_png, f"who sits in each seat, steps 0 to {frame.step}")
    st.markdown(queue_html(frame.waiting, player.colors), unsafe_allow_html=True)
    record = player.trace.steps[frame.step]
    st.markdown(
        f"**KV memory**: {record.kv_blocks_used} of {record.kv_blocks_total} blocks in use "
        f"({player.trace.config['kv']}, {player.trace.config['block_size']} tokens per block)"
    )
    show_png(frame.kv_png, f"KV blocks at step {frame.step}")
    st.markdown(kv_legend(), unsafe_allow_html=True)
    st.markdown(replies_html(frame.replies, frame.not_arrived), unsafe_allow_html=True)


def comparison(players: list[tuple[str, TracePlayer]]) -> None:
    """The headline of a side-by-side view, over the whole run."""
    (a, pa), (b, pb) = players
    ua, ub = pa.summary["slot_utilization"], pb.summary["slot_utilization"]
    fa, fb = pa.summary["last_finish_step"], pb.summary["last_finish_step"]
    sooner = "" if fa is None or fb is None else f": {abs(fa - fb)} steps {'sooner' if fb < fa else 'later'}"
    st.success(
        f"**Same requests, same model, same seats and KV cache; only the scheduler differs.**  \n"
        f"Seats busy over the whole run: {a} **{ua:.0%}**, {b} **{ub:.0%}** ({(ub - ua) * 100:+.0f} points).  \n"
        f"Last request finishes at step: {a} **{fa}**, {b} **{fb}**{sooner} for {b}."
    )


def player_view(players: list[tuple[str, TracePlayer]], timer: float | None) -> None:
    """The part of the page that redraws every frame (a fragment: the rest of the page stays put)."""
    state = st.session_state
    last = max(p.last_step for _, p in players)
    wanted = frame_interval(state.speed) if state.playing else None
    if wanted != timer:  # play / pause / speed changed: the fragment's timer is set by a full run
        st.rerun(scope="app")
    if state.playing:
        state.step = min(state.step + steps_due(state.speed), last)
        state.playing = state.step < last
    state.step = min(state.step, last)
    begin = time.perf_counter()
    controls(last)
    playing = " · playing" if state.playing else ""
    drawn = f" · last frame drawn in {state.frame_ms:.0f} ms" if "frame_ms" in state else ""
    st.caption(f"step {state.step} of {last}{playing}{drawn}")
    if len(players) == 2:
        comparison(players)
    st.markdown(occupancy_legend(), unsafe_allow_html=True)
    for column, (title, player) in zip(st.columns(len(players)), players):
        with column:
            panel(title, player, state.step)
    state.frame_ms = 1000 * (time.perf_counter() - begin)


def uploaded_players() -> list[tuple[str, TracePlayer]]:
    """The uploaded trace, if one is loaded; a bad file is reported and the live runs stay on screen."""
    upload = st.session_state.upload_bytes
    loaded = cached_upload(upload) if upload else None
    if isinstance(loaded, str):
        st.error(f"That file cannot be replayed: {loaded}")
    if not isinstance(loaded, TracePlayer):
        return []
    config = loaded.trace.config
    st.info(f"Replaying an uploaded trace ({config['scheduler']}, {config['workload']}); clear it in the sidebar.")
    return [(f"uploaded: {config['scheduler']}", loaded)]


def live_players(settings: dict, device: str, view: str) -> list[tuple[str, TracePlayer]]:
    """Run (or fetch from the cache) each scheduler of the view; failures become messages, not tracebacks."""
    runs = []
    for scheduler in VIEWS[view]:
        try:
            runs.append((TITLES[scheduler], *trace_for(scheduler, settings, device)))
        except (NotImplementedError, ImportError):
            st.info(NOT_IMPLEMENTED)
        except MinillmError as e:
            st.error(f"{TITLES[scheduler]}: {e}")
        except Exception as e:  # the student's scheduler may fail in any way: say how, keep the app alive
            st.error(f"{TITLES[scheduler]} failed: {type(e).__name__}: {e}")
    width = 1200 if len(VIEWS[view]) == 1 else 700
    axis_steps = max((len(trace.steps) for _, trace, _ in runs), default=0)  # one time axis for the runs shown
    players = []
    for title, trace, key in runs:
        if trace.steps:
            players.append((title, cached_player(trace, key, width, axis_steps)))
        else:
            st.warning(f"{title}: nothing to replay: every request was rejected (see the KV and seat settings).")
    return players


# --- the page -----------------------------------------------------------------------------------
def main() -> None:
    st.set_page_config(page_title="minillm: one GPU, many users", page_icon="🧮", layout="wide")
    start = st.query_params.get("step", "0")  # ?step=300 opens at that step: a link to a moment of the lesson
    defaults = {"step": int(start) if start.isdigit() else 0, "playing": False, "speed": 20, "upload_bytes": None}
    defaults |= {"tick_at": 0.0, "carry": 0.0}
    for key, value in defaults.items():
        st.session_state.setdefault(key, value)
    st.title("minillm: one GPU, many users")
    st.caption(
        "Each column of the chart is one engine step, and every seated request gets one token per step. "
        "Static batching keeps a finished request's seat until the whole batch is done; "
        "continuous batching gives the seat to the next user at once."
    )
    settings, device, view = sidebar()
    players = uploaded_players() or live_players(settings, device, view)
    exports(players)
    if not players:
        return
    timer = frame_interval(st.session_state.speed) if st.session_state.playing else None
    st.fragment(player_view, run_every=timer)(players, timer)


if __name__ == "__main__":  # streamlit runs this file as __main__; tests import its helpers without a page
    main()
