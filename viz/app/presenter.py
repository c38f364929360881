"""The presenter view (`?present=1`, or the toggle at the top): the app on a projector, read from the back of a room.

What changes: no sidebar (each view's settings go in an expander above it), larger type (20 px, 24 px on a screen
1700 px wide or more; Streamlit sizes its text in rem, so raising the root size raises it all), charts drawn with
larger lettering, and every view leads with one headline number set large. The widths below are what the label
check in tests/test_presenter.py measures the controls against.
"""

from __future__ import annotations

import streamlit as st

KEY = "present"  # the toggle's session key and the query parameter
FONT_PX, WIDE_FONT_PX, WIDE_FROM_PX = 20, 24, 1700  # the root font size, and from which screen width the larger one
PADDING_REM = 1.0  # the page's left and right padding, in root font sizes
CHART_TEXT_PX = 24  # the occupancy chart's lettering (drawn into the picture: scaled with it)
CHART_WIDTH_PX = {1: 1200, 2: 760}  # the chart's width, one panel or two side by side: at 1280 px a two-panel
# chart is shown about 0.8x (its 24 px text reads as 19 px), at 1920 about 1.2x

# Streamlit prints a button's keyboard shortcut inside it ("Space"), which squeezed "play" out of its box at 1280 px
# (in either view): the shortcuts still work, and each button's tooltip names its key.
ALWAYS = "<style>[data-testid^='stBaseButton'] kbd { display: none; }</style>"
CSS = f"""<style>
html {{ font-size: {FONT_PX}px !important; }}
@media (min-width: {WIDE_FROM_PX}px) {{ html {{ font-size: {WIDE_FONT_PX}px !important; }} }}
section[data-testid="stSidebar"], [data-testid="stSidebarCollapsedControl"], [data-testid="stExpandSidebarButton"],
header[data-testid="stHeader"] {{ display: none !important; }}
[data-testid="stMainBlockContainer"] {{ padding: 0.2rem {PADDING_REM}rem 2rem {PADDING_REM}rem !important;
  max-width: 100% !important; }}
[data-testid="stMainBlockContainer"] [data-testid="stVerticalBlock"] {{ gap: 0.6rem; }}
</style>"""


def start() -> bool:
    """Read ?present=1 into the toggle's state on the first run; returns whether the presenter view is on."""
    if KEY not in st.session_state:
        st.session_state[KEY] = st.query_params.get(KEY, "0").lower() in ("1", "true", "yes", "on")
    return on()


def on() -> bool:
    return bool(st.session_state.get(KEY, False))


def _follow_toggle() -> None:
    """Keep the address bar in step with the toggle, so the link to this view opens it again."""
    if st.session_state[KEY]:
        st.query_params[KEY] = "1"
    else:
        st.query_params.pop(KEY, None)


def toggle(where) -> None:
    where.toggle("presenter view", key=KEY, on_change=_follow_toggle,
                 help="for a projector: no sidebar, large type, one big number per view (?present=1)")  # fmt: skip


def style() -> None:
    st.markdown(ALWAYS + (CSS if on() else ""), unsafe_allow_html=True)


def settings(label: str, where=None):
    """Where a view puts its settings: the sidebar, or in the presenter view an expander at the top of the view
    (or in `where`, e.g. a column, to share a row with another)."""
    return (where or st).expander(label, icon=":material/tune:") if on() else st.sidebar


def settings_row(count: int) -> list:
    """Columns for `count` settings expanders side by side in the presenter view (none needed otherwise)."""
    return list(st.columns(count)) if on() else [None] * count


def chart_width(panels: int, normal: int) -> int:
    return CHART_WIDTH_PX.get(panels, CHART_WIDTH_PX[2]) if on() else normal


def chart_text_px(normal: int) -> int:
    return CHART_TEXT_PX if on() else normal
