"""The what-if view: a real model on a real card, by the roofline, then a crowd served on it in simulation.

Its first screen is the crowd (docs/screenshot.py --measure: the seat charts' share of it): one row of controls
(the card, the model, the context; weights, KV cache, cards and link in a popover; the crowd's settings in another),
one line of big numbers (the users that fit and the tokens/s each, beside the crowd's seats busy; each "why?" one
click away), then the step player: the crowd served on the card, static beside continuous, by the same engine and
schedulers as the tiny model on a simulated clock (simulate.py), in simulated seconds. Under it: the crowd's whole
run (its notes and table), then `python -m minillm whatif` in pictures (whatif.plan, roofline.py): the figures,
where the card's memory goes, how many users fit against context, tokens/s against batch with the ridge point. Where
not one user fits (the weights alone are too big, or one user's KV at this context is), it says so and shows no speed
and no crowd. The crowd follows the context slider: by default it gets a seat for every user that fits at that
context, and a request longer than the context is turned away, as a server configured for it would. On several cards
(tp) joined by a link, every number is one card's share, and the view says what crosses the link (multicard.py).

Every control must redraw within about 3 s on a 2-core laptop, so a simulation has a work budget (CROWD_WORK):
the two policies advance together on the simulated clock, and when it is spent both stop at the same simulated
moment and the view says how much of the crowd that left out. A budget keeps the crowd the one asked for (up to
MAX_REQUESTS) and the two runs comparable, and a run the same on every machine (it stops at the same step, whatever
the machine's speed). Each setting is simulated once per session (st.cache_resource): going back to one is instant.
"""

from __future__ import annotations

import io

import streamlit as st
from matplotlib.figure import Figure

from minillm.card import whatif
from minillm.card.calibrate import load_calibration
from minillm.card.hardware import DEVICES, get_device
from minillm.card.model_bytes import KV_BYTES, WEIGHT_BYTES
from minillm.card.modelspec import load_spec, shipped_models
from minillm.card.tensor_parallel import rank_spec
from minillm.errors import MinillmError
from viz.app import crowd, fleet_cards, multicard, presenter
from viz.app.headlines import WHY_LABEL
from viz.app.playback import png_html
from viz.card import (
    plot_comm_share_by_tp,
    plot_memory_split,
    plot_speed_by_batch,
    plot_users_by_context,
    smallest_text_pt,
)
from viz.html import figures_html, headline_html

CONTEXTS = [256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
KV_DTYPES = [d for d in KV_BYTES if d != "fp32"]  # fp32 is minillm's own cache, not a serving engine's
# One row: card, model, context, then two popovers: the rest of the card (weights, KV cache, cards, link) and the crowd.
# In the presenter view (1,160 px of columns at 20 px type) each holds its longest text: "apple-m2-ultra" 14
# characters, "llama-3.1-70b" 13, "context per user (tokens)" 25, "weights, KV, cards" 18 (tests/test_presenter.py).
PICKER_WIDTHS = [1.55, 1.55, 2.4, 1.75, 1.05]
MORE_LABEL = "weights, KV, cards"
CARD_TITLE = "The card, by the roofline"
MORE_HELP = "the weights' and the KV cache's number format, the cards the model is split over (tp) and their link"

HEADLINE_GAP = "<style>.st-key-wi-headline { margin-bottom: 0.3rem; }</style>"  # (its bar's foot, off the transport)


def headline_row() -> list:
    """The headline's line: the users that fit and tokens/s each, why?; the crowd's seats busy, why? (playback's
    headline). Each as wide as its content, packed left (at 1280x720 on a projector 1,219 of 1,240 px), a second
    line only where one is too short (a card's bigger numbers)."""
    bar = st.container(horizontal=True, vertical_alignment="center", gap="small", key="wi-headline")
    return [bar.container(width="content") for _ in range(4)]


def cards() -> list[str]:
    """The table's cards, and this machine once `python -m minillm calibrate` has measured it."""
    measured = load_calibration("cpu") or load_calibration("cuda")
    return [*DEVICES, "this-machine"] if measured else list(DEVICES)


def pickers(row: list) -> dict:
    """The card, the model and the context in the row's first three columns; weights, KV cache, cards (tp) and
    link in a popover in the fourth (their keys as before: links and tests set them)."""
    models = shipped_models()
    choice = {
        "card": row[0].selectbox("card", cards(), index=list(DEVICES).index("rtx-4090"), key="wi_card"),
        "model": row[1].selectbox("model", models, index=models.index("llama-3.1-8b"), key="wi_model"),
        "context": row[2].select_slider(
            "context per user (tokens)",
            CONTEXTS,
            4096,
            key="wi_context",
            format_func=lambda c: f"{c // 1024}k" if c >= 1024 else str(c),
        ),  # fmt: skip
        "tp": 1,
        "link": None,
    }
    more = row[3].popover(MORE_LABEL, icon=":material/tune:", help=MORE_HELP, width="stretch")
    choice["dtype"] = more.selectbox("weights", list(WEIGHT_BYTES), index=1, key="wi_dtype")
    choice["kv_dtype"] = more.selectbox("KV cache", KV_DTYPES, key="wi_kv_dtype")
    try:
        device = get_device(choice["card"], "auto")
        choice["tp"], choice["link"] = multicard.pickers(more, more, load_spec(choice["model"]), device)
    except MinillmError:  # (the view says why below)
        pass
    return choice


def figure_png(fig, dpi: int = 110) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def new_axes(width_in: float, height_in: float):
    return Figure(figsize=(width_in, height_in), layout="constrained").add_subplot()


# The card's pictures, in inches at DPI. A figure's lettering on screen is its points / 72 x the pixels it is shown
# at / its width in inches, whatever the dpi: the memory split (8 in, shown 1,120-1,240 px wide at 1280) gets 9 pt
# legends at 17-19 px, the two side by side (4.8 in, shown 552-610 px) at 14-16 px. (6 in wide in the normal view
# they came out at 8-9 px once the sidebar was open.)
MEMORY_IN, PANEL_IN, DPI = (8.0, 2.06), (4.8, 2.88), 150


@st.cache_data(max_entries=32, show_spinner=False)
def card_pictures(card: str, model: str, dtype: str, kv_dtype: str, context: int, tp: int = 1, link: str | None = None):
    """The memory split, users against context, speed against batch (None where not one user fits) and, on tp > 1
    cards, the all-reduces' share by tp at every user that fits (else None), each as (PNG, its smallest lettering in
    the PNG's pixels). Over tp cards each is one card's share (and the speed pays the all-reduces)."""
    spec, device = load_spec(model), get_device(card, "auto")
    plan = whatif.plan(spec, device, dtype, kv_dtype, context, tp=tp, link=link)
    args = (spec, device, context, dtype, kv_dtype)

    def picture(fig) -> tuple[bytes, float]:
        png = figure_png(fig, DPI)
        return png, smallest_text_pt(fig) * DPI / 72

    users = plan["max_users"]
    everyone = whatif.plan(spec, device, dtype, kv_dtype, context, max(users, 1), tp, link) if tp > 1 else None
    return (
        picture(plot_memory_split(plan, ax=new_axes(*MEMORY_IN))),
        picture(plot_users_by_context(rank_spec(spec, tp), *args[1:], ax=new_axes(*PANEL_IN))),
        picture(plot_speed_by_batch(*args, ax=new_axes(*PANEL_IN), tp=tp, link=link)) if users else None,
        picture(plot_comm_share_by_tp(everyone, ax=new_axes(*PANEL_IN))) if everyone else None,
    )


def no_user_reason(plan: dict) -> str:
    """Why not one user fits, in one sentence (plan["max_users"] == 0)."""
    if not plan["weights_fit"]:
        return (
            f"the weights alone ({plan['weight_bytes'] / 2**30:,.1f} GiB) do not fit in "
            f"{plan['usable_bytes'] / 2**30:,.1f} GiB: pick a bigger card, a smaller model or smaller weights"
        )
    one = plan["kv_bytes_per_user"]  # (whole blocks; a sliding-window layer keeps only its window)
    return (f"one user's KV cache at {plan['context']:,} tokens needs {one / 2**30:,.1f} GiB, and "
            f"{plan['free_kv_bytes'] / 2**30:,.1f} GiB are left after the weights: pick a shorter context, a "
            "smaller KV dtype or a bigger card")  # fmt: skip


def headline(plan: dict, crowd: dict | None, row: list | None) -> None:
    """The view's one big number: users that fit, and the tokens/s each gets when they all decode together, on one
    line (row: its column and the why? popover's), how and why one click away. Where not one user fits, why in full."""
    if not crowd:
        cards = "this card" if plan["tp"] == 1 else f"these {plan['tp']} cards"
        st.markdown(headline_html(f"Not one user fits on {cards}", [("users that fit", "0")],
                                  f"No speed to show: {no_user_reason(plan)}."), unsafe_allow_html=True)  # fmt: skip
        return
    ceiling = f"ceiling: bandwidth / streamed weight bytes = {plan['bandwidth_ceiling_tokens_per_s']:,.1f}"
    note = (f"Each user holding {plan['context']:,} tokens of KV cache, {plan['max_users']:,} fit. {crowd['batch']} "
            f"users decoding together make {crowd['tokens_per_s']:,.0f} tokens/s in total; one user alone gets "
            f"{plan['single_user_tokens_per_s']:,.1f} ({ceiling}).")  # fmt: skip
    parts = [("users that fit", f"{plan['max_users']:,}"), ("tokens/s each", f"{crowd['per_user_tokens_per_s']:,.1f}")]
    line, why = row
    line.markdown(HEADLINE_GAP + headline_html("", parts, one_line=True), unsafe_allow_html=True, width="content")
    with why.popover("why?", icon=":material/info:", help=WHY_LABEL):
        st.markdown(note)
        for reason in crowd["why"]:  # (experts, latent attention, windows: the model's shape, in one computed line)
            st.markdown(f"{reason[0].upper()}{reason[1:]}.")


def figures(plan: dict, crowd: dict) -> None:
    """The headline's batch, one user alone, and what bounds the step (under the crowd)."""
    ceiling = f"ceiling: bandwidth / streamed weight bytes = {plan['bandwidth_ceiling_tokens_per_s']:,.1f}"
    st.markdown(figures_html([
        ("tokens/s, all decoding", f"{crowd['tokens_per_s']:,.0f}", f"{crowd['batch']} users at once",
         "every user that fits decoding in the same step (the roofline): the crowd above also runs prompts"),
        ("one user alone, tokens/s", f"{plan['single_user_tokens_per_s']:,.1f}", "", ceiling),
        ("bound", crowd["bound"], f"{crowd['intensity']:.1f} FLOPs/byte",
         f"against the card's ridge of {crowd['ridge_intensity']:.0f} FLOPs per byte"),
    ]), unsafe_allow_html=True)  # fmt: skip


def card_plans(choice: dict) -> tuple[dict, dict | None, tuple]:
    """The plan of one user, of every user that fits decoding together (the headline's figures; None when not one
    user fits: a crowd needs a seat), and the card's pictures (MinillmError: a card or model it cannot price)."""
    spec, device = load_spec(choice["model"]), get_device(choice["card"], "auto")
    args, cards = (choice["dtype"], choice["kv_dtype"], choice["context"]), (choice["tp"], choice["link"])
    plan = whatif.plan(spec, device, *args, 1, *cards)
    crowd = whatif.plan(spec, device, *args, plan["max_users"], *cards) if plan["max_users"] else None
    return plan, crowd, card_pictures(choice["card"], choice["model"], *args, *cards)


def card_view(choice: dict, plan: dict, crowd: dict | None, pictures: tuple) -> None:
    """The roofline half, under the crowd: the figures, what crosses the link, the memory split, users against
    context, speed against batch, and the numbers as the command line prints them."""
    st.subheader(CARD_TITLE)
    if not presenter.on():
        st.caption(
            "A real model on a real card, priced by the roofline (minillm/card/roofline.py): a decode step streams "
            "every weight once for all users together, and each user's KV cache takes memory and bandwidth."
        )
    if crowd:
        figures(plan, crowd)
        for reason in crowd["why"]:  # what this model's shape changes (whatif.why): said where the numbers are
            st.caption(f"{reason[0].upper()}{reason[1:]}.")
        if crowd["preempted"]:  # (a second KV tier: swap_cost.py)
            st.caption(f"A user preempted from this crowd: {whatif.preempted_line(crowd)}.")
    memory, users, speed, by_tp = pictures
    multicard.tp_view(plan, crowd, by_tp)

    def show(where, picture: tuple[bytes, float], alt: str) -> None:  # inline, marked with its lettering
        where.markdown(png_html(picture[0], alt, picture[1]), unsafe_allow_html=True)

    show(st, memory, "where the card's memory goes")
    left, right = st.columns(2)
    show(left, users, "users that fit against context")
    if crowd:
        show(right, speed, "decode speed against batch")
    else:  # a speed for users who cannot be served would contradict the number above
        right.info(f"No decode speed: not one user fits. {no_user_reason(plan).capitalize()}.")
    with st.expander("the numbers, as `python -m minillm whatif` prints them"):
        flags = f"--model {choice['model']} --gpu {choice['card']} --dtype {choice['dtype']}"
        flags += f" --kv-dtype {choice['kv_dtype']}{multicard.flags(plan)}"
        st.code(f"$ python -m minillm whatif {flags} --context {choice['context']}\n{whatif.summary(plan)}",
                language=None)  # fmt: skip


@st.cache_data(max_entries=2, show_spinner=False)
def machine_roofline_png(measured_at: str, device: str) -> bytes | None:
    """This machine's measured steps (the last `whatif --validate`) beside the prediction, as a PNG (None: none)."""
    from minillm.bench.report_roofline import roofline_figure
    from minillm.card.validate import measurements

    saved = measurements(device)
    if not saved or not saved.get("rows"):
        return None
    sizes = list(dict.fromkeys(r["size"] for r in saved["rows"]))
    return figure_png(roofline_figure(saved["rows"], saved["calibration"], sizes[0], sizes[-1]), 100)


def this_machine_view() -> None:
    """The machine in front of you as a card: what calibration measured, and the steps it was checked against."""
    from minillm.card.validate import this_machine

    here = this_machine("auto")
    with st.expander("this machine, measured (python -m minillm calibrate)", expanded=not presenter.on()):
        st.code(here["description"], language=None)
        png = machine_roofline_png(here["measured_at"] or "", here["calibration"]["device"]) if here["dots"] else None
        if png is None:
            st.info("No measured steps yet: `python -m minillm whatif --validate` times real decode steps of the "
                    "3M model and larger ones here (a few minutes) and puts them beside the prediction.")  # fmt: skip
        else:
            st.image(png, width="stretch", caption=f"measured {here['measured_at']}: dots measured, lines predicted")


def show() -> None:
    """The controls' row, the headline's line, the crowd's player; under it the crowd's run, the card, the fleet."""
    row = st.columns(PICKER_WIDTHS, vertical_alignment="bottom")
    choice = pickers(row)
    try:
        plan, everyone, pictures = card_plans(choice)
    except MinillmError as e:
        st.error(str(e))
        plan = everyone = None
    if everyone:
        top = headline_row()
        headline(plan, everyone, top[:2])
        crowd.crowd_view(choice, everyone, row[4], top[2:])
        st.divider()
    elif plan:
        headline(plan, None, None)
    if choice["card"] == "this-machine":
        this_machine_view()
    if plan:
        card_view(choice, plan, everyone, pictures)
    if everyone:
        fleet_cards.fleet_view(choice)
