"""`python -m minillm whatif`: one model on one card, in numbers (roofline.py), and the check of those numbers here.

`plan` answers the workshop's first question: how many users fit, and how fast is each?
`validate` holds the cost model against this machine: it measures the machine with
microbenchmarks only (calibrate.py), predicts the shipped model's decode step from them, then
times the real step (bench.decode_step_time) and reports the error.
"""

from __future__ import annotations

import statistics

from minillm.card import roofline
from minillm.card.hardware import Device
from minillm.card.modelspec import ModelSpec
from minillm.errors import ConfigError

GiB = 2**30


def plan(spec: ModelSpec, device: Device, dtype="bf16", kv_dtype="bf16", context=4096, batch=1) -> dict:
    """Memory split, users that fit, and decode speed at `batch` users of `context` tokens each."""
    if context < 1:
        raise ConfigError(f"--context must be at least 1 token, got {context}")
    if batch < 1:
        raise ConfigError(f"--batch must be at least 1, got {batch}")
    cost = roofline.decode_cost(spec, device, batch, context, dtype, kv_dtype)
    single = roofline.decode_cost(spec, device, 1, context, dtype, kv_dtype)
    weights = roofline.weight_bytes(spec, dtype)
    users = roofline.max_users(spec, device, context, dtype, kv_dtype)
    fitting = roofline.max_context(spec, device, batch, dtype, kv_dtype)
    shrunk = None  # too many users for this context: what they get at the context that does fit
    if batch > users and fitting > 0:
        step = roofline.decode_cost(spec, device, batch, fitting, dtype, kv_dtype).time_s
        shrunk = {"context": fitting, "decode_step_s": step, "tokens_per_s": batch / step,
                  "per_user_tokens_per_s": 1 / step}  # fmt: skip
    return {
        "model": spec.name,
        "gpu": device.name,
        "gpu_label": device.label,
        "dtype": dtype,
        "kv_dtype": kv_dtype,
        "context": context,
        "batch": batch,
        "params": spec.num_parameters,
        "model_max_context": spec.max_context,
        "memory_bytes": device.memory_bytes,
        "usable_bytes": device.memory_bytes * 0.9,
        "weight_bytes": weights,
        "activation_reserve_bytes": roofline.activation_reserve_bytes(spec, dtype),
        "kv_bytes_per_token": roofline.kv_bytes_per_token(spec, kv_dtype),
        "free_kv_bytes": max(0.0, roofline.free_kv_bytes(spec, device, dtype)),
        "weights_fit": roofline.free_kv_bytes(spec, device, dtype) > 0,
        "max_users": users,
        "fits": batch <= users,
        "max_context_at_batch": fitting,
        "at_fitting_context": shrunk,
        "decode_step_s": cost.time_s,
        "tokens_per_s": batch / cost.time_s,
        "per_user_tokens_per_s": 1 / cost.time_s,
        "single_user_tokens_per_s": 1 / single.time_s,
        "bandwidth_ceiling_tokens_per_s": device.bandwidth / weights,  # one user, if only the weights moved
        "bound": cost.bound,
        "intensity": cost.intensity,
        "ridge_intensity": roofline.ridge_intensity(device, dtype),
        "ridge_batch": roofline.ridge_batch(spec, device, 0, dtype, kv_dtype),
        "efficiency": device.efficiency,
    }


def summary(p: dict) -> str:
    gib = lambda b: f"{b / GiB:.1f} GiB"
    kv_tokens = int(p["free_kv_bytes"] // p["kv_bytes_per_token"])
    lines = [
        f"{p['model']} ({p['params'] / 1e9:.2f} B parameters) on {p['gpu_label']}",
        f"  weights {p['dtype']}, KV cache {p['kv_dtype']}",
        f"  memory    {gib(p['memory_bytes'])} x 0.9 = {gib(p['usable_bytes'])}: weights {gib(p['weight_bytes'])}"
        f" + activations {gib(p['activation_reserve_bytes'])} + KV {gib(p['free_kv_bytes'])} ({kv_tokens:,} tokens)",
    ]
    if not p["weights_fit"]:
        lines.append("  the weights alone do not fit: pick a bigger card, a smaller model or a smaller --dtype")
        return "\n".join(lines)
    per_user = p["kv_bytes_per_token"] * p["context"]
    lines.append(
        f"  KV        {p['kv_bytes_per_token'] / 1024:.0f} KiB per token: {per_user / 2**20:,.0f} MiB per user "
        f"at {p['context']} tokens of context"
    )
    lines.append(f"  users     {p['max_users']} fit at {p['context']} tokens of context")
    if p["model_max_context"] and p["context"] > p["model_max_context"]:
        lines.append(f"            (the model itself was built for at most {p['model_max_context']} tokens)")
    if not p["fits"]:
        lines.append(
            f"            {p['batch']} users need {gib(per_user * p['batch'])} of KV: they do not fit; "
            "the speed below is what bandwidth would allow if they did"
        )
        if p["at_fitting_context"]:
            s = p["at_fitting_context"]
            lines.append(
                f"            {p['batch']} users fit at {s['context']} tokens each: {s['decode_step_s'] * 1e3:.1f} ms "
                f"per step, {s['tokens_per_s']:,.0f} tokens/s in total, {s['per_user_tokens_per_s']:.1f} per user"
            )
    lines += [
        f"  decode    batch {p['batch']}: {p['decode_step_s'] * 1e3:.1f} ms per step -> "
        f"{p['tokens_per_s']:,.0f} tokens/s in total, {p['per_user_tokens_per_s']:.1f} per user",
        f"            one user alone: {p['single_user_tokens_per_s']:.1f} tokens/s (ceiling: bandwidth / weight bytes "
        f"= {p['bandwidth_ceiling_tokens_per_s']:.1f}; the model assumes {p['efficiency']:.0%} of peak)",
        f"  bound     {p['bound']}: {p['intensity']:.1f} FLOPs per byte against the card's ridge of "
        f"{p['ridge_intensity']:.0f}" + (f" (compute-bound from about batch {p['ridge_batch']:.0f} at short context)"
                                          if p["ridge_batch"] else ""),
    ]  # fmt: skip
    return "\n".join(lines)


# --- validation on this machine -----------------------------------------------------------------------
def count_decode_ops(model, batch: int, context: int, block_size: int = 16) -> int:
    """Torch calls from Python in one paged decode step of `model` (counted, not timed): each pays the
    fixed cost per op that calibration measures. Attribute reads (.shape, .device) are free and not counted."""
    import torch

    from minillm.card.calibrate import count_torch_calls
    from minillm.engine.kv_cache import PagedKVCache

    device = next(model.parameters()).device
    cache = PagedKVCache(model.cfg, num_blocks=batch * -(-(context + 2) // block_size), block_size=block_size,
                         device=device)  # fmt: skip
    with torch.no_grad():
        prompt = torch.randint(0, 256, (1, context), device=device)
        for seat in range(batch):
            model(prompt, cache.prepare([seat], context), cache, last_only=True)
        tokens = torch.randint(0, 256, (batch, 1), device=device)
        return count_torch_calls(lambda: model(tokens, cache.prepare(list(range(batch)), 1), cache))


def predict_tiny_decode(spec, device: Device, batch: int, context: int, ops: int, repeats: int, block_size=16):
    """The cost model's time for one of bench.decode_step_time's steps on minillm's own forward:
    fp32 weights and KV; every op pays the fixed cost; the paged gather copies each row's KV
    (read the pool, write the copy, read it again: 3 passes) in whole blocks."""
    middle = context + 1 + repeats // 2  # the timed steps run at context + 1 ... context + repeats + 1
    gathered = -(-(middle + 1) // block_size) * block_size  # positions in the row's blocks, read whole
    kernels = roofline.Kernels(per_layer=0, per_step=ops, kv_passes=3)
    return roofline.step_cost(spec, device, [(1, gathered)] * batch, "fp32", "fp32", kernels)


def validate(
    device="auto", batches=(1, 4, 16, 64), contexts=(64, 512), repeats=15, rounds=3, progress=True, sizes=None
) -> dict:
    """Calibrate (microbenchmarks only), predict the shipped model's decode steps, measure them, compare.
    Each measurement is the median of `rounds` medians of `repeats` steps: other work on a shared
    machine shows up as outliers, which medians ignore."""
    from tqdm import tqdm

    from minillm.card.calibrate import calibrate
    from minillm.card.hardware import from_calibration
    from minillm.card.measure import decode_step_time
    from minillm.card.modelspec import load_spec
    from minillm.model.checkpoint import load_model

    cal = calibrate(device, sizes, progress=progress)
    machine = from_calibration(cal)
    model = load_model(device=device)
    spec = load_spec("minillm-tiny")
    grid = [(c, b) for c in contexts for b in batches]
    rows = []
    for context, batch in tqdm(grid, desc="decode steps", disable=not progress):
        ops = count_decode_ops(model, batch, context)
        cost = predict_tiny_decode(spec, machine, batch, context, ops, repeats)
        measured = statistics.median(decode_step_time(model, batch, context, "paged", repeats) for _ in range(rounds))
        rows.append({
            "batch": batch, "context": context, "ops": ops,
            "predicted_s": cost.time_s, "measured_s": measured, "error": cost.time_s / measured - 1,
            "overhead_s": cost.overhead_s, "memory_s": cost.memory_s, "compute_s": cost.compute_s,
        })  # fmt: skip
    return {
        "calibration": cal,
        "rows": rows,
        "median_abs_error": statistics.median(abs(r["error"]) for r in rows),
        "goal": 0.15,
    }


def validation_text(v: dict) -> str:
    from minillm.card.calibrate import describe

    lines = [
        f"calibration: {describe(v['calibration'])}",
        "",
        "batch  context   ops  predicted ms  measured ms   error   (fixed ops / memory / compute ms)",
    ]
    for r in v["rows"]:
        lines.append(
            f"{r['batch']:>5}  {r['context']:>7}  {r['ops']:>4}  {r['predicted_s'] * 1e3:>12.2f}  "
            f"{r['measured_s'] * 1e3:>11.2f}  {r['error']:>+6.0%}   "
            f"({r['overhead_s'] * 1e3:.2f} / {r['memory_s'] * 1e3:.2f} / {r['compute_s'] * 1e3:.2f})"
        )
    lines.append(f"median absolute error {v['median_abs_error']:.0%} (goal: at most {v['goal']:.0%})")
    return "\n".join(lines)
