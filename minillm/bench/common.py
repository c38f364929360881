"""What every benchmark shares: its settings, serving a workload and summarizing it, naming the machine."""

from __future__ import annotations

import platform
from dataclasses import dataclass

import torch

from minillm.runs.metrics import busy_seats, summarize
from minillm.runs.run import run_workload


@dataclass
class BenchSettings:
    quick: bool = False
    repeats: int = 15  # median of 15 steps: one burst of background work on a shared machine cannot move it

    @property
    def batch_sizes(self) -> list[int]:
        return [1, 2, 4, 8, 16, 32, 64] if self.quick else [1, 2, 4, 8, 16, 32, 64, 128]


def serve(model, workload, scheduler, kv, slots, knobs, num_blocks=None, seed=0, **engine):
    """Run a workload (run.run_workload) and summarize it, with the peak number of busy seats.
    engine: token_budget, prefix_caching."""
    trace = run_workload(model, workload, scheduler, kv, slots, num_blocks, knobs=knobs, seed=seed, **engine)
    return summarize(trace) | {"peak_concurrency": max(busy_seats(st) for st in trace.steps)}, trace


def machine_description(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}"
    cpu = platform.processor() or platform.machine()
    try:  # the marketing name, where Linux tells it
        names = [line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")]
        cpu = f"{names[0]} ({len(names)} cores)" if names else cpu
    except OSError:
        pass
    return f"{cpu}, {torch.get_num_threads()} torch threads, torch {torch.__version__}"
