"""A pytest plugin (loaded by `-p tests.lessons.plugin` in pyproject.toml): the notebooks run as tests,
and `pytest -m lessonNN` stays fast.

Notebooks: every `.ipynb` file pytest meets runs headless through nbmake, a failing cell failing the test.
nbmake's own plugin is switched off (`-p no:nbmake`) because importing it costs more than a second
(nbformat -> jsonschema -> an IRI grammar it compiles at import), on every run; this plugin imports
nbmake only when a notebook is actually collected, and accepts nbmake's options (`--nbmake` included,
a no-op: notebooks are always collected).

`pytest -m lesson03` (or `-m "lesson03 or lesson04"`): only those lessons' check files are collected.
Importing every other test module (streamlit, hypothesis, the app) and reading the notebooks is what made
one lesson's checks take 8 s on 2 cores; a student runs them many times. For the same reason hypothesis's
pytest plugin is dropped from a run whose tests never imported hypothesis (see pytest_collection_finish).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

LESSON_EXPR = re.compile(r"\s*\(?\s*lesson(\d\d)(\s+or\s+lesson(\d\d))*\s*\)?\s*")


def lessons_selected(config) -> set[str] | None:
    """The lessons a `-m` expression selects when it names lessons only ("lesson03 or lesson04"), else None."""
    expr = config.getoption("markexpr", "") or ""
    if not LESSON_EXPR.fullmatch(expr):
        return None
    return set(re.findall(r"lesson(\d\d)", expr))


def pytest_addoption(parser):
    group = parser.getgroup("nbmake", "lesson notebooks (run through nbmake)")
    group.addoption("--nbmake", action="store_true", default=True, help="kept for habit: notebooks always run")
    group.addoption("--nbmake-timeout", type=int, default=300, help="seconds one cell may take (default 300)")
    group.addoption("--nbmake-kernel", default=None, help="the Jupyter kernel to run notebooks in")
    group.addoption("--nbmake-find-import-errors", action="store_true", default=False, help="report import errors only")


def pytest_configure(config):
    config.option.overwrite = False  # nbmake can write outputs back into the notebooks: never here


def pytest_collection_finish(session):
    """Hypothesis's pytest plugin imports all of hypothesis in its end-of-run summary (about 1 s on 2 cores),
    even when no test uses it. When no collected module imported hypothesis, it has nothing to report."""
    if "hypothesis" not in sys.modules:
        plugin = session.config.pluginmanager.get_plugin("hypothesispytest")
        if plugin is not None:
            session.config.pluginmanager.unregister(plugin)


def pytest_ignore_collect(collection_path: Path, config):
    lessons = lessons_selected(config)
    if lessons is None or collection_path.is_dir():
        return None
    wanted = {f"test_lesson{n}.py" for n in lessons}
    return None if collection_path.name in wanted else True


def pytest_collect_file(file_path: Path, parent):
    if file_path.suffix == ".ipynb" and ".ipynb_checkpoints" not in file_path.parts:
        from nbmake.pytest_items import NotebookFile  # only now: the import is slow

        return NotebookFile.from_parent(parent, path=file_path)
    return None
