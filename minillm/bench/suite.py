"""Benchmarks: every figure the lessons claim, measured side by side in one run on this machine.

Shared machines are noisy, so each figure is a median of repeats and each claim is a ratio
of two figures measured in the same run. `python -m minillm bench --quick` takes about
two minutes on 2 CPU cores; the full run about seven.
"""

from __future__ import annotations

import time

from minillm.bench import claims
from minillm.bench.calls import bench_calls
from minillm.bench.common import BenchSettings, machine_description
from minillm.bench.fleet import bench_fleet
from minillm.bench.papers import bench_papers
from minillm.bench.peer import bench_peer
from minillm.bench.replies import bench_replies
from minillm.bench.roofline import bench_roofline
from minillm.bench.scheduling import BENCHES as SCHEDULING_BENCHES
from minillm.bench.server import bench_server, bench_transformers_server
from minillm.bench.speculation import bench_speculation
from minillm.bench.structured import bench_structured
from minillm.bench.tensor_parallel import bench_tensor_parallel
from minillm.bench.tier import bench_tier
from minillm.bench.versus import bench_vs_transformers
from minillm.bench.who_goes_first import bench_who_goes_first
from minillm.model.transformer import Transformer

BENCHES = (
    {
        "batching": claims.bench_batching,
        "paged_step": claims.bench_paged_vs_contiguous_step,
        "static_vs_continuous": claims.bench_static_vs_continuous,
        "memory": claims.bench_memory,
        "overhead": claims.bench_overhead,
        "two_by_two": claims.bench_two_by_two,
    }
    | SCHEDULING_BENCHES
    | {
        "roofline": bench_roofline,
        "calls": bench_calls,
        "vs_transformers": bench_vs_transformers,
        "server": bench_server,
        "transformers_server": bench_transformers_server,
        "speculation": bench_speculation,
        "structured": bench_structured,
        "tp": bench_tensor_parallel,
        "fleet": bench_fleet,
        "peer": bench_peer,
        "who_goes_first": bench_who_goes_first,
        "replies": bench_replies,
        "tier": bench_tier,
        "papers": bench_papers,
    }
)


def run_benchmarks(model: Transformer, settings: BenchSettings, only: list[str] | None = None, progress=True) -> dict:
    from tqdm import tqdm

    device = next(model.parameters()).device
    results = {"machine": machine_description(device), "device": str(device), "quick": settings.quick,
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}  # fmt: skip
    names = only or list(BENCHES)
    for name in tqdm(names, desc="bench", disable=not progress):
        start = time.perf_counter()
        results[name] = BENCHES[name](model, settings) | {"seconds": time.perf_counter() - start}
    return results
