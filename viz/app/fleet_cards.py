"""The what-if view's fleet: several of the chosen card serving one crowd, as replicas or split prefill : decode.

card/fleet.py runs the real engine on every card of a fleet, on one simulated time line: N replicas, each arrival
sent to the least loaded; or P prefill cards and D decode cards, each prompt's KV priced over the link between them.
Here the same crowd is served once per split (N replicas, then 1 : N-1 up to N-1 : 1, as `whatif --fleet` does), and
the view shows each split's figures (fleet_figures.py), three panels (TTFT p99 on a log scale, ITL p99, goodput for
DistServe's chatbot targets and for the pair chosen), and any split's cards replayed in the step player: each card's
trace is an ordinary trace (FleetRun.traces()).

Every split runs every card, so the work grows with the crowd and the cards squared: 4 cards serving 100 requests
took 3-5 s of a 2-core machine. So the panel opens closed (a closed one costs nothing), the crowd is bounded by
FLEET_WORK, and every setting is simulated once per session (the targets only recount the runs).
"""

from __future__ import annotations

import streamlit as st

from minillm.card.fleet import FleetRun, simulate_fleet
from minillm.card.fleet_figures import TIMES, TPOT_TARGET_S, TTFT_TARGET_S, fleet_figures, ms
from minillm.card.hardware import LINKS, get_device
from minillm.card.modelspec import load_spec
from minillm.errors import MinillmError
from minillm.runs.workload import SIMULATED_WORKLOADS, ChatKnobs, make_workload
from viz.app import presenter
from viz.app.crowd import simulated_player
from viz.app.playback import Transport, play, png_html
from viz.app.trace_files import figure_png
from viz.card import smallest_text_pt
from viz.fleet_splits import plot_splits

CARDS = [2, 4, 8]
MAX_REQUESTS = 300
# Requests x cards^2 at most: every split runs every card (cards splits of cards engines), each stepping while it has
# work. 4 cards x 100 requests took 3.2-5.3 s on this project's 2-core machine shared with other work (8 x 300: 27-50 s)
FLEET_WORK = 1600
RATES_PER_S = [1, 2, 4, 8, 16, 32, 64, 128]
TTFT_TARGETS_S = [0.1, 0.25, 0.5, 1.0, 2.5]
TPOT_TARGETS_S = [0.005, 0.01, 0.025, 0.05, 0.1, 0.15]  # default 25 ms: 40 tokens/s each, tighter than DistServe's
DISTSERVE = f"TTFT {TTFT_TARGET_S:g} s, TPOT {TPOT_TARGET_S * 1e3:g} ms (DistServe's chatbot)"
SPLITS_IN, DPI = (8.0, 2.9), 150  # figure_png's dpi: shown 1,100-1,240 px wide at 1280, 9 pt ticks come out 17-19 px


def max_requests(cards: int) -> int:
    return min(MAX_REQUESTS, FLEET_WORK // cards**2)


def settings(device) -> dict:
    """The fleet's controls: cards, the crowd, the link a prompt's KV crosses, and a pair of targets."""
    row = st.columns([0.8, 1.3, 1.25, 1.3, 1.25, 1.2, 1.2])
    links = [device.link, *(name for name in LINKS if name != device.link)] if device.link else list(LINKS)
    cards = row[0].selectbox("cards", CARDS, CARDS.index(4), key="wf_cards")
    most = max_requests(cards)
    if st.session_state.get("wf_requests", 0) > most:  # (more cards: a smaller crowd, or a redraw takes long)
        del st.session_state["wf_requests"]
    why = f"at most {most} on {cards} cards: every split serves them all, so the work grows with the cards squared"
    return {
        "cards": cards,
        "workload": row[1].selectbox("workload", SIMULATED_WORKLOADS, key="wf_workload"),
        "requests": row[2].number_input("requests", 1, most, min(100, most), key="wf_requests", help=why),
        "rate_per_s": row[3].select_slider("arrivals per s", RATES_PER_S, 8, key="wf_rate"),
        "link": row[4].selectbox("KV link", links, key="wf_link", help="what a prompt's KV crosses, prefill to decode"),
        "ttft_s": row[5].selectbox("TTFT target, s", TTFT_TARGETS_S, TTFT_TARGETS_S.index(0.25), key="wf_ttft"),
        "tpot_s": row[6].selectbox("TPOT target, s", TPOT_TARGETS_S, TPOT_TARGETS_S.index(0.025), key="wf_tpot"),
    }


@st.cache_resource(max_entries=3, show_spinner=False)  # a fleet's engines and traces: a few MB a split
def simulated_splits(card: str, model: str, dtype: str, kv_dtype: str, cards: int, workload: str, requests: int,
                     rate_per_s: float, link: str) -> list[FleetRun]:  # fmt: skip
    """The same crowd on `cards` cards: replicas, then every prefill : decode split (compare_splits' runs)."""
    spec, device = load_spec(model), get_device(card, "auto")
    crowd = make_workload(workload, ChatKnobs(requests=requests, rate_per_s=rate_per_s))
    return [simulate_fleet(spec, device, crowd, cards, p, link=link, dtype=dtype, kv_dtype=kv_dtype)
            for p in range(cards)]  # fmt: skip


def table(rows: list[dict], mine: list[float], theirs: list[float]) -> str:
    """`whatif --fleet`'s table (markdown), both goodputs."""
    times = " | ".join(f"{name}, ms" for name, _ in TIMES)
    head = f"| split | {times} | goodput, yours | DistServe's | tokens/s |"
    lines = [head, "|---" * (len(TIMES) + 4) + "|"]
    for r, good, distserve in zip(rows, mine, theirs):
        times = " | ".join(ms(r[key]) for _, key in TIMES)
        lines.append(f"| **{r['split']}** | {times} | {good:.0%} | {distserve:.0%} | {r['tokens_per_s']:,.0f} |")
    return "\n".join(lines)


def fleet_view(choice: dict) -> None:
    """The panel, inside a lazy expander (closed: nothing runs)."""
    title = "A fleet of these cards: replicas, or prefill and decode apart"
    box = st.expander(title, key="wi_fleet", on_change="rerun", bind="query-params")
    if not box.open:
        return
    with box:
        device = get_device(choice["card"], "auto")
        if not presenter.on():
            st.caption("One engine per card on one simulated clock (card/fleet.py): as replicas, each arrival goes to "
                       "the least loaded card; split P : D, it goes to a prefill card, and after its first token its "
                       "KV crosses the link to a decode card. Goodput: the share of requests that meet both "
                       "targets.")  # fmt: skip
        asked = settings(device)
        card = [choice[k] for k in ("card", "model", "dtype", "kv_dtype")]
        crowd = [asked[k] for k in ("cards", "workload", "requests", "rate_per_s", "link")]
        try:
            with st.spinner(f"Simulating {asked['requests']} requests on {asked['cards']} cards, every split…"):
                runs = simulated_splits(*card, *crowd)
        except MinillmError as e:
            st.error(str(e))
            return
        rows = [fleet_figures(run, asked["ttft_s"], asked["tpot_s"]) for run in runs]
        distserve = [fleet_figures(run)["goodput"] for run in runs]
        mine = [r["goodput"] for r in rows]
        yours = f"TTFT {asked['ttft_s']:g} s, TPOT {asked['tpot_s'] * 1e3:g} ms (yours)"
        best = max(range(len(rows)), key=lambda i: (mine[i], rows[i]["tokens_per_s"]))
        wall = sum(r.wall_s for r in runs)
        st.markdown(f"**Most goodput at your targets: {rows[best]['split']} ({mine[best]:.0%})**; "
                    f"simulated in {wall:.1f} s of this machine's time.")  # fmt: skip
        fig = plot_splits(rows, {yours: mine, DISTSERVE: distserve}, SPLITS_IN)
        png = png_html(figure_png(fig, DPI), "TTFT, ITL and goodput by split", smallest_text_pt(fig) * DPI / 72)
        st.markdown(png, unsafe_allow_html=True)
        st.markdown(table(rows, mine, distserve))
        replay(runs, [r["split"] for r in rows], crowd)


def replay(runs: list[FleetRun], splits: list[str], crowd: list) -> None:
    """Two cards of one split in the step player: two replicas, or a prefill card beside a decode card."""
    shown = st.selectbox("replay two of its cards", ["none", *splits], key="wf_replay")
    if shown == "none":
        return
    run = runs[splits.index(shown)]
    cards = [0, 1] if not run.prefill else [0, run.prefill]  # (the first prefill card, the first decode card)
    traces = {i: run.engines[i].trace() for i in cards if run.engines[i].records}
    end = max(trace.steps[-1].time_s for trace in traces.values())
    size = presenter.chart_size(2)
    players = [(f"card {i}: {run.roles[i]}", simulated_player(trace, ("fleet", shown, i, *crowd), size.width, end,
                                                              size.text_px, size.height))
               for i, trace in traces.items()]  # fmt: skip
    play(players, Transport("fleet_", speed=10))
