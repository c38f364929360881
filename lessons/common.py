"""What every lesson notebook needs first, in one import:

    from common import FAST, device, exercise, model

- the repo root goes on the import path, so `import minillm` works whether Jupyter started in the repo
  or in lessons/ (notebooks run with lessons/ as their working directory, so `common` is this file);
- torch on ONE CPU thread (below: why);
- the shipped model, loaded once (on a GPU when torch sees one);
- FAST: small sizes by default, so every notebook runs in seconds; MINILLM_FAST=0 for fuller measurements;
- exercise(name): your exercise module, reloaded so a cell always runs your latest edits.

Why one thread: this model's operations are tiny (a decode step multiplies a few vectors by 256-wide
matrices), too small to split usefully across cores, and when another program keeps a core busy two
torch threads wait on each other at every operation. The seed story (lesson 3) on this project's 2-core
machine while two other jobs ran: 3.4 s on one thread, 34 s on two. On an idle machine two threads gain
little. Set MINILLM_THREADS to try others.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402 (after the path set-up above)

from minillm.model.checkpoint import load_model  # noqa: E402

FAST = os.environ.get("MINILLM_FAST", "1") == "1"  # 1 (default): small sizes; 0: fuller measurements
THREADS = int(os.environ.get("MINILLM_THREADS", "1"))

model = load_model()  # the shipped checkpoint, on a GPU if torch sees one
device = next(model.parameters()).device
if device.type == "cpu":
    torch.set_num_threads(THREADS)


def exercise(name: str):
    """Your exercise module lessons/exercises/<name>.py, freshly reloaded: a cell always runs your latest edits."""
    return importlib.reload(importlib.import_module(f"lessons.exercises.{name}"))
