"""The lessons' first claims, each measured as a ratio within one run on this machine.

batching              decode throughput grows almost linearly with the batch, until compute runs out
paged_step            the cost of paging: a decode step through block tables vs through contiguous rows
static_vs_continuous  on replies of very different lengths, continuous batching keeps the seats busy
memory                with the same KV memory, paging fits more sequences and wastes almost nothing
overhead              the engine's own work (scheduling, block tables, sampling, records) is small
two_by_two            policy and KV layout are independent switches: all four combinations run
"""

from __future__ import annotations

import time

from minillm.bench.common import BenchSettings, serve
from minillm.card.measure import decode_step_time, sync
from minillm.model.transformer import Transformer
from minillm.runs.workload import ChatKnobs


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
