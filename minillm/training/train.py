"""Train the tiny model on the synthetic tasks in tasks.py, and measure it.

Every reply ends with EOS, so the trained model really stops on its own: a request's
length is decided by the model, as in a real server, not by a counter.

Seeded and reproducible: the same TrainConfig gives the same batches and the same loss
curve on the same machine. The loss is taken on reply tokens (and EOS) only: the prompt
(and any preamble before it) is given, not predicted.

Exchanges are packed: a row of the full context holds one shared prefix (<bos>, and a preamble
if the row has one) and as many exchanges after it as fit. An attention mask lets each exchange
see only the prefix and itself, at the positions it would have alone: hardly a step is spent on
padding, and a preamble is computed once for every exchange after it.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from minillm.config import EngineConfig, ModelConfig
from minillm.engine.engine import Engine
from minillm.engine.request import Request
from minillm.engine.scheduler import ContinuousScheduler
from minillm.errors import ConfigError
from minillm.model.attention import attend
from minillm.model.checkpoint import STORAGE_DTYPE, save_checkpoint
from minillm.model.tokenizer import EOS, PAD, SEP, encode, encode_prompt
from minillm.model.transformer import Transformer
from minillm.training import tasks

IGNORE = -100  # cross_entropy skips targets with this id


@dataclass
class TrainConfig:
    steps: int = 1300
    tokens_per_batch: int = 4096  # tokens per optimizer step: rows of the full context, examples packed in
    lr: float = 2e-3
    warmup_steps: int = 100
    weight_decay: float = 0.01
    seed: int = 0
    bf16: bool = True  # bfloat16 matmuls on CPUs that do them natively (AVX512-BF16 / AMX), ~2x faster; else float32
    # per example: a spelling is ~30 tokens, a countdown ~180, so most examples are spellings, most tokens countdowns
    task_weights: dict[str, float] = field(default_factory=lambda: {"countdown": 0.3, "spell": 0.7})
    # per row of packed exchanges: a bare prompt, one of tasks.PREAMBLES before it, or random text before it
    preamble_weights: dict[str, float] = field(default_factory=lambda: {"none": 0.4, "fixed": 0.2, "random": 0.4})


def draw_exchange(rng: random.Random, cfg: TrainConfig) -> tuple[str, str]:
    """One (prompt, reply) of the training split, its task drawn by cfg.task_weights."""
    task = rng.choices(list(cfg.task_weights), list(cfg.task_weights.values()))[0]
    return tasks.sample(task, rng, held_out=False)


def packed_rows(rng: random.Random, cfg: TrainConfig, width: int) -> Iterator[tuple[list[int], ...]]:
    """Endless rows of at most `width` tokens, as lists (inputs, targets, positions, segments).

    A row is one shared prefix, <bos> [preamble <sep>], then as many exchanges `prompt <sep> reply`
    as fit. Each exchange sees the prefix and itself, at the positions it would have alone, so its
    loss is exactly that of <bos> [preamble <sep>] prompt <sep> reply <eos> on its own: the prefix
    is computed once for all of them, the saving a prefix cache makes when serving. The exchange
    that does not fit opens the next row (its preamble is drawn to fit it), so none is dropped.
    """
    prompt, reply = draw_exchange(rng, cfg)
    while True:
        kind = rng.choices(list(cfg.preamble_weights), list(cfg.preamble_weights.values()))[0]
        preamble = tasks.draw_preamble(rng, kind, prompt, width)  # one the waiting exchange fits after
        full = encode_prompt(prompt, preamble)
        prefix = full[: len(full) - len(encode(prompt)) - 1]  # <bos> [preamble <sep>]
        inputs, targets = list(prefix), [IGNORE] * len(prefix)  # the prefix is given, not predicted
        positions, segments = list(range(len(prefix))), [0] * len(prefix)  # segment 0: the shared prefix
        while True:
            if not tasks.fits(prompt, preamble, width):  # it can never follow this preamble: draw another
                prompt, reply = draw_exchange(rng, cfg)
                continue
            own = encode(prompt) + [SEP] + encode(reply)  # its EOS is only a target, never an input
            if len(inputs) + len(own) > width:
                break
            inputs += own
            targets += [IGNORE] * len(encode(prompt)) + encode(reply) + [EOS]  # predict reply + EOS only
            positions += range(len(prefix), len(prefix) + len(own))
            segments += [segments[-1] + 1] * len(own)
            prompt, reply = draw_exchange(rng, cfg)
        yield inputs, targets, positions, segments


class PackedRows:
    """Stands where a KV cache would in `model(tokens, positions, cache)`: it stores nothing, it only masks
    attention so that each exchange of a row sees its row's shared prefix and itself, nothing else.

    segments (B, T): 0 for the shared prefix, 1, 2, ... for the exchanges, -1 for padding.
    """

    def __init__(self, segments: torch.Tensor):
        T = segments.shape[1]
        causal = torch.ones(T, T, dtype=torch.bool).tril()  # (T, T)
        same = segments[:, :, None] == segments[:, None, :]  # (B, T, T)
        self.mask = causal & (same | (segments[:, None, :] == 0))  # (B, T, T) True = may look

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attend(q, k, v, self.mask)


def packed_batches(rng: random.Random, cfg: TrainConfig, width: int) -> Iterator[tuple[torch.Tensor, ...]]:
    """Endless batches (inputs, targets, positions, segments), each (tokens_per_batch // width, width).

    Padding each example to the longest of its batch spent more than half of every step on PAD,
    and a preamble per example would spend most of the rest on preambles: packed rows avoid both.
    One shape for every step also keeps the CPU's bfloat16 kernels cached.
    """
    rows = packed_rows(rng, cfg, width)
    n_rows = max(1, cfg.tokens_per_batch // width)
    while True:
        batch = [torch.full((n_rows, width), fill) for fill in (PAD, IGNORE, 0, -1)]
        for r in range(n_rows):
            for tensor, values in zip(batch, next(rows)):
                tensor[r, : len(values)] = torch.tensor(values)
        yield tuple(batch)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(
    cfg: TrainConfig | None = None, model_cfg: ModelConfig | None = None, progress: bool = True
) -> tuple[Transformer, dict]:
    cfg, model_cfg = cfg or TrainConfig(), model_cfg or ModelConfig()
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    model = Transformer(model_cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    batches = packed_batches(rng, cfg, model_cfg.max_seq_len)
    # bfloat16 matmuls (weights and optimizer stay float32) where the CPU does them natively: ~2x faster
    use_bf16 = cfg.bf16 and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    start, losses, filled = time.perf_counter(), [], 0.0
    bar = tqdm(range(cfg.steps), desc="training", disable=not progress)
    for step in bar:
        inputs, targets, positions, segments = next(batches)
        filled += (inputs != PAD).float().mean().item() / cfg.steps
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_bf16):
            logits = model(inputs, positions, PackedRows(segments))  # (B, T, V)
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, cfg)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if step % 10 == 0:
            bar.set_postfix(loss=f"{sum(losses[-50:]) / len(losses[-50:]):.3f}")
    stats = {"train_seconds": round(time.perf_counter() - start, 1), "final_loss": round(losses[-1], 5)}
    stats |= {"bf16": use_bf16, "packed_fill": round(filled, 3)}  # fraction of batch tokens that are not PAD
    return model.eval(), stats | {"train_config": asdict(cfg)}


def distinct_held_out_prompts(task: str, rng: random.Random, count: int) -> list[str]:
    """Up to `count` different held-out prompts of `task` (fewer when the task has fewer: countdown has 17)."""
    prompts: dict[str, None] = {}  # an ordered set
    for _ in range(200 * count):
        prompts[tasks.sample(task, rng, held_out=True)[0]] = None
        if len(prompts) == count:
            break
    return list(prompts)


EVAL_RANDOM_PREAMBLE_BYTES = (100, 600)  # unseen random preambles at evaluation, as long as the fixed ones


def eval_preamble(name: str, prompt: str, rng: random.Random) -> str | None:
    """The preamble evaluation puts before `prompt`: none, a fixed one by name, or fresh random text."""
    if name == "none":
        return None
    if name == "random":
        room = tasks.CONTEXT - tasks.sequence_length(prompt) - 1
        return tasks.random_preamble(rng, min(room, rng.randint(*EVAL_RANDOM_PREAMBLE_BYTES)))
    return tasks.PREAMBLES[name]


@torch.no_grad()
def evaluate(
    model: Transformer,
    per_task: int = 50,
    seed: int = 1234,
    progress: bool = True,
    preambles: list[str] | None = None,
) -> dict[str, dict[str, dict]]:
    """Greedy exact-match accuracy on distinct held-out prompts the model never trained on, per preamble and task.

    preambles: "none" (the bare prompt), names of tasks.PREAMBLES, "random" (for each prompt fresh random
    text of 100-600 bytes, never seen in training); default all of them. The same held-out prompts go after
    every preamble, except countdowns too long to fit the context after it (see tasks.longest_countdown).
    Returns {preamble: {task: {"correct", "total", "failures"}, "overall": {...}}}.
    """
    preambles = preambles or ["none", *tasks.PREAMBLES, "random"]
    unknown = [name for name in preambles if name not in ("none", "random", *tasks.PREAMBLES)]
    if unknown:
        raise ConfigError(f"unknown preambles {unknown}; choose from none, random, {', '.join(tasks.PREAMBLES)}")
    rng = random.Random(seed)
    prompts = {task: distinct_held_out_prompts(task, rng, per_task) for task in tasks.TASKS}
    preamble_rng = random.Random(seed + 1)  # its own stream: the held-out prompts stay what they always were
    asked = {name: {task: [] for task in prompts} for name in preambles}  # name -> task -> [(prompt, its ids)]
    for name in preambles:
        for task, task_prompts in prompts.items():
            for prompt in task_prompts:
                preamble = eval_preamble(name, prompt, preamble_rng)
                if tasks.fits(prompt, preamble):
                    asked[name][task].append((prompt, encode_prompt(prompt, preamble)))
    every = [ids for per_task in asked.values() for pairs in per_task.values() for _, ids in pairs]
    replies = iter(greedy_replies(model, every, progress))
    results: dict[str, dict[str, dict]] = {}
    for name, per_task in asked.items():
        results[name] = {}
        for task, pairs in per_task.items():
            correct, failures = 0, []
            for prompt, _ in pairs:
                tokens, reason = next(replies)
                reply = bytes(tokens).decode("utf-8", errors="replace")
                if reason == "eos" and reply == tasks.solve(prompt):
                    correct += 1
                elif len(failures) < 3:
                    failures.append({"prompt": prompt, "reply": reply[:80]})
            results[name][task] = {"correct": correct, "total": len(pairs), "failures": failures}
        rows = list(results[name].values())
        overall = sum(r["correct"] for r in rows), sum(r["total"] for r in rows)
        results[name]["overall"] = {"correct": overall[0], "total": overall[1], "failures": []}
    return results


def greedy_replies(model: Transformer, prompts: list[list[int]], progress: bool = False) -> list[tuple[list, str]]:
    """Each prompt's greedy reply (until EOS, at most 600 tokens or the context) and why it ended, all served at once
    by the engine (continuous batching: the same tokens as one at a time, in a fraction of the time)."""
    seats = max(1, min(32, len(prompts)))
    engine = Engine(model, ContinuousScheduler(), EngineConfig(slots=seats, max_len=tasks.CONTEXT))
    requests = [Request(f"e{i}", ids, min(600, tasks.CONTEXT - len(ids))) for i, ids in enumerate(prompts)]
    for request in requests:
        engine.submit(request)
    engine.run(progress=progress)
    return [(r.output_ids, r.finish_reason) for r in requests]


def preamble_label(name: str) -> str:
    if name == "none":
        return "no preamble"
    if name == "random":
        return "random, unseen ({}-{} B)".format(*EVAL_RANDOM_PREAMBLE_BYTES)
    return f"{name} ({len(tasks.PREAMBLES[name].encode())} B)"


def format_accuracy(results: dict[str, dict[str, dict]]) -> str:
    """A table: one row per preamble (and the fixed ones together), one column per task: correct/total, %."""
    rows = []
    fixed = [name for name in results if name in tasks.PREAMBLES]
    for name, per_task in results.items():
        rows.append((preamble_label(name), per_task))
        if len(fixed) > 1 and name == fixed[-1]:
            together = {t: {k: sum(results[f][t][k] for f in fixed) for k in ("correct", "total")} for t in per_task}
            rows.append((f"the {len(fixed)} fixed together", together))
    lines = [f"{'preamble':<28}" + "".join(f"{task:>18}" for task in rows[0][1])]
    for label, per_task in rows:
        cells = [
            f"{r['correct']:>7}/{r['total']:<3}{r['correct'] / max(1, r['total']):>7.1%}" for r in per_task.values()
        ]
        lines.append(f"{label:<28}" + "".join(cells))
    return "\n".join(lines)


def train_and_save(out: str | Path, cfg: TrainConfig | None = None, progress: bool = True,
                   model_cfg: ModelConfig | None = None) -> dict:  # fmt: skip
    model, stats = train(cfg, model_cfg, progress=progress)
    for p in model.parameters():  # measure what is shipped: the weights after the float16 round trip
        p.data = p.data.to(STORAGE_DTYPE).float()
    results = evaluate(model, progress=progress)
    accuracy = {name: {task: r["correct"] / r["total"] for task, r in rows.items()} for name, rows in results.items()}
    save_checkpoint(model, out, extra=stats | {"heldout_accuracy": accuracy})
    return results
