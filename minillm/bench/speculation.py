"""Speculative decoding beside batching: measured on this machine, predicted by the cost model.

speculation   tokens/s with and without speculation against the batch (1, 2, 4, ... 64 users decoding at once)
              for k = 2, 4, 8 guesses a step with the shipped draft model; the acceptance rate per task (draft
              model and prompt lookup); where speculation stops paying, measured and predicted
              (card/speculation.py), here and for Llama-3.1-8B with Llama-3.2-1B on an RTX 4090 and an H100.

Every configuration runs the same requests; a run of each k sits beside a run without speculation, round after
round, and each figure is the median over the rounds (the machine is shared: one noisy round moves no median).
The batch is B users counting down from 100 to 152 (the longest replies: B users decode together for hundreds
of steps); tokens/s counts the steps in which all B decoded, up to the first reply's end, so the figure is the
batch's. Countdowns are the task the draft guesses best: the acceptance per task says how much.
"""

from __future__ import annotations

import random
import statistics

from minillm.config import EngineConfig
from minillm.engine.engine import Engine
from minillm.engine.request import Request
from minillm.engine.scheduler import ContinuousScheduler
from minillm.model.checkpoint import DRAFT_CHECKPOINT, checkpoint_info, load_model
from minillm.model.tokenizer import encode_prompt
from minillm.model.transformer import Transformer
from minillm.runs.metrics import draft_figures
from minillm.training import tasks

KS = (2, 4, 8)
GOAL_SPEEDUP_AT_1 = 1.8  # tokens/s with speculation over without, one user, the shipped draft
GOAL_CROSSOVER_WITHIN = 2.0  # the measured crossover batch within this factor of the predicted one


def crowd(n: int, seed: int, task: str | None = None) -> list[Request]:
    """n requests of the two tasks (half each, or one `task`), as users send them: replies end at EOS."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        name = task or list(tasks.TASKS)[i % len(tasks.TASKS)]
        prompt, _ = tasks.TASKS[name](rng)
        out.append(Request(f"{name}-{i}", encode_prompt(prompt), 600, prompt=prompt))
    return out


def long_countdowns(n: int, seed: int) -> list[Request]:
    """n countdowns from 100 to 152: replies of 290 to 499 tokens, so n users decode together for hundreds of steps."""
    rng = random.Random(seed)
    prompts = [f"count down from {rng.randint(100, tasks.MAX_COUNT)}" for _ in range(n)]
    return [Request(f"c{i}", encode_prompt(p), 600, prompt=p) for i, p in enumerate(prompts)]


def engine_for(model: Transformer, slots: int, k: int, drafter="model", draft=None) -> Engine:
    """Continuous batching with no token budget: a verify row of k + 1 tokens is never cut."""
    cfg = EngineConfig(slots=slots, speculate=k, drafter=drafter, record_blocks=False)
    return Engine(model, ContinuousScheduler(token_budget=0), cfg, draft=draft)


def serve(model: Transformer, requests: list[Request], slots: int, k: int, drafter="model", draft=None):
    engine = engine_for(model, slots, k, drafter, draft)
    for r in requests:
        engine.submit(r)
    return engine.run()


def decode_rate(model: Transformer, draft, batch: int, k: int, seed: int, steps: int | None = None):
    """`batch` users decoding together: output tokens / seconds over the steps in which every one of them decoded
    (up to the first reply's end, or `steps` such steps), and what a verify row gained per step (None without
    speculation)."""
    engine = engine_for(model, batch, k, draft=draft)
    for r in long_countdowns(batch, seed):
        engine.submit(r)
    tokens = seconds = rows = kept = counted = 0
    while engine.has_work() and counted != steps:
        record = engine.step()
        if record.finished:
            break
        if len(record.seats) == batch and all(entry[2] == "decode" for entry in record.seats):
            tokens, seconds, counted = tokens + record.tokens, seconds + record.wall_s, counted + 1
            rows, kept = rows + len(record.drafts), kept + sum(record.accepted.values())
    return tokens / seconds, (kept + rows) / rows if rows else None


def measure_batches(model, draft, batches, rounds: int, ks=KS, steps: int | None = None) -> list[dict]:
    rows = []
    for batch in batches:
        rates: dict[int, list[float]] = {k: [] for k in (0, *ks)}
        gains: dict[int, list[float]] = {k: [] for k in ks}
        for round_ in range(rounds):
            for k in (0, *ks):  # paired: every k beside a run without, round after round, on the same requests
                rate, gain = decode_rate(model, draft, batch, k, round_, steps)
                rates[k].append(rate)
                if k:
                    gains[k].append(gain)
        row = {"batch": batch, "tokens_per_s": statistics.median(rates[0])}
        for k in ks:
            row[f"k{k}_tokens_per_s"] = statistics.median(rates[k])
            row[f"k{k}_speedup"] = statistics.median(s / p for s, p in zip(rates[k], rates[0]))
            row[f"k{k}_tokens_per_row"] = statistics.median(gains[k])
        rows.append(row)
    return rows


def measure_acceptance(model, draft, k: int = 4, users: int = 16) -> list[dict]:
    """Per task and drafter: the share of guesses kept, and what a verify row gained per step."""
    rows = []
    for task in tasks.TASKS:
        for drafter in ("model", "ngram"):
            trace = serve(model, crowd(users, seed=7, task=task), 8, k, drafter, draft if drafter == "model" else None)
            f = draft_figures(trace)
            rows.append({"task": task, "drafter": drafter, "k": k, "acceptance": f["draft_acceptance"],
                         "tokens_per_row": f["tokens_per_verify_row"]})  # fmt: skip
    return rows


def crossing(rows: list[dict], key: str) -> float | None:
    """The batch where a speedup column falls through 1, between the two measured batches around it
    (interpolated on a log scale); None when it never does."""
    for a, b in zip(rows, rows[1:]):
        if a[key] >= 1 > b[key]:
            frac = (a[key] - 1) / (a[key] - b[key])
            return a["batch"] * (b["batch"] / a["batch"]) ** frac
    return None if rows[0][key] >= 1 else float(rows[0]["batch"])


CONTEXT_HERE = 180  # tokens a measured row holds, mid-window: a 20-token prompt and about 160 of its countdown
CONTEXT_CARDS = 1024  # the cards' users: a chat turn's prompt and reply
CARDS = ("rtx-4090", "h100-sxm")
ALPHAS = (0.6, 0.7, 0.8, 0.9)


def predictions(model, draft, rows: list[dict], batches: list[int], machine=None, ks=KS) -> dict:
    """The cost model's speedup at each measured batch and its crossover, on this machine (the acceptance rate the
    runs measured, per k), and for Llama-3.1-8B drafted by Llama-3.2-1B on real cards (acceptance rate as input)."""
    from minillm.card.hardware import get_device, this_machine
    from minillm.card.modelspec import load_spec
    from minillm.card.speculation import (
        alpha_from_tokens,
        card_table,
        crossover,
        spec_of,
        speculation_cost,
        this_machine_pricing,
    )

    machine = machine or this_machine(progress=False)  # (calibrated once, then read from the cache)
    target, small = spec_of(model.cfg, "minillm"), spec_of(draft.cfg, "minillm-draft")
    out = {"context": CONTEXT_HERE, "alpha": {}, "speedup": {}, "crossover": {}, "machine": machine.label}
    for k in ks:
        alpha = alpha_from_tokens(statistics.median(r[f"k{k}_tokens_per_row"] for r in rows), k)
        pricing = this_machine_pricing(model, draft, k)
        out["alpha"][k] = alpha
        out["speedup"][k] = [speculation_cost(target, small, machine, b, k, alpha, CONTEXT_HERE, pricing).speedup
                             for b in batches]  # fmt: skip
        out["crossover"][k] = crossover(target, small, machine, k, alpha, CONTEXT_HERE, pricing, largest=1024)
    big, little = load_spec("llama-3.1-8b"), load_spec("llama-3.2-1b")
    cards = [get_device(name) for name in CARDS]
    out["cards"] = {"target": big.name, "draft": little.name, "context": CONTEXT_CARDS,
                    "rows": card_table(big, little, cards, KS, ALPHAS, CONTEXT_CARDS)}  # fmt: skip
    return out


def bench_speculation(model: Transformer, s) -> dict:
    draft = load_model(DRAFT_CHECKPOINT, next(model.parameters()).device)
    info = checkpoint_info(DRAFT_CHECKPOINT)
    batches = [1, 4, 16, 64] if s.quick else [1, 2, 4, 8, 16, 32, 64, 128]
    rows = measure_batches(model, draft, batches, rounds=1 if s.quick else 3)
    acceptance = measure_acceptance(model, draft)
    predicted = predictions(model, draft, rows, batches)
    measured = {k: crossing(rows, f"k{k}_speedup") for k in KS}
    within = [
        k
        for k in KS
        if measured[k] and predicted["crossover"][k] and 1 / 2 <= measured[k] / predicted["crossover"][k] <= 2
    ]
    speedup_1 = {k: rows[0][f"k{k}_speedup"] for k in KS}
    return {
        "rows": rows,
        "acceptance": acceptance,
        "draft": {
            "parameters": draft.num_parameters(),
            "train_seconds": info.get("train_seconds"),
            "heldout_accuracy": info.get("heldout_accuracy"),
            "config": info.get("config"),
        },  # fmt: skip
        "measured_crossover": measured,
        "predicted": predicted,
        "speedup_at_1": speedup_1,
        "goal_speedup_at_1": GOAL_SPEEDUP_AT_1,
        "goal_crossover_within": GOAL_CROSSOVER_WITHIN,
        "met": max(speedup_1.values()) >= GOAL_SPEEDUP_AT_1 and len(within) == len(KS),
    }
