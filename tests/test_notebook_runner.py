"""The notebooks' test runner (tests/lessons/plugin.py over nbmake): a kernel that fails to start gets one more try
and a failure that says so; a failing cell is the notebook's own failure and is not tried again."""

from __future__ import annotations

import pytest
from nbmake.pytest_items import NotebookFailedException, NotebookItem

from tests.lessons.plugin import KERNEL_START_S, notebook_classes


def notebook_item():
    """A notebook test without a pytest session (its runtest is all that is exercised here)."""
    return object.__new__(notebook_classes().item_class)


def runs(monkeypatch, outcomes: list) -> list:
    """Each call of nbmake's own runtest takes the next outcome: None (passes) or an exception to raise."""
    calls = []

    def runtest(self):
        calls.append(outcomes[len(calls)])
        if calls[-1] is not None:
            raise calls[-1]

    monkeypatch.setattr(NotebookItem, "runtest", runtest)
    return calls


def test_a_kernel_that_misses_its_start_gets_one_more_try(monkeypatch):
    calls = runs(monkeypatch, [RuntimeError("Kernel didn't respond in 120 seconds"), None])
    notebook_item().runtest()
    assert len(calls) == 2


def test_a_kernel_that_fails_twice_says_so(monkeypatch):
    runs(monkeypatch, [TimeoutError("first"), RuntimeError("second")])
    with pytest.raises(RuntimeError, match=f"failed to start twice \\(start-up timeout {KERNEL_START_S} s"):
        notebook_item().runtest()


def test_a_failing_cell_is_not_tried_again(monkeypatch):
    calls = runs(monkeypatch, [NotebookFailedException("cell 3 raised"), None])
    with pytest.raises(NotebookFailedException):
        notebook_item().runtest()
    assert len(calls) == 1


def test_kernels_get_longer_to_start_than_nbclients_default():
    import nbformat
    from nbmake import nb_run

    notebook_classes()
    assert nb_run.NotebookClient(nbformat.v4.new_notebook()).startup_timeout == KERNEL_START_S > 60
