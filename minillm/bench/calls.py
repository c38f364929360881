"""Where a decode step's torch calls go, by kind: the CPU's analogue of a GPU's kernel launches.

On this machine a step of the shipped model is mostly a fixed cost per torch call (Python, dispatch,
bookkeeping: a few microseconds each, whatever the tensor sizes), so the number of calls a step makes
sets its time at small batch. This entry counts them (card.measure.torch_calls, nothing timed while
counting) in one paged decode step at batch 1 and 64, sorts them by kind, and times the same step.

BEFORE is the table this entry printed on the code before issue 22's fusions, and LADDER the calls and
step times after each of its changes, so the report can say what each change removed.
"""

from __future__ import annotations

import torch

from minillm.card.measure import decode_step_time, torch_calls
from minillm.engine.kv_cache import PagedKVCache
from minillm.model.transformer import Transformer

BATCHES, CONTEXT = (1, 64), 64  # the decode steps of the batching entry: paged, 64 cached tokens per row
MATMULS = {"linear", "matmul", "mm", "bmm", "addmm", "einsum"}
# The function that made a call names its kind (the first match wins); a Linear's matmul is a matmul wherever it is.
CALLERS = (("RMSNorm", "norm"), ("rope", "rope"), ("prepare", "step plan"), ("plan_rows", "step plan"),
           ("RaggedRows.__init__", "step plan"),
           ("StepPlan", "step plan"), ("slot_mapping", "step plan"), ("paged_gather", "kv cache"),
           ("KVCache.attend", "kv cache"), ("attend", "attention"), ("visible_mask", "attention"))  # fmt: skip
OPS = {
    "view": {"view", "reshape", "transpose", "flatten", "unflatten", "unsqueeze", "squeeze", "expand", "permute"},
    "index": {"__getitem__", "__setitem__", "gather", "index_select", "embedding", "index_put_", "index_copy_"},
    "cat/split": {"cat", "stack", "split", "chunk", "unbind"},
    "elementwise": {"add", "mul", "silu", "__add__", "__mul__", "__radd__", "__rmul__", "neg", "__neg__"},
}
KINDS = ("matmul", "norm", "rope", "attention", "kv cache", "step plan", "view", "index", "cat/split", "elementwise",
         "other")  # fmt: skip

# `python -m minillm bench --only calls` at commit d00fce6 (before issue 22's changes): the same 317 calls at both
# batches. The step times are issue 22's figures for that code on this project's 2-core AMD EPYC machine, one torch
# thread (BENCHMARKS.md's run of that commit: 3.04 and 11.49 ms).
BEFORE_KINDS = {"matmul": 29, "norm": 54, "rope": 72, "attention": 48, "kv cache": 64, "step plan": 15, "view": 16,
                "index": 3, "cat/split": 0, "elementwise": 16, "other": 0}  # fmt: skip
BEFORE = [{"batch": 1, "calls": 317, "by_kind": BEFORE_KINDS, "step_s": 2.8e-3},
          {"batch": 64, "calls": 317, "by_kind": BEFORE_KINDS, "step_s": 9.1e-3}]  # fmt: skip
# After each of issue 22's changes, one commit each: (change, calls per decode step, then the step's thread CPU time
# in ms at batch 1 and 64, the median of 8 runs interleaved with the other commits on the shared 2-core machine while
# four other jobs ran: differences under about 10% are noise there; the calls are exact).
LADDER = [
    ("before (d00fce6)", 317, 3.65, 14.89),
    ("RMSNorm in one call (F.rms_norm)", 272, 3.55, 16.18),
    ("q, k, v in one matmul (qkv_proj)", 260, 3.41, 15.17),
    ("gate and up in one matmul (gate_up_proj)", 260, 3.50, 15.55),
    ("RoPE once for q and k, tables gathered once per step", 208, 3.50, 15.19),
    ("the step planned once (StepPlan), no host syncs", 148, 3.32, 14.76),
    ("paged_gather by index_select, masks in sdpa's form", 157, 3.25, 13.33),
    ("decode attention with query heads folded per kv head", 157, 3.02, 13.57),
    ("rectangles skip regrouping; one index per cache read", 154, 3.27, 11.26),
]


def call_kind(caller: str, op: str) -> str:
    """Which kind of work one torch call is, from the function that made it and the op's name."""
    if op in MATMULS:
        return "matmul"
    kind = next((kind for needle, kind in CALLERS if needle in caller), None)
    return kind or next((kind for kind, ops in OPS.items() if op in ops), "other")


def calls_by_kind(fn) -> dict[str, int]:
    kinds = dict.fromkeys(KINDS, 0)
    for (caller, op), n in torch_calls(fn).items():
        kinds[call_kind(caller, op)] += n
    return kinds


@torch.no_grad()
def decode_step_calls(model: Transformer, batch: int, context: int = CONTEXT, block_size: int = 16) -> dict[str, int]:
    """Torch calls by kind in one paged decode step (cache.prepare and the forward), as decode_step_time runs it."""
    device = next(model.parameters()).device
    cache = PagedKVCache(model.cfg, batch * -(-(context + 2) // block_size), block_size, device=device)
    prompt = torch.randint(0, 256, (1, context), device=device)
    for seat in range(batch):
        model(prompt, cache.prepare([seat], context), cache, last_only=True)
    tokens, seats = torch.randint(0, 256, (batch, 1), device=device), list(range(batch))
    return calls_by_kind(lambda: model(tokens, cache.prepare(seats, 1), cache))


def bench_calls(model: Transformer, s) -> dict:
    """Torch calls per decode step by kind, and the step's time, at batch 1 and 64."""
    rows = []
    for batch in BATCHES:
        kinds = decode_step_calls(model, batch)
        step_s = decode_step_time(model, batch, CONTEXT, "paged", s.repeats)
        rows.append({"batch": batch, "calls": sum(kinds.values()), "by_kind": kinds, "step_s": step_s})
    calls_ratio, step_ratio = rows[0]["calls"] / BEFORE[0]["calls"], rows[0]["step_s"] / BEFORE[0]["step_s"]
    return {"context": CONTEXT, "rows": rows, "before": BEFORE, "ladder": LADDER, "calls_vs_before": calls_ratio,
            "step_vs_before": step_ratio, "goal": 0.5, "met": calls_ratio <= 0.5 and step_ratio <= 0.5}  # fmt: skip


def markdown(r: dict) -> list[str]:
    from minillm.bench.report_scheduling import verdict

    rows, before = r["rows"], r["before"]
    header = " | ".join(f"batch {x['batch']}: calls | share" for x in rows)
    lines = ["## 12. Torch calls per decode step", "",
             f"One paged decode step of the shipped model ({r['context']} cached tokens per row): torch calls by kind, "
             "counted (not timed) with a TorchFunctionMode (`card.measure.torch_calls`), before issue 22's "
             "changes and now. Each call pays a fixed cost of a few microseconds here, the CPU's kernel launch.", "",
             f"| kind | before: batch 1 | {header} |", "|---|---:|" + "---:|---:|" * len(rows)]  # fmt: skip
    for kind in KINDS:
        cells = " | ".join(f"{x['by_kind'][kind]} | {x['by_kind'][kind] / x['calls']:.0%}" for x in rows)
        lines.append(f"| {kind} | {before[0]['by_kind'].get(kind, 0)} | {cells} |")
    cells = " | ".join(f"**{x['calls']}** | 100%" for x in rows)
    lines += [
        f"| **all** | **{before[0]['calls']}** | {cells} |",
        "",
        "| batch | calls before | calls now | step before (ms) | step now (ms) |",
        "|---:|---:|---:|---:|---:|",
    ]
    lines += [f"| {x['batch']} | {b['calls']} | {x['calls']} | {b['step_s'] * 1e3:.2f} | {x['step_s'] * 1e3:.2f} |"
              for b, x in zip(before, rows)]  # fmt: skip
    if r["ladder"]:
        lines += [
            "",
            "What each change removed, one commit each (step: thread CPU time, medians of 8 runs on the shared "
            "machine, recorded in bench/calls.py; differences under about 10% are noise there):",
            "",
            "| change | calls | step CPU, batch 1 (ms) | step CPU, batch 64 (ms) |",
            "|---|---:|---:|---:|",
        ]
        lines += [f"| {change} | {calls} | {one:.2f} | {many:.2f} |" for change, calls, one, many in r["ladder"]]
    lines += ["", f"Goals: at batch 1, calls and step time at most {r['goal']:.0%} of before. Measured: calls "
              f"{r['calls_vs_before']:.0%}, step time {r['step_vs_before']:.0%} of the recorded figure: "
              f"{verdict(r['met'])}.", ""]  # fmt: skip
    return lines
