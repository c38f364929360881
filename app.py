"""minillm in the browser: watch one engine serve a crowd, step by step.

    streamlit run app.py            (?view=what-if opens the second tab, ?step=300 a moment of the story,
                                     ?present=1 the presenter view: large type, no sidebar, for a projector)
    streamlit run app.py -- --live http://127.0.0.1:8000    (opens on the live tab, watching that server)

A thin front end: each tab is a view in viz/app/, and only the open tab runs.
"""

from __future__ import annotations

import gc
import sys

import streamlit as st

from viz.app import live, presenter, step_player, whatif

VIEWS = {  # tab -> the function that draws it (the first is the default)
    "step player": step_player.show,
    "what-if": whatif.show,
    "live": live.show,
}


def live_flag(argv: list[str]) -> str | None:
    """The server given by `--live URL` (or --live=URL) among the script's arguments (what follows `--` after
    `streamlit run app.py`); a bare --live means the default address; None without the flag. Other arguments are
    left alone (tests run this file under pytest's)."""
    for i, arg in enumerate(argv):
        if arg.startswith("--live="):
            return arg.removeprefix("--live=")
        if arg == "--live":
            following = argv[i + 1] if i + 1 < len(argv) else ""
            return live.DEFAULT_URL if not following or following.startswith("-") else following
    return None


def main() -> None:
    present = presenter.start()
    st.set_page_config(page_title="minillm: one GPU, many users", page_icon="🧮", layout="wide",
                       initial_sidebar_state="collapsed" if present else "auto")  # fmt: skip
    presenter.style()
    if present:  # the title and the toggle beside the tabs (the CSS lifts this bar there): the room's screen is short
        bar = st.container(key="app-bar", horizontal=True, vertical_alignment="center", gap="medium", width="content")
        bar.markdown("**minillm: one GPU, many users**")
        presenter.toggle(bar)
    else:
        title, switch = st.columns([5, 1.4], vertical_alignment="center")
        title.markdown(
            '<div style="font-size:1.6rem;font-weight:700;line-height:1.2">minillm: one GPU, many users</div>',
            unsafe_allow_html=True,
        )  # (one line, not a st.title: the charts start on the first screen)
        presenter.toggle(switch)
    server = live_flag(sys.argv[1:])
    if server is not None:
        live.open_on(server)
    start = "live" if server is not None else None  # None: the first tab
    tabs = st.tabs(list(VIEWS), key="view", on_change="rerun", bind="query-params", default=start)
    for tab, show in zip(tabs, VIEWS.values()):
        if tab.open:  # tabs are lazy: a closed tab's view does not run
            with tab:
                show()
    if not gc.get_freeze_count():
        # Streamlit collects garbage after every run, each frame of a playing view included (runner.postScriptGC):
        # over the 200,000-odd objects of torch, numpy and the modules, about 125 ms a frame on this project's
        # 2-core machine, more than drawing it. Frozen once, after the first run, the cycle collector skips them
        # (they live as long as the app; anything freed by its last reference is still freed at once).
        gc.freeze()


if __name__ == "__main__":  # streamlit runs this file as __main__; tests import the views without a page
    main()
