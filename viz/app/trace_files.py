"""A trace to and from a file: the step player's downloads (the trace as JSON, its seat chart as a PNG) and
an uploaded trace replayed in place of the live runs (a bad file is reported in a line, never a traceback).
"""

from __future__ import annotations

import io
import json

import streamlit as st

from minillm.layers.trace import Trace
from minillm.runs import trace_file
from viz.app import presenter
from viz.player import TracePlayer
from viz.targets import player_of


@st.cache_resource(max_entries=2, show_spinner="Reading the trace…")
def cached_upload(data: bytes, width: int, text_px: int, height: int | None) -> TracePlayer | str:
    trace = load_uploaded_trace(data)
    if isinstance(trace, str):
        return trace
    seconds = trace.steps[-1].time_s if trace.config.get("clock") == "simulated" else None
    return player_of(trace, width, axis_seconds=seconds, text_px=text_px, height=height)


def load_uploaded_trace(data: bytes) -> Trace | str:
    """A trace from an uploaded file, or the one-line reason it is not a valid minillm trace."""
    try:
        trace = trace_file.loads(data)
        player_of(trace, 400).frame(0)  # valid on paper is not enough: it must also draw
        return trace
    except trace_file.TraceError as e:
        return str(e)
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
        return f"invalid minillm trace: {type(e).__name__}: {e}"


def remember_upload() -> None:
    upload = st.session_state.get("upload")
    st.session_state.upload_bytes = upload.getvalue() if upload is not None else None


def exports(players: list[tuple[str, TracePlayer]], where=None) -> None:
    """Downloads are built only when clicked, and clicking does not rerun the app."""
    bar = presenter.settings("save or load a trace", where, "trace")
    presenter.heading(bar, "Save / load a trace")
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
            data=lambda p=player: p.frame(p.last_step).occupancy_png,  # (the chart on screen, whole run)
            file_name=f"{name}.png",
            mime="image/png",
            on_click="ignore",
        )
    bar.file_uploader("replay a saved trace (.json)", type=["json"], key="upload", on_change=remember_upload)


def figure_png(fig, dpi: int = 150) -> bytes:
    """A matplotlib figure as PNG bytes (the what-if view's charts)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def uploaded_players() -> list[tuple[str, TracePlayer]]:
    """The uploaded trace, if one is loaded; a bad file is reported and the live runs stay on screen."""
    upload = st.session_state.upload_bytes
    size = presenter.chart_size(1)
    loaded = cached_upload(upload, size.width, size.text_px, size.height) if upload else None
    if isinstance(loaded, str):
        st.error(f"That file cannot be replayed: {loaded}")
    if not isinstance(loaded, TracePlayer):
        return []
    config = loaded.trace.config
    st.info(f"Replaying an uploaded trace ({config['scheduler']}, {config['workload']}); clear it in the sidebar.")
    return [(f"uploaded: {config['scheduler']}", loaded)]
