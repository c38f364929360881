"""Tensor parallelism's processes: a worker that dies stops the engine within seconds with a clear message (no hang),
rank 0 that dies takes its workers with it, tp = 4 where the heads allow it, and no process outlives a run.

Each test starts its own sharded runner (torch.distributed allows one process group per process at a time) and
ends it, even when it fails.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from minillm.config import EngineConfig
from minillm.engine.generate import generate
from minillm.engine.scheduler import ContinuousScheduler
from minillm.layers import LayeredEngine
from minillm.parallel.runner import ShardedRunner, WorkerDied
from tests.conftest import random_model
from tests.lessons.harness import crowd

ROOT = Path(__file__).resolve().parent.parent


def children(pid: int) -> list[int]:
    """Live processes whose parent is `pid` (from /proc; Linux), the resource tracker of multiprocessing excepted."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z" and b"resource_tracker" not in cmdline:
            found.append(int(stat.parent.name))
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_until(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc (Linux)")


def test_a_worker_that_dies_stops_the_engine_within_seconds_and_close_leaves_no_process():
    runner = ShardedRunner(random_model("gqa"), 2)
    try:
        engine = LayeredEngine(runner, ContinuousScheduler(), EngineConfig(max_len=256, slots=3))
        for r in crowd(6):
            engine.submit(r)
        for _ in range(3):
            engine.step()
        (worker,) = runner.workers
        os.kill(worker.pid, signal.SIGKILL)
        began = time.monotonic()
        with pytest.raises(WorkerDied, match="rank 1") as died:
            while engine.has_work():
                engine.step()
        assert time.monotonic() - began < 10, "the engine took too long to notice"
        assert "exited with code -9" in str(died.value) or "collective failed" in str(died.value)
    finally:
        runner.close()
    assert not children(os.getpid()), "a process outlived the run"


def test_close_ends_every_worker_and_a_second_close_is_harmless():
    runner = ShardedRunner(random_model("gqa"), 2)
    pids = [w.pid for w in runner.workers]
    try:
        assert all(alive(pid) for pid in pids)
    finally:
        runner.close()
        runner.close()
    assert not any(alive(pid) for pid in pids) and not children(os.getpid())


def test_tp_4_where_the_heads_allow_it_gives_one_devices_replies():
    model = random_model("mha")  # 4 query heads, 4 key/value heads: 4 ranks of one head each
    runner = ShardedRunner(model, 4)
    try:
        engine = LayeredEngine(runner, ContinuousScheduler(), EngineConfig(max_len=256, slots=3, block_size=4))
        requests = crowd(5)
        for r in requests:
            engine.submit(r)
        engine.run()
        for r in requests:
            assert r.output_ids == generate(model, r.prompt_ids, r.max_new_tokens, use_cache=False,
                                            ignore_eos=True).tokens, r.id  # fmt: skip
    finally:
        runner.close()
    assert not children(os.getpid())


RANK_0 = """
    import os, sys, time, torch
    from tests.conftest import random_model
    from minillm.parallel.runner import ShardedRunner
    runner = ShardedRunner(random_model("gqa"), 2)
    print(runner.workers[0].pid, flush=True)
    time.sleep(60)
"""


def test_when_rank_0_dies_its_workers_end_too():
    """SIGKILL leaves no atexit to run: the worker, waiting for its next step, sees rank 0's socket close."""
    rank0 = subprocess.Popen([sys.executable, "-c", textwrap.dedent(RANK_0)], cwd=ROOT, stdout=subprocess.PIPE,
                             text=True, env=os.environ | {"PYTHONPATH": str(ROOT)})  # fmt: skip
    try:
        worker = int(rank0.stdout.readline())
        assert alive(worker)
        rank0.kill()
        rank0.wait()
        assert wait_until(lambda: not alive(worker), 15), "a worker outlived its rank 0"
    finally:
        rank0.kill()
        rank0.wait()
        for pid in children(rank0.pid):
            os.kill(pid, signal.SIGKILL)
