"""The what-if view's first screen: a crowd served on the chosen card, simulated, static beside continuous.

The same engine, schedulers and block allocator that serve the tiny model, on a simulated clock (card/simulate.py):
every reply has its planned length, each step costs what the cost model says it costs on the card. Every control
must redraw within about 3 s on a 2-core laptop, so a simulation has a work budget (CROWD_WORK): the two policies
advance together on the simulated clock, and when it is spent both stop at the same simulated moment and the view
says how much of the crowd that left out. A budget keeps the crowd the one asked for (up to MAX_REQUESTS) and the
two runs comparable, and a run the same on every machine (it stops at the same step, whatever the machine's
speed). Each setting is simulated once per session (st.cache_resource): going back to one is instant.
"""

from __future__ import annotations

import streamlit as st

from minillm.card import whatif
from minillm.card.hardware import get_device
from minillm.card.modelspec import load_spec
from minillm.card.simulate import MAX_NUM_SEQS, SimulatedRunner
from minillm.errors import MinillmError
from minillm.layers.trace import Trace
from minillm.runs.run import workload_engine
from minillm.runs.workload import ALL_WORKLOADS, SIMULATED_WORKLOADS, ChatKnobs
from viz.app import playback, presenter
from viz.app.headlines import run_headline
from viz.app.playback import Transport, play
from viz.player import TracePlayer
from viz.targets import player_of

RATES_PER_S = [0.5, 1, 2, 4, 8, 16, 32, 1000]
BUDGETS = [None, 0, 64, 128, 256, 512, 1024, 2048, 4096, 8192]  # None: the card's default (simulate.py)
SCHEDULERS = {"static": "static batching", "continuous": "continuous batching"}
WORKLOADS = list(SIMULATED_WORKLOADS) + [w for w in ALL_WORKLOADS if w not in SIMULATED_WORKLOADS]


def budget_label(budget: int | None) -> str:
    return "auto" if budget is None else "none" if budget == 0 else str(budget)


CROWD_WORK = 7_500  # engine steps, plus seat entries / 11, both policies together: about a second of simulation on
# this project's 2-core machine shared with other work (a step cost about 140 us, each seat in it, held or working,
# about 12 us more). The default crowd needs about 7,000, so it is simulated to its end.
SEAT_WORK = 1 / 11
MAX_REQUESTS = 500  # a crowd of 2,000 took 3 s just to draw and submit (long Azure prompts, checked token by token)
PREFIX_WORK_PER_BLOCK = 1 / 500  # with prefix caching a step also counts the pool's cached free blocks: O(pool)


CROWD_TITLE = "A crowd on this card, simulated"
CROWD_HELP = f"{CROWD_TITLE}: the workload, its size and arrivals, the token budget, the seats, prefix caching"


def crowd_settings(where=None) -> dict:
    """The crowd's controls, in a popover (in `where`, e.g. a column of the view's first row)."""
    box = (where or st).popover("crowd", icon=":material/groups:", help=CROWD_HELP, width="stretch")
    box.markdown(f"**{CROWD_TITLE}**")
    left, right = box.columns(2)  # (two of three: one column ran past a 720 px screen's foot)
    azure = "azure-conv / azure-code: prompt and reply lengths from Azure's 2023 LLM inference trace"
    workload = left.selectbox("workload", WORKLOADS, key="wi_workload", help=azure)
    return {
        "workload": workload,
        "requests": left.number_input("requests", 1, MAX_REQUESTS, 50, key="wi_requests",
                                      help=f"at most {MAX_REQUESTS}: building and queueing a crowd costs time too"),
        "rate_per_s": left.select_slider("arrivals per s", RATES_PER_S, 4, key="wi_rate",
                                         help="arrivals per second (Poisson); 1000: the crowd within a fraction "
                                         "of a second (static batching's first batch: whoever came before its "
                                         "first step)"),
        "token_budget": right.select_slider("token budget", BUDGETS, None, key="wi_budget", format_func=budget_label,
                                            help="auto: vLLM's server default for the card (8192 from 70 GiB, "
                                            "else 2048)"),
        "slots": right.number_input("seats (0: auto)", 0, MAX_NUM_SEQS, 0, key="wi_slots",
                                    help="0: one seat for each user that fits at the context (at most 256)"),
        "prefix_caching": right.toggle("prefix cache", False, key="wi_prefix",
                                       help="requests whose prompts start alike share those KV blocks"),
    }  # fmt: skip


@st.cache_resource(max_entries=8, show_spinner=False)  # a simulated trace stays a few MB in memory
def simulated_crowd(card: str, model: str, dtype: str, kv_dtype: str, context: int, workload: str, requests: int,
                    rate_per_s: float, token_budget: int | None, slots: int, prefix_caching: bool, tp: int = 1,
                    link: str | None = None) -> tuple[dict[str, Trace], bool]:  # fmt: skip
    """Both policies on the same crowd, advanced together on the simulated clock (the one that is behind takes the
    next step) until both are done or CROWD_WORK is spent; on tp cards joined by `link` (each step: one card's share
    and the all-reduces). Returns {scheduler: trace} and whether it stopped early."""
    spec, device = load_spec(model), get_device(card, "auto")
    fit = whatif.plan(spec, device, dtype, kv_dtype, context, tp=tp, link=link)["max_users"]
    seats = slots or max(1, min(MAX_NUM_SEQS, fit))
    engines = {}
    for scheduler in SCHEDULERS:
        runner = SimulatedRunner(spec, device, dtype, kv_dtype, tp=tp, link=link)
        runner.max_len = context  # the longest context a user may hold: longer requests are turned away
        knobs = ChatKnobs(requests=requests, rate_per_s=rate_per_s)
        engines[scheduler] = workload_engine(runner, workload, scheduler, knobs=knobs, slots=seats,
                                             token_budget=token_budget, prefix_caching=prefix_caching)  # fmt: skip
    work, per_step = 0.0, 1 + (PREFIX_WORK_PER_BLOCK * engines["static"].cache.num_blocks if prefix_caching else 0)
    while work < CROWD_WORK:
        busy = [e for e in engines.values() if e.has_work()]
        if not busy:
            break
        record = min(busy, key=lambda e: e.clock.now()).step()
        work += per_step + SEAT_WORK * len(record.seats)
    cut = any(e.has_work() for e in engines.values())
    return {name: e.trace() for name, e in engines.items()}, cut


@st.cache_resource(max_entries=8, show_spinner=False)
def simulated_player(_trace, run_key: tuple, width: int, axis_seconds: float, text_px: int, height: int | None
                     ) -> TracePlayer:  # fmt: skip
    return player_of(_trace, width, axis_seconds=axis_seconds, text_px=text_px, height=height)


def summary_table(players: list[tuple[str, TracePlayer]]) -> str:
    """The whole run of each policy, side by side (markdown)."""
    ms = lambda v: "–" if v is None else f"{1000 * v:,.0f} ms"
    head = "| | tokens/s, whole run | TTFT p50 | TTFT p99 | TPOT p50 | TPOT p99 | seats busy | all done at |"
    lines = [head, "|---" * 8 + "|"]
    for title, p in players:
        s = p.summary
        done = f"{p.end_s:,.1f} s" if s["finished"] + s["rejected"] == s["requests"] else "(stopped)"
        lines.append(
            f"| **{title}** | {s['tokens_per_s']:,.0f} | {ms(s['ttft_p50_s'])} | {ms(s['ttft_p99_s'])} | "
            f"{ms(s['tpot_p50_s'])} | {ms(s['tpot_p99_s'])} | {s['slot_utilization']:.0%} | {done} |"
        )
    return "\n".join(lines)


def first_batch_note(players: list[tuple[str, TracePlayer]]) -> str:
    """Why static batching starts with fewer users than seats when everyone comes "at once": arrivals at a rate
    come one after another (1,000 a second: 50 users in about 50 ms), its first step begins at the first arrival,
    and a static batch takes nobody until all of it is done: the others wait for its longest reply."""
    static = next((p.table for title, p in players if p.table.config["scheduler"] == "static"), None)
    if static is None or static.num_steps < 2:
        return ""
    first, seats = len(static.admitted[0]), static.num_seats
    behind = int(static.num_waiting[1])
    if first >= seats or not behind:
        return ""
    who = f"the {first} request{'s' if first != 1 else ''} that had arrived when its first step began"
    return (f"Static batching's first batch is {who}: the other {behind} arrived during that step, and a static "
            f"batch takes no newcomers, so they wait for its longest reply while {seats - first} of its "
            f"{seats} seats stay empty.")  # fmt: skip


def throughput_note(players: list[tuple[str, TracePlayer]], everyone: dict | None) -> str:
    """The headline's tokens/s (every user that fits decoding in one step) beside each run's: a run also spends
    its steps on prompts, on seats filling and emptying, and static's on held seats, so it makes fewer."""
    if not everyone:
        return ""
    runs = ", ".join(f"{title.removesuffix(' batching')} {p.summary['tokens_per_s']:,.0f}" for title, p in players)
    return (f"The headline's {everyone['tokens_per_s']:,.0f} tokens/s is {everyone['batch']:,} users all decoding "
            f"in the same step; over a whole run the seats do other things too (prompts, filling and emptying, "
            f"static's held seats), so the runs made {runs} tokens/s.")  # fmt: skip


def crowd_notes(players: list[tuple[str, TracePlayer]], settings: dict, context: int, cut: bool,
                everyone: dict | None = None) -> str:  # fmt: skip
    """The seats, the pool, and what the simulation left out (requests too long for the context, a stop); why the
    runs' tokens/s differ from the headline's (`everyone`: whatif.plan of every user that fits, decoding), and why
    static's first batch can be small."""
    config, summary = players[0][1].table.config, players[0][1].summary
    seats = playback.seats(config["slots"])
    seats += "" if settings["slots"] else f" (one per user that fits at {context:,})"
    notes = [f"{seats}, {config['num_blocks']:,} KV blocks of {config['block_size']} tokens, token budget "
             f"{config['token_budget'] or 'none'}."]  # fmt: skip
    if summary["rejected"]:
        notes.append(f"{summary['rejected']} of {summary['requests']} requests were turned away: longer than the "
                     f"{context:,}-token context.")  # fmt: skip
    if cut:
        until = min(p.end_s for _, p in players)
        left = max(p.summary["requests"] - p.summary["finished"] - p.summary["rejected"] for _, p in players)
        notes.append(
            f"Simulated up to {until:,.1f} s, where the work budget of a quick redraw ran out: {left} requests were "
            "still waiting or running (fewer requests, or more seats, simulate to the end)."
        )
    return " ".join([*notes, throughput_note(players, everyone), first_batch_note(players)]).strip()


def crowd_view(choice: dict, everyone: dict | None = None, settings_at=None, headline_at: list | None = None) -> None:
    """The crowd's settings (a popover in `settings_at`), its headline (seats busy, whole run: in `headline_at`, two
    columns, else a row of its own), the player, and under it the whole run's notes and table. everyone: whatif.plan
    of every user that fits decoding together (the view's headline), to compare with."""
    settings = crowd_settings(settings_at)
    card = {k: choice[k] for k in ("card", "model", "dtype", "kv_dtype", "context", "tp", "link")}
    try:
        with st.spinner(f"Simulating {settings['requests']} {settings['workload']} requests, static and continuous…"):
            traces, cut = simulated_crowd(**card, **settings)
    except MinillmError as e:
        st.error(str(e))
        return
    if not all(trace.steps for trace in traces.values()):
        st.warning(f"Nothing to replay: every request was turned away (longer than the {choice['context']:,}-token "
                   "context?).")  # fmt: skip
        return
    end = max(trace.steps[-1].time_s for trace in traces.values())
    size = presenter.chart_size(2)
    key = (*card.values(), *settings.values())
    players = [(SCHEDULERS[name], simulated_player(trace, (name, *key), size.width, end, size.text_px, size.height))
               for name, trace in traces.items()]  # fmt: skip
    play(players, Transport("sim_", speed=10), headline=lambda shown: run_headline(shown, row=headline_at))
    st.subheader(f"{CROWD_TITLE}: the whole run")
    if not presenter.on():
        st.caption(
            "The same engine, schedulers and block allocator that serve the tiny model, with the model's forward "
            "replaced by the roofline's time for each step on this card: every reply has its planned length, the "
            "clock is simulated seconds. Runs advance together in time: a continuous step, with newcomers' prompt "
            "chunks in it, takes longer than a static one."
        )
    st.markdown(f"{crowd_notes(players, settings, choice['context'], cut, everyone)} Over the whole run:\n\n"
                f"{summary_table(players)}")  # fmt: skip
