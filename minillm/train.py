"""Train the tiny model on the synthetic tasks in tasks.py, and measure it.

Every reply ends with EOS, so the trained model really stops on its own: a request's
length is decided by the model, as in a real server, not by a counter.

Seeded and reproducible: the same TrainConfig gives the same batches and the same loss
curve on the same machine. The loss is taken on reply tokens (and EOS) only: the prompt
is given, not predicted.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from minillm import tasks
from minillm.checkpoint import STORAGE_DTYPE, save_checkpoint
from minillm.config import ModelConfig
from minillm.generate import generate
from minillm.model import Transformer
from minillm.tokenizer import EOS, PAD, encode, encode_prompt

IGNORE = -100  # cross_entropy skips targets with this id


@dataclass
class TrainConfig:
    steps: int = 3000
    tokens_per_batch: int = 4096  # padded tokens per optimizer step
    lr: float = 2e-3
    warmup_steps: int = 100
    weight_decay: float = 0.01
    seed: int = 0
    bf16: bool = True  # bfloat16 matmuls on CPUs that do them natively (AVX512-BF16 / AMX), ~2x faster; else float32
    task_weights: dict[str, float] = field(default_factory=lambda: {"countdown": 0.5, "spell": 0.5})


def make_batch(rng: random.Random, task: str, tokens_per_batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Examples of one task, padded to a shared length. Returns inputs, targets (B, T).

    Shapes come from a short fixed list (T a multiple of 64, B = tokens_per_batch // T): the first
    example sets T, later ones must fit in it. Few distinct shapes keep the CPU's bfloat16 kernels
    cached instead of rebuilt every step.
    """
    rows: list[tuple[list[int], int]] = []  # (full sequence, prompt length)
    width = 0
    while not rows or len(rows) < tokens_per_batch // width:
        prompt, reply = tasks.sample(task, rng, held_out=False)
        prompt_ids = encode_prompt(prompt)
        seq = prompt_ids + encode(reply) + [EOS]
        if not rows:
            width = -(-(len(seq) - 1) // 64) * 64  # round up to a multiple of 64
        if len(seq) - 1 <= width:
            rows.append((seq, len(prompt_ids)))
    inputs = torch.full((len(rows), width), PAD)
    targets = torch.full((len(rows), width), IGNORE)
    for i, (seq, prompt_len) in enumerate(rows):
        inputs[i, : len(seq) - 1] = torch.tensor(seq[:-1])
        targets[i, prompt_len - 1 : len(seq) - 1] = torch.tensor(seq[prompt_len:])  # reply + EOS
    return inputs, targets


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
    names, weights = list(cfg.task_weights), list(cfg.task_weights.values())
    # bfloat16 matmuls (weights and optimizer stay float32) where the CPU does them natively: ~2x faster
    use_bf16 = cfg.bf16 and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    start, losses = time.perf_counter(), []
    recent = dict.fromkeys(names, float("nan"))  # smoothed loss per task, for the progress bar
    bar = tqdm(range(cfg.steps), desc="training", disable=not progress)
    for step in bar:
        task = rng.choices(names, weights)[0]
        inputs, targets = make_batch(rng, task, cfg.tokens_per_batch)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_bf16):
            logits = model(inputs)  # (B, T, V)
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, cfg)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        recent[task] = loss.item() if math.isnan(recent[task]) else 0.9 * recent[task] + 0.1 * loss.item()
        if step % 10 == 0:
            bar.set_postfix({t: f"{v:.3f}" for t, v in recent.items()})
    stats = {"train_seconds": round(time.perf_counter() - start, 1), "final_loss": round(losses[-1], 5)}
    stats["bf16"] = use_bf16
    return model.eval(), stats | {"train_config": asdict(cfg)}


def distinct_held_out_prompts(task: str, rng: random.Random, count: int) -> list[str]:
    """Up to `count` different held-out prompts of `task` (fewer when the task has fewer: countdown has 17)."""
    prompts: dict[str, None] = {}  # an ordered set
    for _ in range(200 * count):
        prompts[tasks.sample(task, rng, held_out=True)[0]] = None
        if len(prompts) == count:
            break
    return list(prompts)


@torch.no_grad()
def evaluate(model: Transformer, per_task: int = 50, seed: int = 1234, progress: bool = True) -> dict[str, dict]:
    """Greedy exact-match accuracy per task on distinct held-out prompts the model never trained on."""
    rng = random.Random(seed)
    results = {}
    for task in tqdm(tasks.TASKS, desc="evaluating", disable=not progress):
        prompts = distinct_held_out_prompts(task, rng, per_task)
        correct = 0
        failures = []
        for prompt in prompts:
            out = generate(model, encode_prompt(prompt), max_new_tokens=600)
            reply = bytes(out.tokens).decode("utf-8", errors="replace")
            if out.finish_reason == "eos" and reply == tasks.solve(prompt):
                correct += 1
            elif len(failures) < 3:
                failures.append({"prompt": prompt, "reply": reply[:80]})
        results[task] = {"correct": correct, "total": len(prompts), "failures": failures}
    total = sum(r["correct"] for r in results.values()), sum(r["total"] for r in results.values())
    results["overall"] = {"correct": total[0], "total": total[1], "failures": []}
    return results


def format_accuracy(results: dict[str, dict]) -> str:
    lines = [f"{'task':<10}{'correct':>9}{'accuracy':>10}"]
    for task, r in results.items():
        lines.append(f"{task:<10}{r['correct']:>4}/{r['total']:<4}{r['correct'] / r['total']:>10.1%}")
    return "\n".join(lines)


def train_and_save(out: str | Path, cfg: TrainConfig | None = None, progress: bool = True) -> dict:
    model, stats = train(cfg, progress=progress)
    for p in model.parameters():  # measure what is shipped: the weights after the float16 round trip
        p.data = p.data.to(STORAGE_DTYPE).float()
    results = evaluate(model, progress=progress)
    accuracy = {task: r["correct"] / r["total"] for task, r in results.items()}
    save_checkpoint(model, out, extra=stats | {"heldout_accuracy": accuracy})
    return results
