"""The step player view: the tiny model serving a crowd, static beside continuous, step by step.

Each setting is served by the real engine, schedulers and KV cache, replayed from each prompt's recorded reply
(replays.py): a change costs bookkeeping, not forwards (the model runs only for prompts never answered before).
Playing only looks up the run's trace, so scrubbing back and forth is instant and every picture comes from it.

Who goes first (?policy=deadline or ?policy=priority): first come first served beside the deadline or priority policy
(minillm/layers/policies.py) on the mixed crowd, chat users and batch jobs; each request's class and whether it met
its targets drawn on the seats (viz/targets.py), goodput in the headline.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import streamlit as st
import torch

from minillm.engine.scheduler import DEFAULT_TOKEN_BUDGET
from minillm.errors import MinillmError
from minillm.layers.trace import Trace
from minillm.model.checkpoint import load_model
from minillm.runs.metrics import one_user_left
from minillm.runs.workload import SEED_STORY_SLOTS, WORKLOADS
from viz.app import fleet_view, presenter, replays
from viz.app.headlines import run_headline
from viz.app.playback import Transport, play
from viz.app.trace_files import exports, uploaded_players
from viz.colors import DECODE, PREFILL
from viz.player import TracePlayer
from viz.targets import player_of

MY_SCHEDULER_FILE = Path(__file__).parent.parent / "lessons" / "exercises" / "lesson04_continuous.py"
NOT_IMPLEMENTED = "my scheduler is not implemented yet: open lessons/04_continuous_batching.ipynb"
SCHEDULES = {  # choice -> the schedulers shown, left to right
    "static vs continuous": ["static", "continuous"],
    "static": ["static"],
    "continuous": ["continuous"],
    "my scheduler": ["mine"],
    "my scheduler vs continuous": ["mine", "continuous"],
    "continuous vs deadline": ["continuous", "deadline"],  # who goes first (layers/policies.py), on the mixed crowd
    "continuous vs priority": ["continuous", "priority"],
}
WHO_GOES_FIRST = {"deadline": "continuous vs deadline", "priority": "continuous vs priority"}  # ?policy=deadline
TITLES = {"static": "static batching", "continuous": "continuous batching", "mine": "my scheduler",
          "deadline": "deadline policy", "priority": "priority policy"}  # fmt: skip
RATES = [0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 1000.0]  # mean arrivals per step
MAX_SEATS, DEFAULT_SEATS = 16, 8  # the seats slider (the seed story's default: SEED_STORY_SLOTS)
DEFAULT_KNOBS = {"requests": 32, "rate": 0.5, "mean_reply": 80, "spread": 1.0}  # a crowd's sliders, untouched
BUDGETS = [0, 8, 16, 32, 64, 128, 256, 512, 1024]  # tokens per step; 0: none
CONSTRAINED_HELP = (
    "every other user's reply held to a pattern, numbers apart by one space (a logit mask each step: lesson 14); "
    "their chat bubbles say how many of the 260 tokens each step's mask allowed"
)
WORKLOAD_HELP = (
    "seed-story: the lessons' 8 users. system-prompt: users share long system prompts (try prefix caching). "
    "long-prompts: some users paste long texts (try a small token budget). mixed: chat users with a TTFT target "
    "and batch jobs with a deadline (try continuous vs deadline)."
)
MIXED_ONLY = ("Only the mixed crowd's requests carry a class and targets (chat users, batch jobs): pick the workload "
              "mixed to see who met them.")  # fmt: skip


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


SERVING = "Serving the crowd: each prompt's reply replayed (the model runs only for prompts it never answered)…"


@st.cache_resource(max_entries=24, show_spinner=SERVING)  # (shown only when it runs; a long contiguous trace: MBs)
def cached_trace(scheduler: str, source: str, device: str, settings: str) -> Trace:
    """One replayed run as a Trace object, shared (cache_resource): replaying never copies it. `source` (the
    student's file) is only a cache key: an edit reruns it."""
    policy = load_my_scheduler() if scheduler == "mine" else scheduler
    return replays.run(policy, json.loads(settings), cached_model(device))


@st.cache_resource(max_entries=8, show_spinner=False)
def cached_player(_trace: Trace, run_key: str, width: int, text_px: int, height: int | None, axis_steps: int
                  ) -> TracePlayer:  # fmt: skip
    return player_of(_trace, width, axis_steps, text_px=text_px, height=height)


def trace_for(scheduler: str, settings: dict, device: str) -> tuple[Trace, str]:
    """The run's trace and its cache key (the student's file is part of the key: an edit reruns it)."""
    source = my_scheduler_source() if scheduler == "mine" else ""
    key = [scheduler, source, device, json.dumps(settings, sort_keys=True)]
    return cached_trace(*key), json.dumps(key)


# --- the settings (the sidebar; in the presenter view, an expander) ------------------------------------------------
def sidebar(where=None) -> tuple[dict, str, str]:
    """Settings of the run (the cache key), the device and which schedulers to show."""
    bar = presenter.settings("settings: workload, seats, KV, schedulers", where, "settings")
    presenter.heading(bar, "Workload")
    policy = WHO_GOES_FIRST.get(st.query_params.get("policy", ""))  # (a link opens on it, with the mixed crowd)
    workload = bar.selectbox("workload", WORKLOADS, WORKLOADS.index("mixed") if policy else 0, key="workload",
                             help=WORKLOAD_HELP)  # fmt: skip
    knobs, seed = None, 0
    if workload != "seed-story":
        default = DEFAULT_KNOBS
        knobs = {
            "requests": bar.slider("requests", 1, 128, default["requests"], key="requests"),
            "rate": bar.select_slider(
                "arrivals per step", RATES, default["rate"], key="rate", help="1000: all at once"
            ),  # fmt: skip
            "mean_reply": bar.slider("mean reply length (tokens)", 5, 300, default["mean_reply"], key="mean_reply"),
            "spread": bar.slider(
                "reply-length spread", 0.0, 1.0, default["spread"], key="spread", help="0: all equal; 1: long tail"
            ),  # fmt: skip
        }
        seed = bar.number_input("seed", 0, 10_000, 0, key="seed")
    asked = st.query_params.get("constrained", "0") == "1"  # ?constrained=1 opens with it on (a link)
    constrained = bar.toggle("constrained replies", asked, key="constrained", help=CONSTRAINED_HELP)
    presenter.heading(bar, "Engine")
    story = workload == "seed-story"
    slots = bar.slider("seats", 1, MAX_SEATS, SEED_STORY_SLOTS if story else DEFAULT_SEATS, key=f"slots-{story}")
    budget = bar.select_slider(
        "token budget (tokens per step)", BUDGETS, DEFAULT_TOKEN_BUDGET, key="token_budget",
        format_func=lambda b: "none" if b == 0 else str(b),
        help="decode rows first, then prompts in chunks; none: whole prompts in the step they are admitted",
    )  # fmt: skip
    kv = bar.radio("KV layout", ["paged", "contiguous"], horizontal=True, key="kv")
    block_size = bar.select_slider("block size (tokens)", [4, 8, 16, 32, 64], 16, key="block_size")
    num_blocks, prefix = None, False
    if kv == "paged":
        num_blocks = bar.number_input("KV blocks (0: as much memory as contiguous)", 0, 4096, 0, key="num_blocks")
        prefix = bar.toggle("prefix caching", False, key="prefix_caching",
                            help="requests whose prompts start alike share those KV blocks")  # fmt: skip
    asked = st.query_params.get("speculate", "0")  # ?speculate=4 opens with it on (a link; docs/screenshot.sh)
    speculate = bar.select_slider("speculative decoding (draft tokens per step)", [0, 1, 2, 4, 8],
                                  int(asked) if asked in ("1", "2", "4", "8") else 0, key="speculate",
                                  format_func=lambda k: "off" if k == 0 else str(k),
                                  help="each decoding user guesses k tokens with the draft model; the model checks "
                                  "them in the same step and keeps the right ones")  # fmt: skip
    devices = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
    device = bar.radio("device", devices, horizontal=True, key="device") if len(devices) > 1 else "cpu"
    presenter.heading(bar, "View")
    views, (fleet, router) = [*SCHEDULES, *fleet_view.CHOICES], fleet_view.linked()  # (?fleet=pair: a link)
    first = views.index(fleet or policy) if fleet or policy else 0
    schedule = bar.radio("scheduler", views, first, key="schedule", on_change=mixed_crowd_first)
    if schedule == fleet_view.REPLICAS:
        routers = list(fleet_view.ROUTERS)
        router = bar.selectbox("router", routers, routers.index(router), key="route", help=fleet_view.ROUTER_HELP)
        schedule = f"{schedule}, {router}"
    settings = {"workload": workload, "knobs": knobs, "seed": int(seed), "slots": slots, "kv": kv}
    settings |= {"block_size": block_size, "num_blocks": int(num_blocks) if num_blocks else None}
    settings |= {"token_budget": budget, "prefix_caching": prefix, "speculate": speculate}
    if constrained:  # (only when on: the settings are the runs' keys on disk, and those without it stay valid)
        settings["constrained"] = True
    return settings, device, schedule


def mixed_crowd_first() -> None:
    """Picking a who-goes-first view on the seed story (the settings' default) brings the mixed crowd, whose
    requests carry classes and targets."""
    state = st.session_state
    if state.get("schedule") in WHO_GOES_FIRST.values() and state.get("workload", "seed-story") == "seed-story":
        state["workload"] = "mixed"


# --- the view -------------------------------------------------------------------------------------
def story_moment(players: list[tuple[str, TracePlayer]]) -> str:
    """The seed story's figures beside the articles': theirs are seats busy at one moment, while one long reply
    holds a static batch, not over a whole run. That moment here, from the trace (one sentence, HTML)."""
    runs = {p.table.config["scheduler"]: p for _, p in players}
    static, continuous = runs.get("static"), runs.get("continuous")
    if static is None or continuous is None or static.table.config.get("workload") != "seed-story":
        return ""
    moment = one_user_left(static.trace)  # the first stretch: one user left in the first batch
    if moment is None:
        return ""
    first, last = moment
    working = (static.table.states[:, first] == PREFILL) | (static.table.states[:, first] == DECODE)
    who = static.table.ids[static.table.occupant[working, first][0]]
    busy = lambda p, step: p.progress.at(step)["utilization_now"]
    now_s, now_c = busy(static, first), busy(continuous, first)  # (at() clips a step past the run's end)
    return (
        f"The articles' <b>~9% vs ~93%</b> (<b>1/8</b> for 8 seats and one user left) are seats busy <i>at one "
        f"moment</i>, while one long reply holds a static batch: here steps {first}–{last}, {who} alone: static "
        f"<b>{now_s:.0%}</b>, continuous <b>{now_c:.0%}</b>. A whole run also counts the steps when every seat "
        "was busy, so its figures differ."
    )


HOW_TO_READ = (
    "Each column of a chart is one engine step: every seated user decodes one token (blue) or runs its prompt, or a "
    "chunk of it (orange). Static batching keeps a finished request's seat until the whole batch is done; continuous "
    "batching gives the seat to the next user at once."
)


def comparison(players: list[tuple[str, TracePlayer]], row=None) -> None:
    """The headline of a side-by-side view, over the whole run; how to read the charts and the articles' figures
    (the seed story) behind its "why?"."""
    run_headline(players, f"{HOW_TO_READ} {story_moment(players)}".strip(), row)


def live_players(settings: dict, device: str, schedule: str) -> list[tuple[str, TracePlayer]]:
    """Run (or fetch from the cache) each scheduler shown; failures become messages, not tracebacks."""
    runs = []
    for scheduler in SCHEDULES[schedule]:
        try:
            runs.append((TITLES[scheduler], *trace_for(scheduler, settings, device)))
        except (NotImplementedError, ImportError):
            st.info(NOT_IMPLEMENTED)
        except MinillmError as e:
            st.error(f"{TITLES[scheduler]}: {e}")
        except Exception as e:  # the student's scheduler may fail in any way: say how, keep the app alive
            st.error(f"{TITLES[scheduler]} failed: {type(e).__name__}: {e}")
    size = presenter.chart_size(len(SCHEDULES[schedule]))
    axis_steps = max((len(trace.steps) for _, trace, _ in runs), default=0)  # one time axis for the runs shown
    players = []
    for title, trace, key in runs:
        if trace.steps:
            players.append((title, cached_player(trace, key, size.width, size.text_px, size.height, axis_steps)))
        else:
            st.warning(f"{title}: nothing to replay: every request was rejected (see the KV and seat settings).")
    return players


def show() -> None:
    start = st.query_params.get("step", "0")  # ?step=300 opens at that step: a link to a moment of the lesson
    transport = Transport(position=int(start) if start.isdigit() else 0)
    st.session_state.setdefault("upload_bytes", None)
    # the presenter view's first row: the settings' and the trace's popovers, the headline, and why it says so
    settings_at, trace_at, *headline_at = presenter.settings_row([1.45, 1.2, 8, 1.35])
    settings, device, schedule = sidebar(settings_at)
    if schedule in fleet_view.FLEETS:  # two engines, each its own trace
        one_engine = lambda run: trace_for("continuous", run, device)[0]
        fleet_view.show(settings, device, schedule, transport, [trace_at, *headline_at], lambda: cached_model(device),
                        one_engine)  # fmt: skip
        return
    if schedule in WHO_GOES_FIRST.values() and settings["workload"] != "mixed":
        st.caption(MIXED_ONLY)
    players = uploaded_players() or live_players(settings, device, schedule)
    exports(players, trace_at)
    if players:
        comparison(players, headline_at if presenter.on() else None)
        play(players, transport)
