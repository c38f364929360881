"""The presenter view on a 1280x720 projector: no control's label is cut.

Two checks. The first always runs, in pure Python: the app is driven headless (Streamlit's AppTest), and each
control's text is measured against the width its column gets on a 1280 px page, from the column weights the layout
asks for and the presenter view's type size and padding (viz/app/presenter.py), with an upper bound on how wide a
character is. The second runs the real app in headless Chromium (docs/screenshot.py --check-labels) and asks the
browser which texts it clipped; it is skipped where no chromium is installed (CI installs none).

The character bound: Streamlit's font (Source Sans) measured about 0.37 em per character for this app's labels in
Chromium here ("prefix cache": 88 px at 20 px type, "100 steps/s" about the same); CHAR_EM = 0.5 em bounds lowercase
labels with their digits, spaces and an occasional capital (Source Sans' digits are 0.5 em, its lowercase narrower).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from streamlit.testing.v1 import AppTest
from streamlit.testing.v1.element_tree import Widget

from viz.app import presenter

ROOT = Path(__file__).parent.parent
VIEWPORT_PX = 1280
REM = presenter.FONT_PX  # below the wide-screen size: 1280 px gets the smaller type
CHAR_EM = 0.5  # an upper bound on one character's width, in ems (module docstring)
GAP_REM = 1.0  # between two columns of st.columns (gap "small")
EXPANDER_PAD_REM = 1.0  # an expander's content, each side
# What each kind of control draws beside its text, in rem: padding, borders, icons, arrows, steppers.
CHROME_REM = {
    "button": 1.6,  # padding 0.75 each side, border
    "button_icon": 1.75,  # an icon and the gap after it
    "select_value": 3.4,  # padding, the drop-down arrow
    "number_value": 5.2,  # padding, the - and + steppers
    "toggle": 3.0,  # the switch and the gap after it
    "help": 1.4,  # a label's question mark
    "expander": 4.5,  # padding, the icon and the open/close arrow
    "radio_option": 1.6,  # the circle and the gap after it
}


def text_px(text: str, rem: float = REM) -> float:
    return len(text) * CHAR_EM * rem


def label_px(widget) -> float:
    """The width a widget's label line needs (0 when the label is hidden)."""
    if not widget.label or widget.proto.label_visibility.value != 0:  # 0: visible (hidden, collapsed: no room)
        return 0.0
    return text_px(widget.label) + (CHROME_REM["help"] * REM if widget.help else 0.0)


def needs(widget) -> list[tuple[str, float]]:
    """(what, pixels) the widget's texts need: its label line, and the text inside its box."""
    kind, wants = widget.type, []
    if kind in ("button", "download_button"):
        icon = CHROME_REM["button_icon"] * REM if getattr(widget.proto, "icon", "") else 0.0
        wants.append((f"button {widget.label!r}", text_px(widget.label) + icon + CHROME_REM["button"] * REM))
    elif kind == "toggle":
        help_px = CHROME_REM["help"] * REM if widget.help else 0.0
        wants.append((f"toggle {widget.label!r}", text_px(widget.label) + CHROME_REM["toggle"] * REM + help_px))
    else:
        wants.append((f"{kind} label {widget.label!r}", label_px(widget)))
        if kind == "selectbox":  # the box must hold whichever option is chosen
            longest = max(widget.options, key=len)
            wants.append((f"selectbox {widget.label!r} option {longest!r}",
                          text_px(longest) + CHROME_REM["select_value"] * REM))  # fmt: skip
        if kind == "number_input":
            digits = str(widget.proto.max if widget.proto.has_max else widget.value)
            wants.append((f"number {widget.label!r}", text_px(digits) + CHROME_REM["number_value"] * REM))
        if kind == "radio" and widget.proto.horizontal:
            options = sum(text_px(o) + CHROME_REM["radio_option"] * REM for o in widget.options)
            wants.append((f"radio {widget.label!r} options", options))
    return wants


def cut_labels(at: AppTest, width: float = VIEWPORT_PX) -> list[str]:
    """Every control whose text needs more than the width its column gets at a `width`-px page."""
    page = width - 2 * presenter.PADDING_REM * REM
    problems: list[str] = []

    def visit(node, available: float) -> None:
        kind = getattr(node, "type", "")
        if kind == "expander":
            needed = text_px(node.label) + CHROME_REM["expander"] * REM
            if needed > available:
                problems.append(f"expander {node.label!r}: needs {needed:.0f} px, has {available:.0f} px")
            available -= 2 * EXPANDER_PAD_REM * REM
        children = list(getattr(node, "children", {}).values())
        columns = [c for c in children if getattr(c, "type", "") == "column"]
        if columns:  # st.columns: the row's width, less the gaps, shared by weight
            share = (available - GAP_REM * REM * (len(columns) - 1)) / sum(c.weight for c in columns)
            for column in columns:
                visit(column, share * column.weight)
            return
        for child in children:
            if isinstance(child, Widget):
                for what, needed in needs(child):
                    if needed > available:
                        problems.append(f"{what}: needs {needed:.0f} px, has {available:.0f} px")
            visit(child, available)

    visit(at.main, page)
    return problems


@pytest.fixture(scope="module", autouse=True)
def keep_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def presenter_app(view: str | None = None, **state) -> AppTest:
    at = AppTest.from_file("../app.py", default_timeout=120)
    at.query_params["present"] = "1"
    if view:
        at.query_params["view"] = view
    for key, value in state.items():
        at.session_state[key] = value
    return at.run()


@pytest.mark.parametrize(
    "view, state",
    [
        (None, {}),  # the step player on the seed story, its settings open or not (an expander is drawn either way)
        (None, {"workload": "chat", "requests": 6, "mean_reply": 10}),  # a crowd's knobs
        ("what-if", {"wi_requests": 12}),
        ("what-if", {"wi_model": "llama-3.1-70b", "wi_requests": 12}),  # not one user fits
        ("live", {}),
    ],
)
def test_no_control_label_is_cut_at_1280_px(view, state):
    at = presenter_app(view, **state)
    assert not at.exception
    assert at.toggle(key="present").value  # ?present=1 turned the presenter view on
    assert not cut_labels(at), "cut at 1280 px:\n" + "\n".join(cut_labels(at))


def test_the_check_catches_a_cut_label(monkeypatch):
    """The transport row as it was before the presenter view: its speed box could not hold "100 steps/s"."""
    monkeypatch.setattr(presenter, "on", lambda: False)  # the old widths, at the presenter view's type size
    at = presenter_app()
    problems = cut_labels(at)
    assert any("'speed' option '100 steps/s'" in p for p in problems), problems


def test_presenter_view_has_no_sidebar_and_one_headline():
    at = presenter_app()
    assert not at.sidebar.children  # its settings are in an expander above the view
    assert any(e.label.startswith("settings") for e in at.expander)
    headlines = [m.value for m in at.markdown if "data-headline=" in m.value]
    assert len(headlines) == 1 and headlines[0].count("data-headline=") == 2  # one headline: static, continuous
    assert any(presenter.CSS in m.value for m in at.markdown)
    at.toggle(key="present").set_value(False).run()
    assert at.sidebar.children and "present" not in at.query_params  # the toggle turns it off, and the URL too


# --- the same, asked of a real browser ------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def app_server():
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true", "--server.address",
         "localhost", "--server.port", str(port), "--browser.gatherUsageStats", "false"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("localhost", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.3)
        yield f"http://localhost:{port}/"
    finally:
        server.terminate()
        server.wait(10)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="no chromium installed (apt-get install -y chromium)")
@pytest.mark.parametrize("view, present", [("step-player", True), ("what-if", True), ("step-player", False)])
def test_the_browser_cuts_no_label_at_1280x720(app_server, view, present):
    url = app_server + ("?step=300" if view == "step-player" else "?view=what-if")
    flags = ["--size", "1280,720", "--check-labels", "--port", str(free_port())] + (["--present"] if present else [])
    run = subprocess.run([sys.executable, "docs/screenshot.py", url, *flags], cwd=ROOT, capture_output=True, text=True,
                         timeout=240, env=os.environ | {"PYTHONPATH": str(ROOT)})  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 cut label(s)" in run.stdout
