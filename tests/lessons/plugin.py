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

A failing check, under `-m lessonNN`, says what is wrong first: its diagnosis, then one line of context (the test,
the line of your code that raised, how to see the whole traceback), with no progress dots, header or traceback
before it; a second failing check gets one line. The whole output of a failing check stays within 15 lines.
`--tb=long` (or any --tb) gives pytest's usual report, and a run that is not `-m lessonNN` (the full suite)
keeps it too: its failures are for whoever develops the checks.
"""

from __future__ import annotations

import functools
import re
import sys
from pathlib import Path

import pytest

BRIEF_LINES = 10  # the most lines of a failing check's diagnosis shown (the rest: --tb=long)

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


WORKERS = 2  # the whole suite runs on this many processes (pytest-xdist), at most one per core


@pytest.hookimpl(tryfirst=True)  # before xdist's own (one per core)
def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto` (pyproject.toml): the whole suite (`python -m pytest`, no paths given) runs on two processes, which
    halves its time on an idle 2-core machine; anything narrower (a file, a test, `-m lessonNN`) runs in this process,
    without the workers' start-up (a few seconds) that would dwarf a lesson's checks."""
    import os

    whole_suite = config.args_source == pytest.Config.ArgsSource.TESTPATHS and lessons_selected(config) is None
    return min(WORKERS, os.cpu_count() or 1) if whole_suite else 0


BRIEF = pytest.StashKey[bool]()


def brief(config) -> bool:
    """Failures told briefly: a run of lesson checks only (`-m lessonNN`) with pytest's default --tb (decided once,
    when pytest starts: pytest_configure then switches pytest's own failure report off)."""
    if BRIEF not in config.stash:
        config.stash[BRIEF] = lessons_selected(config) is not None and config.option.tbstyle == "auto"
    return config.stash[BRIEF]


NOT_REWRITTEN = ("hypothesis",)  # pytest plugins' own packages whose asserts pytest need not rewrite


def keep_hypothesis_as_it_is(config) -> None:
    """pytest rewrites the asserts of every module of a package that ships a pytest plugin, hypothesis's 100-odd
    included, when it is imported; where bytecode is not written (PYTHONDONTWRITEBYTECODE, a read-only venv) it does
    so on every run: 1.2 s of a lesson's differential checks (tests/lessons/differential.py) on 2 cores, for asserts
    inside hypothesis that no check reads. Its modules load as they are."""
    hook = getattr(config.pluginmanager, "rewrite_hook", None)
    marked = getattr(hook, "_must_rewrite", None)
    if isinstance(marked, set):
        marked.difference_update(NOT_REWRITTEN)
        getattr(hook, "_marked_for_rewrite_cache", {}).clear()


@pytest.hookimpl(trylast=True)  # after the terminal reporter exists
def pytest_configure(config):
    keep_hypothesis_as_it_is(config)
    config.option.overwrite = False  # nbmake can write outputs back into the notebooks: never here
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if not brief(config) or reporter is None:
        return
    if config.option.verbose == 0:  # no header (a -v still lists every test)
        config.option.verbose = -1
    config.option.tbstyle = "no"  # pytest's own failure section: the diagnosis is printed below instead
    reporter.reportchars = ""  # no short summary or warnings: the lesson summary says where each lesson stands
    reporter._show_progress_info = False  # no "[100%]"
    reporter._tw.line = without_first_blank(reporter._tw.line)  # the diagnosis on the very first line


def without_first_blank(line):
    """The terminal writer's line(), less the empty line pytest writes to end a row of progress dots (a brief run
    has none, so it would be the output's first line)."""
    state = {"first": True}

    def write(text: str = "", **markup):
        first, state["first"] = state["first"], False
        if not (first and text == ""):
            line(text, **markup)

    return write


@pytest.hookimpl(wrapper=True)
def pytest_report_teststatus(report, config):
    """No progress dots in a brief run: the output starts with what is wrong."""
    result = yield
    if brief(config) and config.option.verbose < 0 and result:
        category, _, word = result
        return category, "", word
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed and call.excinfo is not None and brief(item.config):
        report.longrepr = brief_failure(item, call.excinfo)
    return report


def brief_failure(item, excinfo) -> str:
    """A failing check in a few lines: its diagnosis first, then where (your code's line if it raised there)."""
    error = excinfo.value
    if isinstance(error, pytest.fail.Exception):
        message = error.msg
    elif isinstance(error, AssertionError):
        message = str(error).split("\nassert ")[0]  # the check's own words, not pytest's rewritten expression
    else:
        message = f"your code raised {type(error).__name__}: {error}"
    lines = message.strip().splitlines() or [type(error).__name__]
    if len(lines) > BRIEF_LINES:
        lines = lines[: BRIEF_LINES - 1] + [f"  ... ({len(lines) - BRIEF_LINES + 1} more lines: --tb=long)"]
    return "\n".join(lines + [f"  ({context(item, excinfo)})"])


def context(item, excinfo) -> str:
    """The test, the line that raised (in your exercise file when it did) and how to see everything."""
    from tests.lessons.harness import exercises_dir

    yours, root = exercises_dir(), Path(str(item.config.rootpath))
    where = ""
    for entry in excinfo.traceback:
        path = Path(str(entry.path))
        if yours is not None and path.parent == yours:
            statement = str(entry.statement).strip().splitlines()[0] if entry.statement else ""
            where = f"your {path.name}, line {entry.lineno + 1}: {statement}"
    ours = [entry for entry in excinfo.traceback if "_pytest" not in Path(str(entry.path)).parts]  # not pytest.fail
    checks = [entry for entry in ours if Path(str(entry.path)).name.startswith("test_")]  # the check, not the harness
    ours = checks or ours
    if not where and ours:
        last = ours[-1]
        try:
            shown = Path(str(last.path)).relative_to(root)
        except ValueError:
            shown = Path(str(last.path)).name
        where = f"{shown}, line {last.lineno + 1}"
    expr = item.config.getoption("markexpr")
    return f"{item.name} · {where} · everything: pytest -m {expr} --tb=long"


@pytest.hookimpl(tryfirst=True)  # before the lesson summary (tests/conftest.py)
def pytest_terminal_summary(terminalreporter, config):
    """A brief run's failures: the first one whole, each other in one line."""
    if not brief(config):
        return
    failures = [r for kind in ("error", "failed") for r in terminalreporter.stats.get(kind, []) if r.longrepr]
    for n, report in enumerate(failures):
        # ours (a string) from pytest_runtest_makereport; any other (a collection error): its last lines
        lines = str(report.longrepr).splitlines()[-BRIEF_LINES - 1 :]
        if n == 0:
            for line in lines:
                terminalreporter.write_line(line)
        elif n < 3:
            name = report.nodeid.split("::")[-1]
            terminalreporter.write_line(f"also failing, {name}: {lines[0][:160]}")
        else:
            terminalreporter.write_line(f"and {len(failures) - 3} more failing")
            break


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


KERNEL_START_S = 120  # how long a notebook kernel may take to start (nbclient: 60 s, which ran out under load); twice
# fits in the per-test time limit (pyproject.toml)


def pytest_collect_file(file_path: Path, parent):
    if file_path.suffix == ".ipynb" and ".ipynb_checkpoints" not in file_path.parts:
        return notebook_file(file_path, parent)
    return None


def notebook_file(file_path: Path, parent):
    return notebook_classes().from_parent(parent, path=file_path)


@functools.cache
def notebook_classes():
    """nbmake's notebook test, with a longer kernel start-up and one retry when the kernel fails to start (on a busy
    machine a kernel sometimes misses its start-up deadline, and nbmake reports an "internal error"). A failing cell
    is never retried: that is the notebook's own failure."""
    import nbclient  # only now: the imports are slow
    import traitlets
    from nbmake import nb_run
    from nbmake.pytest_items import NotebookFailedException, NotebookFile, NotebookItem

    class PatientClient(nbclient.NotebookClient):
        startup_timeout = traitlets.Integer(KERNEL_START_S).tag(config=True)

    nb_run.NotebookClient = PatientClient  # (nbmake builds its client by this name)

    class Notebook(NotebookItem):
        def runtest(self):
            try:
                return super().runtest()
            except NotebookFailedException:
                raise
            except Exception as first:  # the kernel did not start or answer: once more, then say both
                try:
                    return super().runtest()
                except NotebookFailedException:
                    raise
                except Exception as second:
                    raise RuntimeError(
                        f"the notebook's kernel failed to start twice (start-up timeout {KERNEL_START_S} s each; "
                        f"first: {type(first).__name__}: {first}; then: {type(second).__name__}: {second})"
                    ) from second

    class Notebooks(NotebookFile):
        item_class = Notebook

        def collect(self):
            yield Notebook.from_parent(self, filename=str(Path(self.fspath)))

    return Notebooks
