"""The what-if view's cards and link: one model split over several cards (tensor parallelism), and what they send.

Each of tp cards holds 1/tp of the weights and of every user's KV cache (minillm/card/tensor_parallel.py), so the
memory split, the users that fit and the speed above are one card's share; and each layer's two all-reduces cross
the link between the cards, every step. This part shows the link and what crossing it costs: the all-reduces'
share of a decode step (at each tp the model splits into), the batches where it takes over half, and a prompt
chunk's share. At tp = 1 nothing is sent and nothing here is drawn: the view is the one-card view.
"""

from __future__ import annotations

import streamlit as st

from minillm.card.hardware import Device
from minillm.card.modelspec import ModelSpec
from minillm.card.roofline import RESERVE_TOKENS
from minillm.card.tensor_parallel import tp_choices
from viz.app.playback import png_html
from viz.html import figures_html

LINKS = ["nvlink-4", "nvlink-3", "pcie-4", "pcie-5"]  # between cards in one server (hardware.LINKS)
TP_HELP = ("tensor parallelism: the model split over this many cards, each holding 1/tp of its weights and of every "
           "user's KV cache; two all-reduces a layer join them every step")  # fmt: skip
LINK_HELP = ("how the cards talk (the card's own first): NVLink between SXM cards, PCIe between the others, at "
             "the datasheets' rates; with more than one card")  # fmt: skip


def pickers(tp_at, link_at, spec: ModelSpec, device: Device) -> tuple[int, str | None]:
    """The cards (every tp that splits the model evenly) and their link: the card's own first (None: it has none
    the cost model knows, and tp > 1 asks for one)."""
    choices = tp_choices(spec)
    asked = st.query_params.get("tp", "1")  # ?view=what-if&tp=2 opens on two cards (a link; docs/screenshot.sh)
    first = choices.index(int(asked)) if asked.isdigit() and int(asked) in choices else 0
    if st.session_state.get("wi_tp", 1) not in choices:
        del st.session_state["wi_tp"]  # (a model that does not split that way: back to the first choice)
    tp = tp_at.selectbox("cards (tp)", choices, first, key="wi_tp", help=TP_HELP)
    links = [device.link, *(name for name in LINKS if name != device.link)] if device.link else [None, *LINKS]
    if st.session_state.get("wi_link", links[0]) not in links:
        del st.session_state["wi_link"]  # (another card, with no link the cost model knows: "none known")
    link = link_at.selectbox("link", links, key="wi_link", format_func=lambda name: name or "none known",
                             help=LINK_HELP, disabled=tp == 1)  # fmt: skip
    return tp, link


def flags(plan: dict) -> str:
    """The command line's --tp and --link (none on one card)."""
    return f" --tp {plan['tp']} --link {plan['link']}" if plan["tp"] > 1 else ""


def _ms(seconds: float | None) -> str:
    return "–" if seconds is None else f"{1e3 * seconds:,.2f}"


def tp_view(plan: dict, crowd: dict | None, chart: tuple[bytes, float] | None) -> None:
    """tp > 1: the link, what the cards send each other per step, and its share of the step (`crowd`: every user that
    fits decoding together, the headline's batch; else one user); chart: comm_share_by_tp drawn (png_html's)."""
    if plan["tp"] == 1:
        return
    at = crowd or plan
    users = f"{at['batch']:,} user{'s' * (at['batch'] != 1)} decoding"
    left, right = st.columns([1.25, 1], vertical_alignment="center")
    left.markdown(
        f"**{plan['tp']} cards, over {plan['link_label']}**: each holds 1/{plan['tp']} of the weights "
        f"({plan['total_weight_bytes'] / 2**30:,.1f} GiB in all) and of every user's KV cache; "
        f"{at['allreduces_per_step']} all-reduces and a gather of the logits join them every step. Over half the "
        f"step {at['comm_dominates']}."
    )
    left.markdown(figures_html([
        ("all-reduce share", f"{at['comm_share']:.0%}", f"{_ms(at['comm_s'])} of {_ms(at['decode_step_s'])} ms",
         f"the collectives' seconds in a decode step of {users}"),
        ("sent per card, MiB", f"{at['allreduce_bytes_per_step'] / 2**20:,.1f}", "each step",
         "bytes each card sends in a step's all-reduces (a ring: 2(tp-1)/tp of each buffer)"),
        ("share of a prompt chunk", f"{at['prefill_chunk_comm_share']:.0%}", f"{RESERVE_TOKENS:,} tokens",
         "the all-reduces' share of one prefill chunk: big activations, but many FLOPs to hide behind"),
    ]), unsafe_allow_html=True)  # fmt: skip
    if chart is not None:
        picture = png_html(chart[0], "all-reduce share by the number of cards", chart[1])
        right.markdown(f'<div style="margin-bottom:1rem">{picture}</div>', unsafe_allow_html=True)  # (bar_block)
