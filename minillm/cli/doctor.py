"""`python -m minillm doctor`: does this install work? Checked in well under 30 s, before a workshop starts.

One line per check, `ok` or `FAIL` with what to do about it; the exit status is 1 if anything failed:
  python     the interpreter is new enough (pyproject.toml's requires-python)
  packages   every package requirements.txt pins is installed at that version
  model      the shipped model loads (safetensors, no pickle)
  engine     a 20-step engine run (continuous batching, paged KV) gives the plain no-cache loop's tokens exactly
  app        the workshop app imports (in a child process: minillm never imports the app itself)
  lessons    the lesson checks collect (`pytest --collect-only -m lessonNN`, also a child process)
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository: app.py, requirements.txt, lessons/
MIN_PYTHON = (3, 11)
CPU_TORCH = "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"  # PyTorch's CPU wheels
CHILD_TIMEOUT_S = 60
REINSTALL = "a damaged install: pip install --force-reinstall -r requirements.txt"


@dataclass
class Result:
    ok: bool
    detail: str
    fix: str = ""  # what to do, when not ok


def check_python() -> Result:
    have = ".".join(map(str, sys.version_info[:3]))
    if sys.version_info[:2] >= MIN_PYTHON:
        return Result(True, f"Python {have}")
    need = ".".join(map(str, MIN_PYTHON))
    return Result(False, f"Python {have}, minillm needs {need} or newer", f"install Python {need}+ and a new venv")


def pinned(requirements: Path) -> dict[str, str]:
    """name -> version of each `name==version` line that applies to this platform."""
    pins = {}
    for line in requirements.read_text().splitlines():
        line = line.split("#")[0].strip()
        found = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([^\s;]+)\s*(;.*)?", line)
        if not found:
            continue
        name, version, marker = found.groups()
        if marker and "win32" in marker and sys.platform == "win32":
            continue  # (the one marker requirements.txt uses: uvloop, not on Windows)
        pins[name] = version
    return pins


def check_packages() -> Result:
    requirements = ROOT / "requirements.txt"
    if not requirements.is_file():
        return Result(False, f"no {requirements}", "run the doctor from a clone of the minillm repository")
    wrong = []
    for name, want in pinned(requirements).items():
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            wrong.append(f"{name} missing (pinned {want})")
            continue
        if have.split("+")[0] != want:  # (torch's "2.13.0+cpu" is the pinned 2.13.0)
            wrong.append(f"{name} {have} (pinned {want})")
    if not wrong:
        return Result(True, f"the {len(pinned(requirements))} packages requirements.txt pins, at their versions")
    fix = "pip install -r requirements.txt"
    if any(w.startswith("torch") for w in wrong):
        fix = f"{CPU_TORCH} (a laptop without a GPU), then {fix}"
    return Result(False, "; ".join(wrong), fix)


def check_model() -> Result:
    from minillm.model.checkpoint import DEFAULT_CHECKPOINT, load_model

    try:
        model = load_model(device="cpu")
    except Exception as e:  # any failure to load is this check's answer
        return Result(False, f"the shipped model does not load: {type(e).__name__}: {e}",
                      f"restore {DEFAULT_CHECKPOINT.relative_to(ROOT)} (git checkout -- minillm/weights), or "
                      "retrain it: python -m minillm train")  # fmt: skip
    return Result(True, f"the shipped model loads ({model.num_parameters() / 1e6:.2f} M parameters)")


def check_engine() -> Result:
    """Three users on two seats through the real engine, 20 steps at most, against the one-user no-cache loop."""
    from minillm.config import EngineConfig
    from minillm.engine.generate import generate
    from minillm.engine.request import Request
    from minillm.engine.scheduler import ContinuousScheduler
    from minillm.layers import LayeredEngine
    from minillm.model.checkpoint import load_model
    from minillm.model.tokenizer import encode_prompt

    model = load_model(device="cpu")
    prompts = {"a": ("spell 4096", 19), "b": ("count down from 5", 10), "c": ("spell 42", 9)}  # (with their EOS)
    engine = LayeredEngine(model, ContinuousScheduler(), EngineConfig(slots=2, kv="paged", block_size=4))
    requests = [Request(rid, encode_prompt(p), n, prompt=p) for rid, (p, n) in prompts.items()]
    for r in requests:
        engine.submit(r)
    trace = engine.run(max_steps=20)
    for r in requests:
        want = generate(model, r.prompt_ids, r.max_new_tokens, use_cache=False).tokens
        if r.output_ids != want:
            return Result(False, f"{r.prompt!r}: the engine's tokens differ from the no-cache loop's", REINSTALL)
    if not all(r.finish_reason == "eos" for r in requests) or engine.cache.free_blocks != engine.cache.num_blocks:
        return Result(False, "the engine did not finish its 3 users in 20 steps and free their KV blocks", REINSTALL)
    return Result(True, f"{len(trace.steps)} engine steps, 3 users on 2 seats: the same tokens as the no-cache loop")


def child(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else "(no output)"


def check_app() -> Result:
    if not (ROOT / "app.py").is_file():
        return Result(False, f"no app.py in {ROOT}", "run the doctor from a clone of the minillm repository")
    run = child(["-c", "import app"])  # the app's module and every view it imports, without starting a page
    if run.returncode:
        return Result(False, f"the app does not import: {last_line(run.stderr)}", "pip install -r requirements.txt")
    return Result(True, "the app imports (streamlit run app.py)")


def lesson_marks() -> list[str]:
    """Every lesson's check marker (lesson01, lesson02, ...), as pyproject.toml declares them."""
    return sorted(set(re.findall(r'"(lesson\d\d):', (ROOT / "pyproject.toml").read_text())))


def check_lessons() -> Result:
    marks = lesson_marks()
    run = child(["-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", " or ".join(marks)])
    found = re.search(r"(\d+)(?:/\d+)? tests? collected", run.stdout)
    if run.returncode or not found:
        return Result(False, f"the lesson checks do not collect: {last_line(run.stdout + run.stderr)}",
                      "fix the error above in lessons/exercises/ (or git checkout -- lessons/exercises)")  # fmt: skip
    return Result(True, f"the lesson checks collect ({found.group(1)} checks: pytest -m {marks[0]} ... {marks[-1]})")


CHECKS: dict[str, Callable[[], Result]] = {
    "python": check_python,
    "packages": check_packages,
    "model": check_model,
    "engine": check_engine,
    "app": check_app,
    "lessons": check_lessons,
}


def run_checks(checks: dict[str, Callable[[], Result]] | None = None, out=None) -> int:
    """Run each check (default: CHECKS), print its line to `out` (default: stdout); returns the number that failed."""
    checks, out = CHECKS if checks is None else checks, out or sys.stdout
    began, failed = time.perf_counter(), 0
    for name, check in checks.items():
        try:
            result = check()
        except Exception as e:  # a check that breaks is a failed check, and the others still run
            result = Result(
                False, f"the check itself failed: {type(e).__name__}: {e}", "pip install -r requirements.txt"
            )
        failed += not result.ok
        line = f"{'ok  ' if result.ok else 'FAIL'}  {name:<9} {result.detail}"
        print(line + ("" if result.ok else f"\n      fix: {result.fix}"), file=out, flush=True)
    seconds = time.perf_counter() - began
    verdict = "all good" if not failed else f"{failed} of {len(checks)} checks failed"
    print(f"{verdict} ({seconds:.1f} s)", file=out)
    return failed


def cmd_doctor(args: argparse.Namespace) -> None:
    if run_checks():
        sys.exit(1)


def add_commands(sub) -> None:
    p = sub.add_parser("doctor", help="check this install: versions, the model, the engine, the app, the lessons")
    p.set_defaults(func=cmd_doctor, threads=1)
