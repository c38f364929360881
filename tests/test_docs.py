"""The front page and the docs pages keep their promises: every link resolves (files, and headings within a page),
every picture exists, README stays a five-minute read, and every `python -m minillm ...` command they show is one the
CLI accepts (flags and choices as they are today)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from minillm.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 250
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces to hyphens."""
    found = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", title)))
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_and_picture_resolves(page):
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+://", target) or target.startswith("mailto:"):
            continue  # (the web is not reachable from here: outside links are not checked)
        path, _, anchor = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        if not where.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and where.suffix == ".md" and anchor not in anchors(where):
            broken.append(f"{target} (no heading #{anchor} in {where.name})")
    assert not broken, f"{page.name}: broken links: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_page_is_left_with_a_placeholder(page):
    """A draft marks text still to write (figures from a bench run) as NAME_TEXT on a line of its own."""
    left = re.findall(r"^[A-Z][A-Z_]*_TEXT$", page.read_text(), re.MULTILINE)
    assert not left, f"{page.name}: placeholders never filled in: {left}"


def test_the_readme_is_a_five_minute_read():
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES}: move detail to docs/)"


def commands() -> list[tuple[str, str]]:
    """(page, command) for every `python -m minillm ...` line in a code block of the pages."""
    found = []
    for page in PAGES:
        inside = False
        for line in page.read_text().splitlines():
            if line.startswith("```"):
                inside = not inside
            elif inside and "python -m minillm " in line:
                command = line[line.index("python -m minillm ") :]
                found.append((page.name, command.split(" #")[0].split(" &&")[0].strip().rstrip("&").strip()))
    return found


@pytest.mark.parametrize("page, command", commands(), ids=[f"{p}: {c[18:60]}" for p, c in commands()])
def test_every_command_shown_is_one_the_cli_accepts(page, command, capsys):
    argv = shlex.split(command)[3:]  # after "python -m minillm"
    try:
        build_parser().parse_args(argv)
    except SystemExit:
        raise AssertionError(f"{page}: `{command}` is refused: {capsys.readouterr().err.strip()}") from None
