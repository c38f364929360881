"""Inside the forward, both sides (issue 47): one more run of each engine under torch's profiler, every op's own CPU
time put in one of four parts, per step. The timed runs (peer.py) stay unprofiled: the profiler slows what it watches.

- matmuls: the linears' kernels (minillm: torch's oneDNN linear; vLLM: its own build's `onednn_mm`);
- attention: storing the step's keys and values and attending over the pages (minillm: the paged gather, the cache
  writes and SDPA, plain torch; vLLM: its C++ kernels that read the pages in place), the call's own Python included;
- fused by the compiler: a compiled graph's own kernels (norms, rotary, SwiGLU, residual adds), zero when eager;
- other torch ops: every other op the step runs (eager norms and elementwise ops, the step's inputs, the pick);
- not in any op: the rest of the wall time: Python (scheduling, bookkeeping, the model's code between ops).
Each is ms per step of the profiled run, so the parts add up to its mean step (longer than the timed runs')."""

from __future__ import annotations

PARTS = ("matmuls", "attention", "fused by the compiler", "other torch ops", "not in any op")
MATMULS = ("_linear_pointwise", "onednn_mm", "aten::mm", "aten::addmm", "aten::bmm")
# (aten::index_select is also the embedding's lookup: one call a step, a few us)
ATTENTION = ("attention", "attn", "kv_cache", "aten::index_select", "aten::_index_put_impl_")
COMPILED = ("CompiledFxGraph",)


def part_of(op: str) -> str:
    for part, names in (("matmuls", MATMULS), ("attention", ATTENTION), ("fused by the compiler", COMPILED)):
        if any(name in op for name in names):
            return part
    return "other torch ops"


def parts_per_step(ops: dict[str, float], seconds: float, steps: int) -> dict[str, float]:
    """ops: each op's own CPU seconds over a run of `seconds` and `steps` -> ms per step of each part."""
    out = dict.fromkeys(PARTS, 0.0)
    for op, spent in ops.items():
        out[part_of(op)] += spent
    out["not in any op"] = max(0.0, seconds - sum(out.values()))
    return {part: 1000 * spent / steps for part, spent in out.items()}


def minillm_profiled(run) -> dict:
    """run(around) -> peer.minillm_run's result, the profiler entered around its steps alone (building the engine, its
    KV pool zeroed, is no step's work; vLLM's is built once, at start): its seconds, steps and op seconds."""
    from torch.profiler import ProfilerActivity, profile

    watch = profile(activities=[ProfilerActivity.CPU])
    result = run(lambda: watch)
    ops = {e.key: e.self_cpu_time_total / 1e6 for e in watch.key_averages() if e.self_cpu_time_total > 0}
    return {"seconds": result["seconds"], "steps": result["steps"], "ops": ops}


def profile_pair(ours: dict, theirs: dict) -> dict:
    """Both profiled runs as parts per step, and the few ops that cost each side most (ms per step)."""
    top = lambda p: {op: 1000 * s / p["steps"] for op, s in sorted(p["ops"].items(), key=lambda kv: -kv[1])[:6]}
    return {"minillm": parts_per_step(ours["ops"], ours["seconds"], ours["steps"]),
            "vllm": parts_per_step(theirs["ops"], theirs["seconds"], theirs["steps"]),
            "top": {"minillm": top(ours), "vllm": top(theirs)}}  # fmt: skip


def markdown(runs: list[dict]) -> list[str]:
    """The parts table (minillm / vLLM, ms per step) and, per part, the gap in ms per step."""
    profiled = [v for v in runs if "profile" in v]
    if not profiled:
        return []
    lines = ["Inside the step, both sides (one more run each under torch's profiler, which slows both; ms per step, "
             "minillm / vLLM; each op's own CPU time, `bench/peer_profile.py` says which op is in which part):", "",
             "| seats | both | " + " | ".join(PARTS) + " |", "|---:|---|" + "---:|" * len(PARTS)]  # fmt: skip
    for v in profiled:
        ours, theirs = v["profile"]["minillm"], v["profile"]["vllm"]
        cells = [f"{ours[p]:.2f} / {theirs[p]:.2f}" for p in PARTS]
        lines.append(f"| {v['seats']} | {v['mode']} | " + " | ".join(cells) + " |")
    lines += ["", "The ops that cost each side most (ms per step), the first profiled row:", ""]
    first = profiled[0]["profile"]["top"]
    for side, name in (("minillm", "minillm"), ("vllm", "vLLM")):
        lines.append(f"- {name}: " + ", ".join(f"`{op}` {ms:.2f}" for op, ms in first[side].items()))
    return lines + ["", gap_reading(profiled)]


def gap_reading(profiled: list[dict]) -> str:
    """Which part holds most of each row's gap, from the figures."""
    said = []
    for v in profiled:
        ours, theirs = v["profile"]["minillm"], v["profile"]["vllm"]
        gaps = {p: ours[p] - theirs[p] for p in PARTS}
        worst = sorted((p for p in PARTS if gaps[p] > 0), key=lambda p: -gaps[p])[:2]
        total = sum(gaps.values())
        said.append(f"{v['seats']} {v['mode']}: minillm's step {total:+.2f} ms, of which "
                    + ", ".join(f"{p} {gaps[p]:+.2f}" for p in worst))  # fmt: skip
    return "Where the gap is (minillm minus vLLM, ms per step): " + "; ".join(said) + "."
