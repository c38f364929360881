"""How long each step-player setting takes to answer, measured in Streamlit's AppTest (the whole script run, both
policies drawn), from a cold start in a fresh process: what a presenter waits after moving a control.

    python docs/measure_settings.py [--load N] [--json]

--load N keeps N other processes busy on the CPU meanwhile (a workshop laptop runs a browser, a projector, a call).
Each change starts from the app's default and is timed alone; "first frame" is the first run of a fresh process
(model loaded, the shipped replies read, both policies served and drawn).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHANGES = {  # what a room changes: (widget kind, key, value)
    "seats 4 -> 6": ("slider", "slots-True", 6),
    "KV layout contiguous": ("radio", "kv", "contiguous"),
    "block size 8": ("select_slider", "block_size", 8),
    "KV blocks 48": ("number_input", "num_blocks", 48),
    "token budget 16": ("select_slider", "token_budget", 16),
    "prefix caching on": ("toggle", "prefix_caching", True),
    "speculation 4": ("select_slider", "speculate", 4),
    "constrained replies": ("toggle", "constrained", True),
    "workload chat": ("selectbox", "workload", "chat"),
    "workload system-prompt": ("selectbox", "workload", "system-prompt"),
    "workload long-prompts": ("selectbox", "workload", "long-prompts"),
    "workload bursty": ("selectbox", "workload", "bursty"),
    "scheduler: continuous only": ("radio", "schedule", "continuous"),
    "my scheduler vs continuous": ("radio", "schedule", "my scheduler vs continuous"),
    # a crowd's knobs draw new prompts: the model computes the replies it has never given (then replays them)
    "chat: requests 32 -> 48": ("slider", "requests", 48, "chat"),
    "chat: mean reply 80 -> 120": ("slider", "mean_reply", 120, "chat"),
    "chat: seed 0 -> 1": ("number_input", "seed", 1, "chat"),
}


def busy() -> None:
    while True:
        pass


def measure() -> dict:
    from streamlit.testing.v1 import AppTest

    began = time.perf_counter()
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300).run()
    times = {"first frame (cold process)": time.perf_counter() - began}
    assert not at.exception, at.exception
    for name, (kind, key, value, *workload) in CHANGES.items():
        at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300)
        if workload:
            at.session_state["workload"] = workload[0]
        at.run()  # where the change starts from (its runs cached: a room has been looking at it)
        widget = getattr(at, kind)(key=key)
        began = time.perf_counter()
        widget.set_value(value).run()
        times[name] = time.perf_counter() - began
        assert not at.exception, (name, at.exception)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load", type=int, default=0, help="busy processes beside the app (default 0)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("MINILLM_APP_REPLIES", "off")  # (the user's cache untouched: what a fresh clone has)
    sys.path.insert(0, str(ROOT))
    load = [multiprocessing.Process(target=busy, daemon=True) for _ in range(args.load)]
    for p in load:
        p.start()
    try:
        times = measure()
    finally:
        for p in load:
            p.terminate()
    if args.json:
        print(json.dumps(times, indent=1))
        return
    print(f"{os.cpu_count()} CPUs, {args.load} busy beside the app")
    for name, seconds in times.items():
        print(f"{name:32s} {seconds:6.2f} s")


if __name__ == "__main__":
    main()
