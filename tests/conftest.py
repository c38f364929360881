"""Shared fixtures: small random models for exactness tests, the shipped model, device selection."""

from __future__ import annotations

import atexit
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from minillm.config import ModelConfig
from minillm.model.transformer import Transformer

# Small shapes that still exercise every path: multi-head, grouped-query (2 and 4 query heads
# per kv head) and multi-query attention.
SMALL_CONFIGS = {
    "mha": ModelConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=4, ffn_dim=128, max_seq_len=256),
    "gqa": ModelConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=256),
    "mqa": ModelConfig(dim=96, n_layers=3, n_heads=8, n_kv_heads=1, ffn_dim=160, max_seq_len=256),
}

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]

# The tests (and the notebooks' kernels, which inherit the environment) never read or write the user's cache
# directory, and never calibrate this machine in full: its calibration takes 20-40 s on a quiet 2-core machine and
# took 24 minutes once under contention. They read a fixed calibration recorded on this project's machine
# (tests/data/calibration-cpu.json); the calibration's own tests measure tiny sizes in a directory of their own.
TEST_CACHE = Path(tempfile.mkdtemp(prefix="minillm-test-cache-"))
os.environ["XDG_CACHE_HOME"] = str(TEST_CACHE)
(TEST_CACHE / "minillm").mkdir()
shutil.copy(Path(__file__).parent / "data" / "calibration-cpu.json", TEST_CACHE / "minillm" / "calibration-cpu.json")
atexit.register(shutil.rmtree, TEST_CACHE, ignore_errors=True)

# The test models are tiny: their ops are too small to split between threads, and on a busy 2-core
# machine two torch threads wait on each other (a test took 36 s on two threads, 0.8 s on one).
torch.set_num_threads(1)


@contextmanager
def one_torch_thread():
    """Torch on one thread inside, the caller's count restored after (a test that runs the CLI or the app may have
    changed it: `--threads`, the app's own setting)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU here (torch.cuda.is_available() is False)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def random_model(name: str, device: str = "cpu", seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(SMALL_CONFIGS[name]).to(device).eval()


@pytest.fixture(scope="module")
def server(shipped_model):
    """The shipped model behind HTTP (the engine in its own process, 4 seats), for one test module; its forward is
    `serve`'s on a CPU (linears prepacked: layers/prepack.py), which the engine process builds again from the
    weights."""
    from minillm.bench.peer import forward_of
    from minillm.serving.server import ServerThread, build_loop

    served = forward_of(shipped_model, "prepacked")
    with ServerThread(build_loop(served, slots=4, process=True)) as running:
        yield running


@pytest.fixture
def client():
    import httpx

    with httpx.Client(timeout=60) as c:
        yield c


@pytest.fixture(scope="session")
def shipped_model() -> Transformer:
    from minillm.model.checkpoint import load_model

    return load_model(device="cpu")


# --- lesson exercises (tests/lessons): student mode and a per-lesson summary ----------------------
# Each lesson check runs twice: on the reference (id "reference", marker lesson_checks: the full suite) and on
# your code in lessons/exercises (id "student", marker lessonNN: `pytest -m lessonNN`; see tests/lessons/harness.py
# to point it elsewhere with MINILLM_EXERCISES). tests/lessons/plugin.py keeps `-m lessonNN` fast.
LESSON_NOTEBOOKS = {
    "01": "01_decode_is_a_loop.ipynb",
    "02": "02_kv_cache.ipynb",
    "03": "03_static_batching.ipynb",
    "04": "04_continuous_batching.ipynb",
    "05": "05_paged_kv_cache.ipynb",
    "06": "06_tradeoffs.ipynb",
    "07": "07_roofline.ipynb",
    "08": "08_chunked_prefill.ipynb",
    "09": "09_prefix_caching.ipynb",
    "10": "10_engine_to_server.ipynb",
    "11": "11_speculative_decoding.ipynb",
    "12": "12_tensor_parallel.ipynb",
    "13": "13_fleet.ipynb",
    "14": "14_output_that_obeys.ipynb",
    "15": "15_who_goes_first.ipynb",
}


def lesson_of(keywords) -> str | None:
    """The lesson number of a test marked e.g. lesson01 ("01"), else None."""
    for name in keywords:
        match = re.fullmatch(r"lesson(\d\d)", name)
        if match:
            return match.group(1)
    return None


def _is_student(item) -> bool:
    callspec = getattr(item, "callspec", None)
    return callspec is not None and "student" in callspec.params.values()


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem):
    """Lesson tests run torch on one thread: their models are tiny, and on a busy machine two threads stall each other.

    Your code raising NotImplementedError: if it comes from a stub you have not touched yet, the test is
    skipped ("not attempted yet": a fresh clone is green); if it comes from a function you have started
    (a branch left for later), the test fails as "partly done" and names the function and line.
    """
    lesson = lesson_of(pyfuncitem.keywords)
    if lesson is None and "lesson_checks" not in pyfuncitem.keywords:
        return (yield)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return (yield)
    except NotImplementedError as e:
        if lesson is None or not _is_student(pyfuncitem):
            raise
        from tests.lessons.harness import unwritten_part

        part = unwritten_part(e)
        if part is None:  # not raised by your exercise file: a real error
            raise
        pyfuncitem.user_properties.append(("lesson_part", (part.state, part.name)))
    finally:
        torch.set_num_threads(threads)
    if part.state == "not attempted":
        pytest.skip(f"lesson {lesson}: not attempted yet ({part.name}), open lessons/{LESSON_NOTEBOOKS[lesson]}")
    pytest.fail(f"lesson {lesson}: partly done: {part.describe()}", pytrace=False)


def pytest_terminal_summary(terminalreporter):
    """Per lesson, the state of YOUR implementation (the tests with id 'student'); only when lesson tests ran."""
    tests: dict[str, dict[str, tuple[str, tuple | None]]] = {}  # lesson -> test id -> (outcome, unwritten part)
    rank = {"passed": 0, "skipped": 1, "failed": 2}
    for kind in ("passed", "failed", "error", "skipped"):
        for report in terminalreporter.stats.get(kind, []):
            nodeid = getattr(report, "nodeid", "")
            params = re.search(r"\[(.*)\]$", nodeid)
            lesson = lesson_of(getattr(report, "keywords", {}))
            if lesson is None or not params or "student" not in params.group(1).split("-"):
                continue
            outcome = "failed" if kind == "error" else report.outcome
            part = dict(getattr(report, "user_properties", [])).get("lesson_part")
            broken = re.search(r"your (\S+) does not import", str(getattr(report, "longrepr", "")))
            if outcome == "failed" and broken:
                part = ("does not import", broken.group(1))
            old = tests.setdefault(lesson, {}).get(nodeid, ("passed", None))
            tests[lesson][nodeid] = max(old, (outcome, part), key=lambda pair: rank[pair[0]])
    if not tests:
        return
    terminalreporter.section("lesson exercises: your code")
    for lesson, results in sorted(tests.items()):
        terminalreporter.write_line(f"lesson {lesson}: {lesson_state(lesson, list(results.values()))}")


def lesson_state(lesson: str, results: list[tuple[str, tuple | None]]) -> str:
    """One line: passed, not attempted, partly done (naming what is left), or failing."""
    outcomes = [outcome for outcome, _ in results]
    untouched = sorted({part[1] for _, part in results if part and part[0] == "not attempted"})
    started = sorted({part[1] for outcome, part in results if part and part[0] == "partly done"})
    broken = sorted({part[1] for _, part in results if part and part[0] == "does not import"})
    real_failures = sum(1 for outcome, part in results if outcome == "failed" and not part)
    if broken:
        return f"failing: {', '.join(broken)} does not import (the error above says where)"
    if real_failures:
        return f"failing ({real_failures} test{'s' * (real_failures > 1)})"
    if started:
        return f"partly done: {', '.join(started)} still raise{'s' * (len(started) == 1)} NotImplementedError"
    if outcomes.count("skipped") == len(outcomes):
        return f"not attempted (open lessons/{LESSON_NOTEBOOKS[lesson]})"
    if untouched:
        passed = outcomes.count("passed")
        return f"partly done ({passed} passed; not written yet: {', '.join(untouched)})"
    return "passed"


@pytest.fixture(scope="module")
def app_in_process():
    """A test module that opens the app's views in this process (AppTest): new replies stay in memory (nothing written
    to the user's cache), and the torch threads the app sets (one: its model's ops are too small to split) are given
    back to the rest of the session after."""
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MINILLM_APP_REPLIES", "off")
        yield
    torch.set_num_threads(threads)
