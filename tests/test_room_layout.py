"""The room, third pass: what a 1280x720 projector showed wrong, pinned down.

A frame of the step player is one block of HTML (the caption, the legend and every panel), so the panels and the
caption cannot show different steps while playing; the caption is one line without a developer's timing, the same
shape playing or paused; a clicker's PageUp and PageDown step like ← and →; the step counts are counts, as the lessons
say them; and every doc page or README section the app points to exists. (docs/screenshot.py --measure asks a real
browser for the same things: the charts' share of the first screen, their tops while playing, the steps shown.)
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest
from streamlit.testing.v1.element_tree import Widget

from tests import test_presenter
from viz.app import presenter
from viz.app.playback import CLICKER_KEYS

ROOT = Path(__file__).parent.parent
APP_FILES = sorted([ROOT / "app.py", *(ROOT / "viz").rglob("*.py")])
# A reference: README (or README.md), docs/NAME.md or lessons/NAME.ipynb, then perhaps ", Section name" (up to a
# colon, a closing bracket, a semicolon, a full stop or a quote).
REFERENCE = re.compile(r"\b(README(?:\.md)?|docs/[\w./-]+\.md|lessons/[\w./-]+\.ipynb)(?:, ([A-Z][^:;)\"'.\n]*))?")


def headings(path: Path) -> set[str]:
    return {line.lstrip("#").strip().lower() for line in path.read_text().splitlines() if line.startswith("#")}


def broken_references(text: str) -> list[str]:
    """Every reference in `text` to a file that does not exist, or to a section its file has no heading for."""
    problems = []
    for name, section in REFERENCE.findall(text):
        path = ROOT / ("README.md" if name.startswith("README") else name)
        if not path.is_file():
            problems.append(f"{name}: no such file")
        elif section and path.suffix == ".md" and section.strip().lower() not in headings(path):
            problems.append(f"{name}, {section.strip()}: no such heading")
    return problems


@pytest.mark.parametrize("path", APP_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_doc_page_the_app_points_to_exists(path):
    assert not broken_references(path.read_text()), broken_references(path.read_text())


def test_the_reference_check_catches_the_old_wrong_reference():
    """The live tab said "see README, Run a workshop": the README has no such section (docs/workshop.md does the job,
    under "The room as the crowd")."""
    assert broken_references("The instructor (the room's network: see README, Run a workshop):")
    assert broken_references("see docs/no-such-page.md")
    assert not broken_references("see docs/workshop.md, The room as the crowd): and README, Quick start.")
    assert "docs/workshop.md, The room as the crowd" in (ROOT / "viz/app/live.py").read_text()


# --- the step player, headless ---------------------------------------------------------------------------------------
pytestmark = pytest.mark.usefixtures("app_in_process")  # (conftest.py: replies in memory, threads given back)


def open_app(present: bool = False, **state) -> AppTest:
    at = AppTest.from_file("../app.py", default_timeout=120)
    if present:
        at.query_params["present"] = "1"
    for key, value in state.items():
        at.session_state[key] = value
    return at.run()


def frames(at: AppTest) -> list[str]:
    return [m.value for m in at.markdown if "data-frame" in m.value]


def caption(frame: str) -> str:
    return re.search(r"<div data-caption[^>]*>[^<]*</div>", frame).group(0)


def panel_steps(frame: str) -> list[tuple[str, int, int]]:
    """(title, step drawn, position) of each panel in the frame."""
    found = re.findall(r'data-panel="([^"]*)" data-step="(\d+)" data-position="(\d+)"', frame)
    return [(title, int(step), int(position)) for title, step, position in found]


@pytest.mark.parametrize("present", [False, True], ids=["normal", "presenter"])
def test_a_frame_is_one_block_with_every_panel_at_the_same_step(present):
    at = open_app(present, step=12)
    assert not at.exception
    [frame] = frames(at)  # one element: the caption, the legend and both panels arrive together
    assert panel_steps(frame) == [("static batching", 12, 12), ("continuous batching", 12, 12)]
    assert re.search(r'data-caption data-step="12"', frame)
    assert re.findall(r"data-event><b>Step (\d+):</b>", frame) == ["12", "12"]
    assert frame.count("data-chart") == 2 and frame.count("KV blocks at step 12") == 2  # seats and KV, each side
    assert not [m.value for m in at.markdown if "<img" in m.value and "data-frame" not in m.value]
    assert not at.subheader  # the panels' titles are in the block too
    for _ in range(3):  # playing: each frame, every panel at the caption's step
        at.button(key="play").click().run() if not at.session_state.playing else at.run()
        [frame] = frames(at)
        position = int(re.search(r'data-caption data-step="(\d+)"', frame).group(1))
        assert position > 12 and all(s == p == position for _, s, p in panel_steps(frame))


def test_the_caption_is_one_line_with_no_timing_the_same_playing_or_paused():
    at = open_app(step=40)
    paused = caption(frames(at)[0])
    assert not re.search(r"\d\s*ms\b", paused) and "drawn" not in paused
    assert "white-space:nowrap" in paused and "height:1.4em" in paused and "font-size:1rem" in paused
    assert not [c.value for c in at.caption if c.value.startswith("step ")]  # not a small grey st.caption
    at.button(key="play").click().run()
    at.run()
    playing = caption(frames(at)[0])
    assert "· playing" in playing and "· paused" in paused and not re.search(r"\d\s*ms\b", playing)
    shape = lambda html: re.sub(r'data-step="\d+"', "", re.sub(r">[^<]*<", "><", html))
    assert shape(playing) == shape(paused)  # only the words differ, not the box
    assert "frame_ms" not in at.session_state


def test_page_up_and_page_down_step_like_the_arrows():
    """A clicker sends PageUp and PageDown: hidden buttons with those shortcuts, out of the layout (presenter.py)."""
    at = open_app(step=20)
    shortcuts = {key: at.button(key=key).proto.shortcut for key in ("back", "forward", "pageup", "pagedown")}
    assert shortcuts == {"back": "left", "forward": "right", "pageup": "pageup", "pagedown": "pagedown"}
    assert CLICKER_KEYS == {"PageUp": -1, "PageDown": 1}
    assert "PageUp" in at.button(key="back").help and "PageDown" in at.button(key="forward").help
    at.button(key="pagedown").click().run()
    assert panel_steps(frames(at)[0])[0][1] == 21
    at.button(key="pageup").click().run()
    at.button(key="pageup").click().run()
    assert panel_steps(frames(at)[0])[0][1] == 19
    hidden = re.search(r'\[class\*="st-key-"\]\[class\*="([^"]+)"\] \{([^}]*)\}', presenter.ALWAYS)
    assert hidden.group(1) == presenter.HIDDEN_KEYS and "position: absolute" in hidden.group(2)
    assert "opacity: 0" in hidden.group(2)


def test_step_counts_are_counts_as_in_the_lessons():
    """Lesson 04's continuous run of the seed story takes 519 steps: steps 0 to 518. The headline and the panels' titles
    say the count, never the last step's index."""
    at = open_app(step=995)
    why = next(m.value for m in at.markdown if "All requests done in:" in m.value)
    counts = dict(re.findall(r"(static|continuous) ([\d,]+) steps", why))
    assert counts and "step 5" not in why and "Last request done" not in why
    [frame] = frames(at)
    titles = dict(re.findall(r'data-title="(\w+) batching"[^>]*>\w+ batching \(done in ([\d,]+) steps\)<', frame))
    assert titles == counts  # the run that ends last: its title at the last position; the other long before
    assert int(counts["continuous"]) < int(counts["static"])


@pytest.mark.parametrize("present", [False, True], ids=["normal", "presenter"])
def test_the_headline_is_one_line_its_note_one_click_away(present):
    at = open_app(present)
    headline = next(m.value for m in at.markdown if "data-headline=" in m.value)
    assert "Seats busy, whole run:" in headline and "articles" not in headline and "<br" not in headline
    assert any(p.proto.popover.label == "why?" for p in at.main.get("popover"))
    assert any("~9% vs ~93%" in m.value for m in at.markdown)  # in the popover


# --- the same, in a real browser (docs/screenshot.py --measure; skipped without chromium) ----------------------------
app_server = test_presenter.app_server  # (the browser tests' server, shared)


@pytest.mark.slow
@test_presenter.no_chromium
@pytest.mark.parametrize("present, share", [(False, 0.40), (True, 0.45)], ids=["normal", "presenter"])
def test_playing_moves_nothing_and_every_frame_agrees_in_the_browser(app_server, present, share):
    """At 1280x720: the seat charts cover at least 40% of the first screen (45% on a projector); while playing
    they stay where they were, the caption keeps one height, and in each of 20 frames every panel shows the
    caption's step."""

    run = test_presenter.screenshot(app_server, "--size", "1280,720", "--measure", *(["--present"] if present else []))
    assert run.returncode == 0, run.stdout + run.stderr
    found = json.loads(re.search(r"^measure: (.*)$", run.stdout, re.M).group(1))
    assert found["charts_share_of_first_screen"] >= share, found
    tops = found["chart_tops_before_play"]
    assert len(tops) == 2 and all(t == tops for t in found["chart_tops_while_playing"]), found
    assert len(found["caption_height_px"]) == 1 and "ms" not in found["caption_while_playing"]
    assert len(found["frames"]) == 20
    assert all(f["panels"] == [f["caption"]] * 2 for f in found["frames"]), found["frames"]


# --- the what-if view: the crowd's seat charts on its first screen ------------------------------------------------
def page_order(node, popover: str | None = None):
    """(what, popover it sits in) for each widget (its key), popover (its label) and marked block, in page order."""
    kind = getattr(node, "type", "")
    if kind == "popover":
        popover = node.proto.popover.label
        yield f"popover {popover}", None
    elif isinstance(node, Widget):
        yield node.key, popover
    elif kind == "markdown":
        marks = {"data-frame": "frame", "data-headline": "headline", "where the card's memory goes": "memory",
                 'data-figure="tokens/s, all decoding"': "figures", "| **static batching** |": "table"}  # fmt: skip
        yield from ((name, popover) for mark, name in marks.items() if mark in node.value)
    for child in getattr(node, "children", {}).values():
        yield from page_order(child, popover)


@pytest.mark.parametrize("present", [False, True], ids=["normal", "presenter"])
def test_the_what_if_view_leads_with_the_crowds_seat_charts(present):
    """Above the crowd's player only one row of controls (card, model, context; the rest of the card and the crowd's
    settings in popovers, under the keys links and tests set) and one line of big numbers, each with its why?; the
    figures, the card's pictures and the crowd's table come after the charts."""
    at = open_app(present, view="what-if", wi_requests=12)
    assert not at.exception and not at.error
    order = list(page_order(at.main))
    names = [name for name, _ in order]
    first = names[names.index("wi_card") : names.index("frame")]  # (after the app's title, toggle and tabs)
    assert first[:3] == ["wi_card", "wi_model", "wi_context"]
    assert [n for n in first if n.startswith("popover")] == [
        "popover weights, KV, cards", "popover crowd", "popover why?", "popover why?"]  # fmt: skip
    inside = dict(order)
    assert {k: inside[k] for k in ("wi_dtype", "wi_kv_dtype", "wi_tp", "wi_link")} == dict.fromkeys(
        ("wi_dtype", "wi_kv_dtype", "wi_tp", "wi_link"), "weights, KV, cards")  # fmt: skip
    crowd = ("wi_workload", "wi_requests", "wi_rate", "wi_budget", "wi_slots", "wi_prefix")
    assert {k: inside[k] for k in crowd} == dict.fromkeys(crowd, "crowd")
    assert first.count("headline") == 2  # the card's (users that fit, tokens/s each) and the crowd's (seats busy)
    headline = next(m.value for m in at.markdown if 'data-headline="users that fit"' in m.value)
    assert 'data-headline="tokens/s each"' in headline and "<br" not in headline and "decoding together" not in headline
    assert any("decoding together make" in m.value for m in at.markdown)  # the note: in its why? popover
    after = names[names.index("frame") :]
    assert all(name in after for name in ("figures", "memory", "table"))
    assert {"sim_play", "sim_seconds"} <= set(first)  # the transport, right above its charts


@pytest.mark.slow
@test_presenter.no_chromium
@pytest.mark.parametrize("present, share", [(False, 0.40), (True, 0.42)], ids=["normal", "presenter"])
def test_the_what_if_seat_charts_cover_its_first_screen_in_the_browser(app_server, present, share):
    """At 1280x720 the crowd's two seat charts start on the first screen and cover at least 40% of it (measured 42.8%;
    42% on a projector, measured 44.7%); while playing they stay put, and in each of 20 frames every panel is at the
    caption's position (the slider, in simulated seconds, with it in most)."""
    flags = ["--view", "what-if", "--size", "1280,720", "--measure", *(["--present"] if present else [])]
    run = test_presenter.screenshot(app_server, *flags)
    assert run.returncode == 0, run.stdout + run.stderr
    found = json.loads(re.search(r"^measure: (.*)$", run.stdout, re.M).group(1))
    assert found["charts_share_of_first_screen"] >= share, found
    tops = found["chart_tops_before_play"]
    assert len(tops) == 2 and all(0 <= t < 0.6 * 720 for t in tops), found  # (measured 382-395 px down)
    assert all(t == tops for t in found["chart_tops_while_playing"]), found
    assert len(found["frames"]) == 20 and " s of " in found["caption_while_playing"], found
    assert all(f["positions"] == [f["caption"]] * 2 for f in found["frames"]), found["frames"]  # (one block)
    # the slider, a widget of its own, follows within a moment (at worst a frame late under load: its number hidden)
    assert sum(f["slider_agrees_after_ms"] is not None for f in found["frames"]) >= 15, found["frames"]
