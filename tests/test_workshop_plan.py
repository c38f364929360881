"""The workshop's two session plans (docs/workshop.md) add up: start times follow from the minutes, each session fits
two hours, at most 100 minutes of content (as its heading says) with a break and ten minutes for questions."""

import re
from pathlib import Path

PLANS = (Path(__file__).resolve().parents[1] / "docs" / "workshop.md").read_text()


def sessions() -> dict[str, tuple[int, list[tuple[int, str, int]]]]:
    """{"Session 1": (content minutes in the heading, [(start minute, what, minutes), ...]), ...}"""
    found = {}
    for match in re.finditer(r"^(Session \d), .*\(content: (\d+) minutes.*\n\n((?:\|.*\n)+)", PLANS, re.M):
        rows = []
        for line in match.group(3).splitlines()[2:]:  # past the header and the |---| line
            at, what, minutes = (cell.strip() for cell in line.strip("|").split("|"))
            hours, mins = at.split(":")
            rows.append((60 * int(hours) + int(mins), what, sum(int(m) for m in minutes.split("+"))))
        found[match.group(1)] = (int(match.group(2)), rows)
    return found


def test_both_sessions_are_planned():
    assert set(sessions()) == {"Session 1", "Session 2"}


def test_start_times_follow_from_the_minutes():
    for name, (_, rows) in sessions().items():
        starts = [at for at, _, _ in rows]
        ends = [at + minutes for at, _, minutes in rows]
        assert starts[0] == 0 and starts[1:] == ends[:-1], f"{name}: a start time does not follow the row above"


def test_each_session_fits_two_hours_with_a_break_and_questions():
    for name, (content, rows) in sessions().items():
        minutes = {what: m for _, what, m in rows}
        assert minutes.get("break", 0) >= 10 and minutes.get("questions", 0) >= 10, name
        taught = sum(m for _, what, m in rows if what not in ("break", "questions"))
        assert taught == content <= 100, f"{name}: {taught} minutes of content, the heading says {content}"
        assert sum(minutes.values()) <= 120, name
