"""The what-if view: a real model on a real card, by the roofline, then a crowd served on it in simulation.

The top half is `python -m minillm whatif` in pictures (whatif.plan, roofline.py): where the card's
memory goes, how many users fit against context, tokens/s against batch with the ridge point. The
bottom half serves a workload with the same engine and schedulers as the tiny model, on a simulated
clock (simulate.py), static beside continuous, in the same step player, with times in simulated seconds.
"""

from __future__ import annotations

import io

import streamlit as st

from minillm.card import whatif
from minillm.card.calibrate import load_calibration
from minillm.card.hardware import DEVICES, get_device
from minillm.card.modelspec import load_spec, shipped_models
from minillm.card.roofline import KV_BYTES, WEIGHT_BYTES
from minillm.card.simulate import MAX_NUM_SEQS, SimulatedRunner
from minillm.errors import MinillmError
from minillm.runs.run import run_workload
from minillm.runs.workload import ALL_WORKLOADS, SIMULATED_WORKLOADS, ChatKnobs
from viz.app.playback import Transport, play
from viz.card import plot_memory_split, plot_speed_by_batch, plot_users_by_context
from viz.player import TracePlayer

CONTEXTS = [256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
KV_DTYPES = [d for d in KV_BYTES if d != "fp32"]  # fp32 is minillm's own cache, not a serving engine's
RATES_PER_S = [0.5, 1, 2, 4, 8, 16, 32, 1000]
BUDGETS = [None, 0, 64, 128, 256, 512, 1024, 2048, 4096, 8192]  # None: the card's default (simulate.py)


def budget_label(budget: int | None) -> str:
    return "auto" if budget is None else "none" if budget == 0 else str(budget)


SCHEDULERS = {"static": "static batching", "continuous": "continuous batching"}
WORKLOADS = list(SIMULATED_WORKLOADS) + [w for w in ALL_WORKLOADS if w not in SIMULATED_WORKLOADS]


def cards() -> list[str]:
    """The table's cards, and this machine once `python -m minillm calibrate` has measured it."""
    measured = load_calibration("cpu") or load_calibration("cuda")
    return [*DEVICES, "this-machine"] if measured else list(DEVICES)


def pickers() -> dict:
    row = st.columns([1.3, 1.3, 0.8, 0.8, 2])
    models = shipped_models()
    choice = {
        "card": row[0].selectbox("card", cards(), index=list(DEVICES).index("rtx-4090"), key="wi_card"),
        "model": row[1].selectbox("model", models, index=models.index("llama-3.1-8b"), key="wi_model"),
        "dtype": row[2].selectbox("weights", list(WEIGHT_BYTES), index=1, key="wi_dtype"),
        "kv_dtype": row[3].selectbox("KV cache", KV_DTYPES, key="wi_kv_dtype"),
        "context": row[4].select_slider(
            "context per user (tokens)",
            CONTEXTS,
            4096,
            key="wi_context",
            format_func=lambda c: f"{c // 1024}k" if c >= 1024 else str(c),
        ),  # fmt: skip
    }
    return choice


def figure_png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    return buffer.getvalue()


@st.cache_data(max_entries=32, show_spinner=False)
def card_pictures(card: str, model: str, dtype: str, kv_dtype: str, context: int) -> tuple[bytes, bytes, bytes]:
    spec, device = load_spec(model), get_device(card, "auto")
    plan = whatif.plan(spec, device, dtype, kv_dtype, context)
    return (
        figure_png(plot_memory_split(plan)),
        figure_png(plot_users_by_context(spec, device, context, dtype, kv_dtype)),
        figure_png(plot_speed_by_batch(spec, device, context, dtype, kv_dtype)),
    )


def headline(plan: dict, crowd: dict | None) -> None:
    cols = st.columns(5)
    cols[0].metric("users that fit", plan["max_users"], help=f"each holding {plan['context']:,} tokens of KV cache")
    ceiling = f"ceiling: bandwidth / weight bytes = {plan['bandwidth_ceiling_tokens_per_s']:,.1f}"
    cols[1].metric("one user, tokens/s", f"{plan['single_user_tokens_per_s']:,.1f}", help=ceiling)
    if crowd:
        cols[2].metric(f"{crowd['batch']} users, tokens/s in total", f"{crowd['tokens_per_s']:,.0f}")
        cols[3].metric("… per user", f"{crowd['per_user_tokens_per_s']:,.1f}")
        cols[4].metric("bound", crowd["bound"], help=f"{crowd['intensity']:.1f} FLOPs per byte against the card's "
                       f"ridge of {crowd['ridge_intensity']:.0f}")  # fmt: skip


def card_view(choice: dict) -> bool:
    """The roofline half. Returns whether the weights fit (a simulation needs room for some KV)."""
    try:
        spec, device = load_spec(choice["model"]), get_device(choice["card"], "auto")
        args = (choice["dtype"], choice["kv_dtype"], choice["context"])
        plan = whatif.plan(spec, device, *args)
        crowd = whatif.plan(spec, device, *args, batch=plan["max_users"]) if plan["max_users"] else None
        pictures = card_pictures(choice["card"], choice["model"], *args)
    except MinillmError as e:
        st.error(str(e))
        return False
    headline(plan, crowd)
    memory, users, speed = pictures
    st.image(memory, width="stretch")
    left, right = st.columns(2)
    left.image(users, width="stretch")
    right.image(speed, width="stretch")
    with st.expander("the numbers, as `python -m minillm whatif` prints them"):
        flags = f"--model {choice['model']} --gpu {choice['card']} --dtype {args[0]} --kv-dtype {args[1]}"
        st.code(f"$ python -m minillm whatif {flags} --context {args[2]}\n{whatif.summary(plan)}", language=None)
    return plan["weights_fit"]


# --- the simulated crowd ------------------------------------------------------------------------
def crowd_settings() -> dict:
    row = st.columns([1.3, 1, 1, 1.1, 0.9, 0.9])
    azure = "azure-conv / azure-code: prompt and reply lengths from Azure's 2023 LLM inference trace"
    workload = row[0].selectbox("workload", WORKLOADS, key="wi_workload", help=azure)
    return {
        "workload": workload,
        "requests": row[1].number_input("requests", 1, 2000, 100, key="wi_requests"),
        "rate_per_s": row[2].select_slider("arrivals per second", RATES_PER_S, 4, key="wi_rate",
                                           help="Poisson; 1000: everyone at once"),  # fmt: skip
        "token_budget": row[3].select_slider("token budget", BUDGETS, None, key="wi_budget",
                                             format_func=budget_label,
                                             help="auto: vLLM's server default for the card (8192 from 70 GiB, "
                                             "else 2048)"),  # fmt: skip
        "slots": row[4].number_input("seats (0: auto)", 0, MAX_NUM_SEQS, 0, key="wi_slots",
                                     help="0: as many users as KV memory holds at a typical length, at most 256"),
        "prefix_caching": row[5].toggle("prefix caching", False, key="wi_prefix"),
    }  # fmt: skip


@st.cache_resource(max_entries=4, show_spinner=False)  # a simulated trace stays a few MB in memory
def simulated_trace(scheduler: str, card: str, model: str, dtype: str, kv_dtype: str, workload: str, requests: int,
                    rate_per_s: float, token_budget: int | None, slots: int, prefix_caching: bool):  # fmt: skip
    runner = SimulatedRunner(load_spec(model), get_device(card, "auto"), dtype, kv_dtype)
    knobs = ChatKnobs(requests=requests, rate_per_s=rate_per_s)
    return run_workload(runner, workload, scheduler, knobs=knobs, slots=slots or None, token_budget=token_budget,
                        prefix_caching=prefix_caching)  # fmt: skip


@st.cache_resource(max_entries=4, show_spinner=False)
def simulated_player(_trace, run_key: tuple, width: int, axis_seconds: float) -> TracePlayer:
    return TracePlayer(_trace, width, axis_seconds=axis_seconds)


def summary_table(players: list[tuple[str, TracePlayer]]) -> str:
    """The whole run of each policy, side by side (markdown)."""
    ms = lambda v: "–" if v is None else f"{1000 * v:,.0f} ms"
    lines = ["| | tokens/s | TTFT p50 | TTFT p99 | TPOT p50 | TPOT p99 | seats busy | all done at |", "|---" * 8 + "|"]
    for title, p in players:
        s = p.summary
        lines.append(
            f"| **{title}** | {s['tokens_per_s']:,.0f} | {ms(s['ttft_p50_s'])} | {ms(s['ttft_p99_s'])} | "
            f"{ms(s['tpot_p50_s'])} | {ms(s['tpot_p99_s'])} | {s['slot_utilization']:.0%} | {p.end_s:,.1f} s |"
        )
    return "\n".join(lines)


def crowd_view(choice: dict) -> None:
    st.subheader("A crowd on this card, simulated")
    st.caption(
        "The same engine, schedulers and block allocator that serve the tiny model, with the model's forward "
        "replaced by the roofline's time for each step on this card: every reply has its planned length, the "
        "clock is simulated seconds. Runs advance together in time: a continuous step, with newcomers' prompt "
        "chunks in it, takes longer than a static one."
    )
    settings = crowd_settings()
    card = {k: choice[k] for k in ("card", "model", "dtype", "kv_dtype")}
    traces = []
    for scheduler, title in SCHEDULERS.items():
        key = (scheduler, *card.values(), *settings.values())
        try:
            with st.spinner(f"Simulating {title}: {settings['requests']} {settings['workload']} requests…"):
                traces.append((title, simulated_trace(scheduler, **card, **settings), key))
        except MinillmError as e:
            st.error(f"{title}: {e}")
            return
    if not all(trace.steps for _, trace, _ in traces):
        st.warning("Nothing to replay: every request was rejected (too long for this card's KV memory?).")
        return
    end = max(trace.steps[-1].time_s for _, trace, _ in traces)
    players = [(title, simulated_player(trace, key, 700, end)) for title, trace, key in traces]
    config = players[0][1].trace.config
    st.markdown(
        f"{config['slots']} seats, {config['num_blocks']:,} KV blocks of {config['block_size']} tokens, token budget "
        f"{config['token_budget'] or 'none'}. Over the whole run:\n\n{summary_table(players)}"
    )
    play(players, Transport("sim_", speed=10))


def show() -> None:
    st.caption(
        "A real model on a real card, priced by the roofline (minillm/card/roofline.py): a decode step streams every "
        "weight once for all users together, and each user's KV cache takes memory and bandwidth."
    )
    choice = pickers()
    if card_view(choice):
        st.divider()
        crowd_view(choice)
