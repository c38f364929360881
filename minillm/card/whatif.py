"""`python -m minillm whatif`: one model on one card, in numbers (roofline.py).

`plan` answers the workshop's first question: how many users fit, and how fast is each? When the
answer is "they do not", it says so and prints no speed: a speed for weights that do not fit, or for
a context longer than the model was built for, would be a number about nothing.
(`whatif --validate`, the check of the cost model on this machine, is validate.py.)
"""

from __future__ import annotations

from minillm.card import roofline
from minillm.card.enginecost import engine_decode
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
    if spec.max_context and context > spec.max_context:
        raise ConfigError(
            f"--context {context:,} is longer than {spec.name} was built for: at most {spec.max_context:,} tokens "
            "(max_position_embeddings in its config.json)"
        )
    cost = roofline.decode_cost(spec, device, batch, context, dtype, kv_dtype)  # the bound
    step = engine_decode(spec, device, batch, context, dtype, kv_dtype).time_s  # the prediction
    single = engine_decode(spec, device, 1, context, dtype, kv_dtype).time_s
    weights = roofline.weight_bytes(spec, dtype)
    weights_fit = roofline.free_kv_bytes(spec, device, dtype) > 0
    users = roofline.max_users(spec, device, context, dtype, kv_dtype)
    fitting = roofline.max_context(spec, device, batch, dtype, kv_dtype)
    fitting = min(fitting, spec.max_context) if spec.max_context else fitting
    shrunk = None  # too many users for this context: what they get at the context that does fit
    if batch > users and fitting > 0:
        shorter = engine_decode(spec, device, batch, fitting, dtype, kv_dtype).time_s
        shrunk = {"context": fitting, "decode_step_s": shorter, "tokens_per_s": batch / shorter,
                  "per_user_tokens_per_s": 1 / shorter}  # fmt: skip
    speed = lambda value: value if weights_fit else None  # no speed for weights that do not fit
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
        "weights_fit": weights_fit,
        "max_users": users,
        "fits": batch <= users,
        "max_context_at_batch": fitting,
        "at_fitting_context": shrunk,
        "decode_step_s": speed(step),
        "tokens_per_s": speed(batch / step),
        "per_user_tokens_per_s": speed(1 / step),
        "single_user_tokens_per_s": speed(1 / single),
        "bound_step_s": speed(cost.time_s),  # the roofline's step: no real engine is faster
        # one user, if only the weights moved: all but the embedding table, which a step looks up
        "bandwidth_ceiling_tokens_per_s": device.bandwidth / roofline.streamed_weight_bytes(spec, dtype),
        "bound": cost.bound,
        "intensity": cost.intensity,
        "ridge_intensity": roofline.ridge_intensity(device, dtype),
        "ridge_batch": roofline.ridge_batch(spec, device, 0, dtype, kv_dtype),
        "efficiency": device.efficiency,
    }


def n_users(n: int) -> str:
    return f"{n} user{'s' * (n != 1)}"


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
    lines.append(f"  users     {n_users(p['max_users'])} fit at {p['context']:,} tokens of context")
    if not p["fits"]:
        lines.append(
            f"            {n_users(p['batch'])} need {gib(per_user * p['batch'])} of KV: they do not fit; "
            "the speed below is what bandwidth would allow if they did"
        )
        if p["at_fitting_context"]:
            s = p["at_fitting_context"]
            lines.append(
                f"            {n_users(p['batch'])} fit at {s['context']:,} tokens each: "
                f"{s['decode_step_s'] * 1e3:.1f} ms per step, {s['tokens_per_s']:,.0f} tokens/s in total, "
                f"{s['per_user_tokens_per_s']:.1f} per user"
            )
    lines += [
        f"  decode    batch {p['batch']}: {p['decode_step_s'] * 1e3:.1f} ms per step -> "
        f"{p['tokens_per_s']:,.0f} tokens/s in total, {p['per_user_tokens_per_s']:.1f} per user",
        f"            one user alone: {p['single_user_tokens_per_s']:.1f} tokens/s (ceiling: bandwidth / streamed "
        f"weight bytes = {p['bandwidth_ceiling_tokens_per_s']:.1f}; the model assumes {p['efficiency']:.0%} of peak)",
        f"            the roofline's bound: {p['bound_step_s'] * 1e3:.1f} ms per step (no engine is faster; "
        "enginecost.py says why one is slower)",
        f"  bound     {p['bound']}: {p['intensity']:.1f} FLOPs per byte against the card's ridge of "
        f"{p['ridge_intensity']:.0f}" + (f" (compute-bound from about batch {p['ridge_batch']:.0f} at short context)"
                                          if p["ridge_batch"] else ""),
    ]  # fmt: skip
    return "\n".join(lines)
