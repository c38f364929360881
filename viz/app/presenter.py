"""The presenter view (`?present=1`, or the toggle at the top): the app on a projector, read from the back of a room.

What changes: no sidebar (each view's settings go in a popover at the top of the view: it floats over the page
when open and takes one button's room when closed), larger type (20 px, 24 px on a screen 1700 px wide or more;
Streamlit sizes its text in rem, so raising the root size raises it all), the title and the toggle beside the tabs,
charts drawn taller and with larger lettering, and every view leads with one line of big numbers. The step player's
first screen at 1280x720 is the transport, the headline and the two seat charts with the step's event and the queue
under them (docs/screenshot.py --check-layout measures it in a browser). The widths below are what the label check
in tests/test_presenter.py measures the controls against.
"""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

KEY = "present"  # the toggle's session key and the query parameter
FONT_PX, WIDE_FONT_PX, WIDE_FROM_PX = 20, 24, 1700  # the root font size, and from which screen width the larger one
PADDING_REM = 1.0  # the page's left and right padding, in root font sizes
NORMAL_FONT_PX = 16  # Streamlit's own root size (the normal view)
NORMAL_PADDING_REM = 1.5  # the normal view's left and right padding (Streamlit's own: 5 rem)
NORMAL_MAIN_PX = 1280 - 300 - 2 * NORMAL_PADDING_REM * NORMAL_FONT_PX  # its main column at 1280 px, the sidebar open
LETTERING_PX = {True: 14, False: 10}  # the smallest chart lettering on screen at 1280 px: presenter view, normal view


@dataclass(frozen=True)
class ChartSize:
    """How an occupancy chart is drawn: its width and smallest lettering in pixels, and its height (None: rows of
    raster.row_height). Drawn at about the width it is shown at on a 1280 px page, so its lettering is what it says."""

    width: int
    text_px: int
    height: int | None = None


# Presenter view at 1280x720: a panel of two is (1280 - 2 x 20 - 20) / 2 = 610 px wide; 372 px tall puts two seat
# charts over half the screen's height with the transport above them and the step's event and queue below. At
# 1920x1080 the same picture is shown 1.5x (its lettering 30 px); the CSS below caps its height there so the KV map
# also makes the first screen.
PRESENTER_CHARTS = {1: ChartSize(1240, 20, 372), 2: ChartSize(610, 20, 372)}
# Normal view at 1280 px with the sidebar open: a panel of two is (1280 - 300 - 2 x 24 - 16) / 2 = 458 px wide, one is
# 932. Drawn larger than that (a wider screen shows it larger, and sharp), with lettering that comes out at 11.9 and
# 13.1 px at 1280. Two are drawn 500 px tall, shown 409: from under the transport to the bottom of a 720 px screen,
# the two charts cover 40% of it (docs/screenshot.py --measure), as in the presenter view.
NORMAL_CHARTS = {1: ChartSize(1100, 14), 2: ChartSize(560, 16, 500)}

HIDDEN_KEYS = "clicker-keys"  # a container of buttons that are only keyboard shortcuts (playback.clicker_keys)
# Streamlit prints a button's keyboard shortcut inside it ("Space"), which squeezed "play" out of its box at 1280 px
# (in either view): the shortcuts still work, and each button's tooltip names its key. The shortcut-only buttons: out
# of the layout's flow and out of sight, still mounted (a button that is not drawn at all has no shortcut).
ALWAYS = f"""<style>[data-testid^='stBaseButton'] kbd {{ display: none; }}
[class*="st-key-"][class*="{HIDDEN_KEYS}"] {{ position: absolute !important; width: 1px !important; height: 1px;
  overflow: hidden; clip-path: inset(50%); opacity: 0; pointer-events: none; }}
</style>"""
# The normal view: Streamlit's main column starts 6 rem down, under a 3.75 rem header (transparent; its menu and the
# sidebar's button at the sides): start it near the top (clicks through the header's empty middle reach the title's
# row), with smaller gaps, so that no band of nothing sits above the charts.
NORMAL_CSS = f"""<style>
[data-testid="stMainBlockContainer"] {{ padding: 2.25rem {NORMAL_PADDING_REM}rem 4rem !important; }}
header[data-testid="stHeader"] {{ pointer-events: none; }}
header[data-testid="stHeader"] > * {{ pointer-events: auto; }}
[data-testid="stMainBlockContainer"] [data-testid="stVerticalBlock"] {{ gap: 0.7rem; }}</style>"""
CSS = f"""<style>
html {{ font-size: {FONT_PX}px !important; }}
@media (min-width: {WIDE_FROM_PX}px) {{ html {{ font-size: {WIDE_FONT_PX}px !important; }}
  img[data-chart] {{ max-height: 50vh; object-fit: contain; object-position: left top; }} }}
section[data-testid="stSidebar"], [data-testid="stSidebarCollapsedControl"], [data-testid="stExpandSidebarButton"],
header[data-testid="stHeader"] {{ display: none !important; }}
[data-testid="stMainBlockContainer"] {{ padding: 0.2rem {PADDING_REM}rem 2rem {PADDING_REM}rem !important;
  max-width: 100% !important; position: relative; }}
[data-testid="stMainBlockContainer"] [data-testid="stVerticalBlock"] {{ gap: 0.4rem; }}
.st-key-app-bar {{ position: absolute; top: 0.55rem; right: {PADDING_REM}rem; width: auto !important; z-index: 5; }}
[data-testid="stMainBlockContainer"] h3 {{ font-size: 1.25rem; padding: 0.1rem 0 1rem 0; }}
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
    st.markdown(ALWAYS + (CSS if on() else NORMAL_CSS), unsafe_allow_html=True)


def settings(label: str, where=None, short: str | None = None):
    """Where a view puts its settings: the sidebar, or in the presenter view a popover (in `where`, e.g. a column,
    to share a row with the transport or the headline), its button labelled `short` (default `label`)."""
    if not on():
        return st.sidebar
    return (where or st).popover(short or label, help=label, width="stretch")


def heading(bar, text: str) -> None:
    """A settings group's title: a header in the sidebar, bold in a popover."""
    if bar is st.sidebar:
        bar.header(text)
    else:
        bar.markdown(f"**{text}**")


def settings_row(weights: list[float]) -> list:
    """Columns of these weights for the settings popovers and what shares their row (the headline) in the presenter
    view; Nones otherwise (settings go to the sidebar)."""
    return list(st.columns(weights, vertical_alignment="center")) if on() else [None] * len(weights)


def chart_size(panels: int) -> ChartSize:
    sizes = PRESENTER_CHARTS if on() else NORMAL_CHARTS
    return sizes.get(panels, sizes[2])
