"""The step player's engine runs, kept on disk, and a worker that runs ahead the ones a room is likely to ask for next.

A run of the tiny model costs 3-8 s of CPU (the seed story's static batching: 996 steps of about 6 ms), and a room
changes seats, workload or KV layout live: 9-14 s a change on a 2-core laptop, both policies. So every run is kept
on disk (a gzipped trace, 0.1-1 MB), keyed by its settings and a fingerprint of the code and weights that made it
(an edit to the engine or a retrained checkpoint makes new keys, never a stale picture), and a background process
at the lowest CPU priority runs the settings one change away from the ones on screen (the other KV layout, the seats
nearest first, each workload), so that changing to one of them costs a read, not a run. Asked first for the runs on
screen that are not on disk yet, in the reverse of the order the app runs them, it also runs the second policy
while the app runs the first (a first visit, a change not run ahead): the two cores each run one. What it has run
stays for the next session: a workshop rehearsed once opens with its moves already on disk. A fleet's run (two
engines in this process: fleet_run.py) is kept and run ahead the same way, its engines' traces in one file.

    MINILLM_APP_TRACES=DIR   where (default: $XDG_CACHE_HOME/minillm/app-traces); "off": neither disk nor worker
    MINILLM_APP_WARM=0       the disk, without the worker (screenshots; and by default inside pytest: 1 turns it on)
    python -m viz.app.trace_store DIR    the worker itself: runs DIR's queue.json until it is done (the app starts it)

Nothing here imports Streamlit: the worker is a plain Python process.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from functools import cache
from pathlib import Path

import torch

import minillm
from minillm.card.calibrate import cache_dir
from minillm.grammar import compile_regex
from minillm.layers.trace import Trace
from minillm.runs.run import workload_engine
from minillm.runs.workload import ChatKnobs
from viz.app import fleet_run

QUEUE, CURRENT = "queue.json", "current.json"  # the runs wanted, nearest first; the one the worker is on
WAIT_S = 20.0  # the longest the app waits for the worker to finish a run it needs (then it runs it itself)
KEEP_FINGERPRINTS = 3  # directories of older code's runs kept (switching branches back and forth), the rest deleted
Job = tuple[str, dict, str]  # (scheduler, settings, device): one engine run; scheduler "fleet": a fleet's (fleet_run)
Run = Trace | list[Trace]  # what a job makes: a fleet makes one trace per engine


def root() -> Path | None:
    """Where runs are kept (None: off)."""
    where = os.environ.get("MINILLM_APP_TRACES", "")
    if where.lower() == "off":
        return None
    return Path(where) if where else cache_dir() / "app-traces"


def warming() -> bool:
    """Whether the worker runs ahead: MINILLM_APP_WARM=1 or 0 says; unset, yes, except inside a pytest run (a test
    that opens the app must not leave a process behind it using a core; tests that want the worker ask for it)."""
    asked = os.environ.get("MINILLM_APP_WARM")
    if root() is None or asked == "0":
        return False
    return asked == "1" or "PYTEST_CURRENT_TEST" not in os.environ


@cache
def fingerprint() -> str:
    """A hash of what makes a run: minillm's source and shipped weights, and torch's version."""
    digest = hashlib.sha256(torch.__version__.encode())
    package = Path(minillm.__file__).parent
    for path in sorted([*package.rglob("*.py"), *package.glob("weights/*")]):
        digest.update(str(path.relative_to(package)).encode() + path.read_bytes())
    return digest.hexdigest()[:16]


def key(scheduler: str, settings: dict, device: str) -> str:
    return json.dumps([scheduler, settings, device], sort_keys=True)


def folder() -> Path | None:
    base = root()
    return None if base is None else base / fingerprint()


def path_of(job: Job) -> Path | None:
    where = folder()
    return None if where is None else where / f"{hashlib.sha1(key(*job).encode()).hexdigest()[:24]}.json.gz"


def load(job: Job) -> Run | None:
    """The run from disk, or None (not run yet, off, or unreadable: a half-written file is never seen, see save)."""
    path = path_of(job)
    if path is None or not path.is_file():
        return None
    try:
        data = json.loads(gzip.decompress(path.read_bytes()))
        return [Trace.from_dict(d) for d in data] if isinstance(data, list) else Trace.from_dict(data)
    except (OSError, ValueError, KeyError, TypeError):
        path.unlink(missing_ok=True)  # (a file from a crash: run it again)
        return None


def save(job: Job, trace: Run) -> None:
    path = path_of(job)
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_suffix(f".{os.getpid()}.part")
    data = [t.to_dict() for t in trace] if isinstance(trace, list) else trace.to_dict()
    part.write_bytes(gzip.compress(json.dumps(data, separators=(",", ":")).encode(), compresslevel=3))
    os.replace(part, path)  # atomic: a reader sees the whole file or none
    _forget_old_code(path.parent.parent)


def _forget_old_code(base: Path) -> None:
    folders = sorted((p for p in base.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in folders[KEEP_FINGERPRINTS:]:
        for file in old.iterdir():
            file.unlink(missing_ok=True)
        old.rmdir()


NUMBERS = r"[0-9]+( [0-9]+)*"  # numbers apart by one space: how the model counts down (lesson 14's "habit")


def run(job: Job, model) -> Run:
    """One engine run of the step player: a scheduler's name, the sidebar's settings (step_player.sidebar). With
    "constrained" every other user's reply is held to NUMBERS (a countdown obeys it as it is; a spelling is forced
    into digits), so the chat shows what each step's mask allowed. A fleet's job runs every engine of it."""
    scheduler, settings, _ = job
    if scheduler == "fleet":
        return fleet_run.run(settings, model)
    settings = dict(settings)
    workload, knobs, constrained = settings.pop("workload"), settings.pop("knobs"), settings.pop("constrained", False)
    engine = workload_engine(model, workload, scheduler, knobs=ChatKnobs(**knobs) if knobs else None, **settings)
    if constrained:
        for r in engine.requests[1::2]:  # (submitted, not yet arrived: the engine applies a mask from its first pick)
            if r.finish_reason is None and not r.ignore_eos:  # (a constrained reply must be able to end)
                r.sampling = replace(r.sampling, constraint=compile_regex(NUMBERS))
    return engine.run()


def wait_for(job: Job, timeout_s: float = WAIT_S) -> Run | None:
    """The run, if the worker is on it right now: it started earlier, so waiting beats running it a second time
    beside it on a machine with two cores (a first visit: it runs one policy while the app runs the other)."""
    where = folder()
    deadline = time.monotonic() + timeout_s
    while where is not None and _worker_alive() and time.monotonic() < deadline:
        try:
            if json.loads((where / CURRENT).read_text()) != key(*job):
                break
        except (OSError, ValueError):
            break
        time.sleep(0.1)
    return load(job)


def obtain(job: Job, model) -> Run:
    """The run from disk (an earlier session, or the worker: waited for while it is on it), else run here and kept
    there; either way as a read one would be (through its dict). model: a callable that returns the model (only a
    run here needs it)."""
    found = load(job) or wait_for(job)
    if found is not None:
        return found
    made = run(job, model())
    made = [Trace.from_dict(t.to_dict()) for t in made] if isinstance(made, list) else Trace.from_dict(made.to_dict())
    save(job, made)
    return made


# --- the worker -----------------------------------------------------------------------------------------------------
_worker: subprocess.Popen | None = None  # this app server's worker (one for all sessions)


def _worker_alive() -> bool:
    return _worker is not None and _worker.poll() is None


def warm(jobs: list[Job]) -> None:
    """Ask the worker for these runs, nearest first (they replace what it was asked for before; the one it is on is
    finished first); start it if it is not running. Runs already on disk are left out."""
    global _worker
    where = folder()
    if where is None or not warming():
        return
    wanted = [key(*job) for job in jobs if not path_of(job).is_file()]
    if not wanted:
        return
    where.mkdir(parents=True, exist_ok=True)
    part = where / f"{QUEUE}.{os.getpid()}.part"
    part.write_text(json.dumps(wanted))
    os.replace(part, where / QUEUE)
    if not _worker_alive():
        repo = Path(__file__).parents[2]
        env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))}
        _worker = subprocess.Popen([sys.executable, "-m", "viz.app.trace_store", str(where)], cwd=repo, env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip


def work(where: Path, model=None, parent: int | None = None) -> int:
    """Run the queue in `where` until nothing in it is missing (re-read after every run: the app may have moved on);
    returns how many runs it made. parent: stop when that process is gone."""
    from minillm.model.checkpoint import load_model

    made, models = 0, {}
    while parent is None or os.getppid() == parent:
        try:
            queue = json.loads((where / QUEUE).read_text())
        except (OSError, ValueError):
            break
        todo = [json.loads(k) for k in queue]
        job = next(((s, settings, d) for s, settings, d in todo if not path_of((s, settings, d)).is_file()), None)
        if job is None:
            break
        (where / CURRENT).write_text(json.dumps(key(*job)))
        if model is None and job[2] not in models:
            models[job[2]] = load_model(device=job[2])
        save(job, run(job, model or models[job[2]]))
        made += 1
    (where / CURRENT).unlink(missing_ok=True)
    return made


if __name__ == "__main__":  # the worker: the lowest priority, one thread (the tiny model's ops are too small to split)
    os.nice(19)
    torch.set_num_threads(1)
    work(Path(sys.argv[1]), parent=os.getppid())
