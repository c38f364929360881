"""Benchmarks: every figure the lessons claim, measured side by side in one run on this machine.

Shared machines are noisy, so each figure is a median of repeats and each claim is a ratio
of two figures measured in the same run. `python -m minillm bench --quick` takes about
two minutes on 2 CPU cores; the full run about seven.
"""

from __future__ import annotations

import platform
import statistics
import time
from dataclasses import dataclass

import torch

from minillm.bench_scheduling import BENCHES as SCHEDULING_BENCHES
from minillm.bench_server import bench_server
from minillm.kv_cache import ContiguousKVCache, PagedKVCache
from minillm.metrics import busy_seats, summarize
from minillm.model import Transformer
from minillm.run import run_workload
from minillm.workload import ChatKnobs


@dataclass
class BenchSettings:
    quick: bool = False
    repeats: int = 15  # median of 15 steps: one burst of background work on a shared machine cannot move it

    @property
    def batch_sizes(self) -> list[int]:
        return [1, 2, 4, 8, 16, 32, 64] if self.quick else [1, 2, 4, 8, 16, 32, 64, 128]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def median_time(fn, repeats: int, device: torch.device, warmup: int = 3) -> float:
    for _ in range(warmup):  # a fresh process's first calls run up to twice as slow (allocations, caches)
        fn()
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@torch.no_grad()
def decode_step_time(model: Transformer, batch: int, context: int, layout: str, repeats: int, block_size: int = 16):
    """Median seconds of one batched decode step: `batch` sequences with about `context` cached tokens
    (each timed step adds one token, so the context grows by `repeats` + 1 over the measurement)."""
    device = next(model.parameters()).device
    longest = context + repeats + 4  # (the warm-up calls add tokens too)
    if layout == "paged":
        blocks = batch * -(-longest // block_size)
        cache = PagedKVCache(model.cfg, num_blocks=blocks, block_size=block_size, device=device)
    else:
        cache = ContiguousKVCache(model.cfg, batch, max_len=model.cfg.max_seq_len, device=device)
    prompt = torch.randint(0, 256, (1, context), device=device)
    for seat in range(batch):
        model(prompt, cache.prepare([seat], context), cache, last_only=True)
    seats, tokens = list(range(batch)), torch.randint(0, 256, (batch, 1), device=device)
    return median_time(lambda: model(tokens, cache.prepare(seats, 1), cache), repeats, device)


def bench_batching(model: Transformer, s: BenchSettings) -> dict:
    """Claim 1: decode throughput grows almost linearly with the batch, until compute runs out."""
    rows = []
    for batch in s.batch_sizes:
        t = decode_step_time(model, batch, 64, "paged", s.repeats)
        rows.append({"batch": batch, "step_s": t, "tokens_per_s": batch / t, "per_user_tokens_per_s": 1 / t})
    ratio = next(r for r in rows if r["batch"] == 64)["tokens_per_s"] / rows[0]["tokens_per_s"]
    return {"rows": rows, "speedup_64_vs_1": ratio, "goal": 12.0, "met": ratio >= 12.0}


def bench_paged_vs_contiguous_step(model: Transformer, s: BenchSettings) -> dict:
    """The cost of paging: decode step time through block tables vs through contiguous rows."""
    rows = []
    for context in (128, 512):
        for batch in (1, 8, 32, 64):
            paged = decode_step_time(model, batch, context, "paged", s.repeats)
            contiguous = decode_step_time(model, batch, context, "contiguous", s.repeats)
            rows.append({"context": context, "batch": batch, "paged_s": paged, "contiguous_s": contiguous,
                         "ratio": paged / contiguous})  # fmt: skip
    at32 = max(r["ratio"] for r in rows if r["batch"] == 32)
    return {"rows": rows, "worst_ratio_at_32": at32, "goal": 1.3, "met": at32 <= 1.3}


def serve(model, workload, scheduler, kv, slots, knobs, num_blocks=None, seed=0, **engine):
    """Run a workload (run.run_workload) and summarize it, with the peak number of busy seats.
    engine: token_budget, prefix_caching."""
    trace = run_workload(model, workload, scheduler, kv, slots, num_blocks, knobs=knobs, seed=seed, **engine)
    return summarize(trace) | {"peak_concurrency": max(busy_seats(st) for st in trace.steps)}, trace


def bench_static_vs_continuous(model: Transformer, s: BenchSettings) -> dict:
    """Claim 2: on replies of very different lengths, continuous batching keeps the seats busy."""
    # Reply lengths are drawn (EOS ignored), as serving benchmarks do, so the policy alone decides.
    knobs = ChatKnobs(requests=128 if s.quick else 512, rate=1000, mean_reply=60, spread=1.0, force_lengths=True)
    slots = 32 if s.quick else 64
    out = {}
    for policy in ("static", "continuous"):
        out[policy], _ = serve(model, "chat", policy, "paged", slots, knobs)
    measured = out["continuous"]["tokens_per_s"] / out["static"]["tokens_per_s"]
    ideal = out["continuous"]["slot_utilization"] / out["static"]["slot_utilization"]
    keys = ("tokens_per_s", "slot_utilization", "ttft_p50_steps", "ttft_p99_steps", "tpot_p50_s", "steps", "wall_s")
    return {
        "slots": slots,
        "requests": knobs.requests,
        **{p: {k: out[p][k] for k in keys} for p in out},
        "speedup": measured,
        "ideal_speedup": ideal,
        "share_of_ideal": measured / ideal,
        "goal_speedup": 4.0,
        "goal_share_of_ideal": 0.9,
        "met": measured >= 4.0 and measured / ideal >= 0.9,
    }


def bench_memory(model: Transformer, s: BenchSettings) -> dict:
    """Claim 3: with the same KV memory, paging fits more sequences and wastes almost nothing."""
    rows_of_memory = 8  # the budget: 8 full-context rows' worth of KV memory
    blocks = rows_of_memory * model.cfg.max_seq_len // 16
    knobs = ChatKnobs(requests=48 if s.quick else 128, rate=1000, mean_reply=200, spread=1.0, force_lengths=True)
    out = {}
    out["contiguous"], _ = serve(model, "chat", "continuous", "contiguous", rows_of_memory, knobs)
    out["paged"], _ = serve(model, "chat", "continuous", "paged", 64, knobs, num_blocks=blocks)
    keys = ("peak_concurrency", "kv_waste", "tokens_per_s", "preemptions", "steps")
    return {
        "budget_token_slots": rows_of_memory * model.cfg.max_seq_len,
        **{k: {m: out[k][m] for m in keys} for k in out},
        "goal_paged_waste": 0.04,
        "met": out["paged"]["kv_waste"] <= 0.04,
    }


def bench_overhead(model: Transformer, s: BenchSettings) -> dict:
    """Claim 4: the engine's own work (scheduling, block tables, sampling, records) is small."""
    forward_s = [0.0]
    original = model.forward

    def timed_forward(*args, **kwargs):
        device = next(model.parameters()).device
        sync(device)
        start = time.perf_counter()
        out = original(*args, **kwargs)
        sync(device)
        forward_s[0] += time.perf_counter() - start
        return out

    knobs = ChatKnobs(requests=32, rate=1000, mean_reply=120, spread=0.0, force_lengths=True)
    model.forward = timed_forward
    try:
        summary, trace = serve(model, "chat", "continuous", "paged", 32, knobs)
    finally:
        del model.forward
    total = sum(st.wall_s for st in trace.steps)
    share = 1 - forward_s[0] / total
    return {"slots": 32, "steps": len(trace.steps), "total_s": total, "forward_s": forward_s[0],
            "overhead_share": share, "goal": 0.10, "met": share <= 0.10}  # fmt: skip


def bench_two_by_two(model: Transformer, s: BenchSettings) -> dict:
    """Claim 5: scheduling policy and KV layout are independent switches; all four combinations run."""
    knobs = ChatKnobs(requests=64 if s.quick else 128, rate=1000, mean_reply=100, spread=1.0, force_lengths=True)
    rows = []
    for policy in ("static", "continuous"):
        for kv in ("contiguous", "paged"):
            slots, blocks = (8, None) if kv == "contiguous" else (32, 8 * model.cfg.max_seq_len // 16)
            summary, _ = serve(model, "chat", policy, kv, slots, knobs, num_blocks=blocks)
            rows.append({"scheduler": policy, "kv": kv, "seats": slots, "tokens_per_s": summary["tokens_per_s"],
                         "peak_concurrency": summary["peak_concurrency"], "steps": summary["steps"],
                         "slot_utilization": summary["slot_utilization"]})  # fmt: skip
    return {"budget_token_slots": 8 * model.cfg.max_seq_len, "rows": rows}


BENCHES = (
    {
        "batching": bench_batching,
        "paged_step": bench_paged_vs_contiguous_step,
        "static_vs_continuous": bench_static_vs_continuous,
        "memory": bench_memory,
        "overhead": bench_overhead,
        "two_by_two": bench_two_by_two,
    }
    | SCHEDULING_BENCHES
    | {"server": bench_server}
)


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
