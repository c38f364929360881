"""Speculative decoding beside batching: measured on this machine, predicted by the cost model.

speculation   tokens/s with and without speculation against the batch (1, 2, 4, ... users served at once) for
              k = 2, 4, 8 guesses a step with the shipped draft model; the acceptance rate per task (draft model
              and prompt lookup); where speculation stops paying, measured and predicted (card/speculation.py),
              here and for Llama-3.1-8B drafted by Llama-3.2-1B on an RTX 4090 and an H100.

Two crowds, one per task, because the draft guesses them differently well:
  countdowns  B users counting down from 100 to 152 (replies of 290-499 tokens): B users decode together for
              hundreds of steps, and the draft is right almost every time (speculation's best case)
  spellings   4 x B users spelling 5- and 6-digit numbers (replies of 25-35 tokens) on B seats: users leave and
              newcomers take their seats (prefill rows included), and the draft misses the first letters of words
tokens/s counts the steps in which all B seats were busy (up to the first seat left idle). Every configuration
runs the same requests; a run with each k sits beside a run without speculation, round after round, and each
figure is the median over the rounds (the machine is shared: a noisy round moves no median).
"""

from __future__ import annotations

import random
import statistics

from minillm.config import EngineConfig
from minillm.engine.request import Request
from minillm.engine.scheduler import ContinuousScheduler
from minillm.layers import LayeredEngine
from minillm.layers.drafters import DRAFT_CHECKPOINT, DRAFT_RETRAIN_HINT
from minillm.model.checkpoint import checkpoint_info, load_model
from minillm.model.tokenizer import encode_prompt
from minillm.model.transformer import Transformer
from minillm.runs.metrics import busy_seats, draft_figures
from minillm.training import tasks

KS = (2, 4, 8)
CROWDS = ("countdown", "spell")
CONTEXT = {"countdown": 180, "spell": 30}  # tokens a row holds, mid-window: a prompt and half a reply
NEWCOMERS = {"countdown": None, "spell": (14, 30)}  # (prompt, reply) tokens of a newcomer taking a seat: spell 123456
GOAL_SPEEDUP_AT_1 = 1.8  # tokens/s with speculation over without, one user counting down, the shipped draft, best k
GOAL_CROSSOVER_WITHIN = 2.0  # the measured crossover batch within this factor of the predicted one
CONTEXT_CARDS, CARDS, ALPHAS = 1024, ("rtx-4090", "h100-sxm"), (0.6, 0.7, 0.8, 0.9)


def users(task: str, batch: int, seed: int) -> list[Request]:
    """A crowd for `batch` seats: `batch` long countdowns, or 4 x `batch` spellings of 5-6 digits."""
    rng = random.Random(seed)
    if task == "countdown":
        prompts = [f"count down from {rng.randint(100, tasks.MAX_COUNT)}" for _ in range(batch)]
    else:
        prompts = [f"spell {rng.randint(10**4, 10**6 - 1)}" for _ in range(4 * batch)]
    return [Request(f"u{i}", encode_prompt(p), 600, prompt=p) for i, p in enumerate(prompts)]


def engine_for(model: Transformer, slots: int, k: int, drafter="model", draft=None) -> LayeredEngine:
    """Continuous batching with no token budget: a verify row of k + 1 tokens is never cut."""
    cfg = EngineConfig(slots=slots, speculate=k, drafter=drafter, record_blocks=False)
    return LayeredEngine(model, ContinuousScheduler(token_budget=0), cfg, draft=draft)


def full_batch_rate(model, draft, task: str, batch: int, k: int, seed: int, steps: int | None = None):
    """Output tokens / seconds over the steps in which all `batch` seats were busy (up to the first seat left idle,
    or `steps` such steps), and what a verify row gained per step (None without speculation)."""
    engine = engine_for(model, batch, k, draft=draft)
    for r in users(task, batch, seed):
        engine.submit(r)
    tokens = seconds = rows = kept = counted = 0
    while engine.has_work() and counted != steps:
        record = engine.step()
        if busy_seats(record) < batch:
            break
        tokens, seconds, counted = tokens + record.tokens, seconds + record.wall_s, counted + 1
        rows, kept = rows + len(record.drafts), kept + sum(record.accepted.values())
    return tokens / seconds, (kept + rows) / rows if rows else None


def measure_batches(model, draft, task: str, batches, rounds: int, ks=KS, steps: int | None = None) -> list[dict]:
    rows = []
    for batch in batches:
        rates: dict[int, list[float]] = {k: [] for k in (0, *ks)}
        gains: dict[int, list[float]] = {k: [] for k in ks}
        for round_ in range(rounds):
            for k in (0, *ks):  # paired: every k beside a run without, round after round, on the same requests
                rate, gain = full_batch_rate(model, draft, task, batch, k, round_, steps)
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


def measure_acceptance(model, draft, k: int = 4, batch: int = 8) -> list[dict]:
    """Per task and drafter: the share of guesses kept, and what a verify row gained per step."""
    rows = []
    for task in CROWDS:
        for drafter in ("model", "ngram"):
            engine = engine_for(model, batch, k, drafter, draft if drafter == "model" else None)
            for r in users(task, batch, seed=7):
                engine.submit(r)
            f = draft_figures(engine.run())
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


def agree(measured: float | None, predicted: int | None, largest: int, within: float = GOAL_CROSSOVER_WITHIN):
    """Measured and predicted crossovers within a factor of `within`; a crossover past the largest batch measured
    (None) agrees with a prediction of at least largest / within."""
    if measured is None:
        return predicted is None or predicted >= largest / within
    return predicted is not None and 1 / within <= measured / predicted <= within


def predictions(model, draft, measured: dict[str, list[dict]], batches, cal: dict | None = None, ks=KS) -> dict:
    """The cost model's speedup at each measured batch and its crossover, on this machine (op by op, with the
    acceptance the runs measured, per crowd and k), and for Llama-3.1-8B drafted by Llama-3.2-1B on real cards
    (the roofline, acceptance as an input)."""
    from minillm.card.calibrate import load_or_calibrate
    from minillm.card.hardware import get_device
    from minillm.card.modelspec import load_spec
    from minillm.card.speculation import ThisMachine, alpha_from_tokens, card_table, crossover

    here = ThisMachine(model, draft, cal or load_or_calibrate(next(model.parameters()).device.type, progress=False))
    out: dict = {"context": CONTEXT}
    for task, rows in measured.items():
        mine = out[task] = {"alpha": {}, "speedup": {}, "crossover": {}}  # keyed by str(k), as JSON reads them back
        for k in ks:
            alpha = alpha_from_tokens(statistics.median(r[f"k{k}_tokens_per_row"] for r in rows), k)
            cost = lambda batch, k=k, alpha=alpha, task=task: here.cost(batch, k, alpha, CONTEXT[task], NEWCOMERS[task])
            mine["alpha"][str(k)] = alpha
            mine["speedup"][str(k)] = [cost(b).speedup for b in batches]
            mine["crossover"][str(k)] = crossover(cost, largest=2048)
    big, little, cards = load_spec("llama-3.1-8b"), load_spec("llama-3.2-1b"), [get_device(c) for c in CARDS]
    out["cards"] = {"target": big.name, "draft": little.name, "context": CONTEXT_CARDS,
                    "rows": card_table(big, little, cards, KS, ALPHAS, CONTEXT_CARDS)}  # fmt: skip
    return out


def bench_speculation(model: Transformer, s) -> dict:
    draft = load_model(DRAFT_CHECKPOINT, next(model.parameters()).device, hint=DRAFT_RETRAIN_HINT)
    info = checkpoint_info(DRAFT_CHECKPOINT)
    batches = [1, 4, 16, 64] if s.quick else [1, 2, 4, 8, 16, 32, 64, 128]
    measured = {task: measure_batches(model, draft, task, batches, rounds=1 if s.quick else 3) for task in CROWDS}
    predicted = predictions(model, draft, measured, batches)
    crossovers = {task: {str(k): crossing(rows, f"k{k}_speedup") for k in KS} for task, rows in measured.items()}
    pairs = [(crossovers[t][str(k)], predicted[t]["crossover"][str(k)]) for t in CROWDS for k in KS]
    agreed = all(agree(measured_, predicted_, batches[-1]) for measured_, predicted_ in pairs)
    speedup_1 = {str(k): measured["countdown"][0][f"k{k}_speedup"] for k in KS}
    best = max(KS, key=lambda k: speedup_1[str(k)])  # k is the user's knob (vLLM's num_speculative_tokens)
    fast_enough = speedup_1[str(best)] >= GOAL_SPEEDUP_AT_1
    return {
        "batches": measured,
        "acceptance": measure_acceptance(model, draft),
        "draft": {
            "parameters": draft.num_parameters(),
            "train_seconds": info.get("train_seconds"),
            "heldout_accuracy": info.get("heldout_accuracy"),
            "config": info.get("config"),
        },  # fmt: skip
        "measured_crossover": crossovers,
        "predicted": predicted,
        "speedup_at_1": speedup_1,
        "goal_speedup_at_1": GOAL_SPEEDUP_AT_1,
        "goal_crossover_within": GOAL_CROSSOVER_WITHIN,
        "best_k_at_1": best,
        "met_speedup": fast_enough,
        "met_crossover": agreed,
        "met": fast_enough and agreed,
    }
