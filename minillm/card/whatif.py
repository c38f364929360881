"""`python -m minillm whatif`: one model on one card, or split over several (tensor parallelism), in numbers.

`plan` answers the workshop's first question: how many users fit, and how fast is each? When the
answer is "they do not", it says so and prints no speed: a speed for weights that do not fit, or for
a context longer than the model was built for, would be a number about nothing.
With --tp N every number is one card's (tensor_parallel.py: each holds 1/N of the weights and of every user's KV),
plus what the cards send each other: the all-reduces' share of a step, at each tp, and the batches where it is most.
(`whatif --validate`, the check of the cost model on this machine, is validate.py.)
"""

from __future__ import annotations

from minillm.card import roofline
from minillm.card.experts import experts_line
from minillm.card.hardware import Device
from minillm.card.host_link import HOST_LINKS, host_link
from minillm.card.kv_layout import kv_lines
from minillm.card.model_bytes import kv_bytes_per_user, touched_weight_bytes
from minillm.card.modelspec import ModelSpec
from minillm.card.swap_cost import crossover, recompute_seconds, swap_seconds
from minillm.card.tensor_parallel import (
    dominated_batches,
    link_of,
    rank_spec,
    tp_choices,
    tp_decode,
    tp_step,
    where_they_dominate,
)
from minillm.errors import ConfigError

GiB = 2**30


def plan(spec: ModelSpec, device: Device, dtype="bf16", kv_dtype="bf16", context=4096, batch=1, tp=1, link=None
         ) -> dict:  # fmt: skip
    """Memory split, users that fit, and decode speed at `batch` users of `context` tokens each, on `tp` cards
    joined by `link` (a hardware.LINKS name; None: the card's own)."""
    if context < 1:
        raise ConfigError(f"--context must be at least 1 token, got {context}")
    if batch < 1:
        raise ConfigError(f"--batch must be at least 1, got {batch}")
    if spec.max_context and context > spec.max_context:
        raise ConfigError(
            f"--context {context:,} is longer than {spec.name} was built for: at most {spec.max_context:,} tokens "
            "(max_position_embeddings in its config.json)"
        )
    rank = rank_spec(spec, tp)  # one card's share (tp = 1: the model itself)
    if link is not None:
        link_of(device, link)  # a wrong --link is an error even on one card
    wire = link_of(device, link) if tp > 1 else None
    decode = lambda b, c: tp_decode(spec, device, b, c, dtype, kv_dtype, tp, wire)  # the prediction
    decode_at = lambda t: tp_decode(spec, device, batch, context, dtype, kv_dtype, t, wire)
    step = decode(batch, context)
    single = decode(1, context).time_s
    cost = roofline.decode_cost(rank, device, batch, context, dtype, kv_dtype)  # the bound, plus the collectives
    weights = roofline.weight_bytes(rank, dtype)
    weights_fit = roofline.free_kv_bytes(rank, device, dtype) > 0
    users = roofline.max_users(rank, device, context, dtype, kv_dtype)
    fitting = roofline.max_context(rank, device, batch, dtype, kv_dtype)
    fitting = min(fitting, spec.max_context) if spec.max_context else fitting
    shrunk = None  # too many users for this context: what they get at the context that does fit
    if batch > users and fitting > 0:
        shorter = decode(batch, fitting).time_s
        shrunk = {"context": fitting, "decode_step_s": shorter, "tokens_per_s": batch / shorter,
                  "per_user_tokens_per_s": 1 / shorter}  # fmt: skip
    speed = lambda value: value if weights_fit else None  # no speed for weights that do not fit
    chunk = tp_step(spec, device, [(roofline.RESERVE_TOKENS, 0)], dtype, kv_dtype, tp, wire)
    dominated = dominated_batches(spec, device, context, dtype, kv_dtype, tp, wire) if wire else None
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
        "memory_bytes": device.memory_bytes,  # one card's (so are the weights, the reserve and the KV below)
        "usable_bytes": device.memory_bytes * 0.9,
        "weight_bytes": weights,
        "activation_reserve_bytes": roofline.activation_reserve_bytes(rank, dtype),
        "kv_bytes_per_token": roofline.kv_bytes_per_token(rank, kv_dtype),
        "kv_bytes_per_user": kv_bytes_per_user(rank, context, kv_dtype),  # in whole blocks; windows kept short
        "free_kv_bytes": max(0.0, roofline.free_kv_bytes(rank, device, dtype)),
        "weights_fit": weights_fit,
        "max_users": users,
        "fits": batch <= users,
        "max_context_at_batch": fitting,
        "at_fitting_context": shrunk,
        "decode_step_s": speed(step.time_s),
        "tokens_per_s": speed(batch / step.time_s),
        "per_user_tokens_per_s": speed(1 / step.time_s),
        "single_user_tokens_per_s": speed(1 / single),
        "bound_step_s": speed(cost.time_s + step.comm_s),  # the roofline's step: no real engine is faster
        # one user, if only the weights moved: all but the embedding table, which a step looks up
        # (a mixture of experts: the experts one token picked)
        "bandwidth_ceiling_tokens_per_s": device.bandwidth / touched_weight_bytes(rank, dtype, 1),
        "active_params": spec.active_parameters,
        "why": why(spec, rank, dtype, kv_dtype, context, batch),
        "bound": cost.bound,
        "intensity": cost.intensity,
        "ridge_intensity": roofline.ridge_intensity(device, dtype),
        "ridge_batch": roofline.ridge_batch(rank, device, 0, dtype, kv_dtype),
        "efficiency": device.efficiency,
        # tensor parallelism (tp = 1: one card, nothing sent)
        "tp": tp,
        "link": wire.name if wire else None,
        "link_label": wire.label if wire else None,
        "total_weight_bytes": roofline.weight_bytes(spec, dtype),
        "allreduces_per_step": step.allreduces,
        "allreduce_bytes_per_step": step.allreduce_bytes,
        "comm_s": speed(step.comm_s),
        "comm_share": step.comm_share,
        # the same batch at every tp the model splits into, over the same link
        "comm_share_by_tp": {t: decode_at(t).comm_share for t in tp_choices(spec)} if wire else None,
        "comm_dominates": where_they_dominate(dominated) if wire else None,
        "prefill_chunk_comm_share": chunk.comm_share,  # one prompt chunk of RESERVE_TOKENS tokens
        "preempted": preempted(spec, device, batch, context, dtype, kv_dtype, tp) if weights_fit else None,
    }


def preempted(spec: ModelSpec, device: Device, batch: int, context: int, dtype: str, kv_dtype: str, tp: int):
    """A user of `context` tokens preempted from a step of `batch` users: its KV computed again or copied back from
    host memory (swap_cost.py); None on a card without a host link (its memory is the host's)."""
    if device.name not in HOST_LINKS:
        return None
    return {"link": host_link(device).label, "crossover_tokens": crossover(spec, device, batch, context, dtype,
                                                                           kv_dtype, tp),
            "recompute_s": recompute_seconds(spec, device, context, batch, context, dtype, kv_dtype, tp),
            "copy_s": swap_seconds(spec, device, context, kv_dtype, tp)}  # fmt: skip


def why(spec: ModelSpec, rank: ModelSpec, dtype: str, kv_dtype: str, context: int, batch: int) -> list[str]:
    """The lines that say why this model serves as it does: its experts, its latent KV, its windows (none for a
    dense model with plain grouped-query attention). The KV lines are the whole model's (a latent is whole on every
    card), the weights streamed one card's."""
    per_token = roofline.kv_bytes_per_token(spec, kv_dtype)
    lines = kv_lines(spec, context, per_token, kv_bytes_per_user(spec, context, kv_dtype), roofline.KV_BYTES[kv_dtype])
    if spec.latent and rank is not spec:
        lines[0] += "; every card keeps the whole latent (tensor parallelism splits the heads, not it)"
    if spec.experts:
        streamed, every = touched_weight_bytes(rank, dtype, batch), roofline.streamed_weight_bytes(rank, dtype)
        lines.insert(0, experts_line(spec, batch, streamed, every) + " on each card" * (rank is not spec))
    return lines


def n_users(n: int) -> str:
    return f"{n} user{'s' * (n != 1)}"


def summary(p: dict) -> str:
    gib = lambda b: f"{b / GiB:.1f} GiB"
    kv_tokens = int(p["free_kv_bytes"] // p["kv_bytes_per_token"])
    tp = p["tp"]
    cards = f"{tp} x {p['gpu_label']}, tensor-parallel over {p['link_label']}" if tp > 1 else p["gpu_label"]
    share = f" (1/{tp} of {gib(p['total_weight_bytes'])})" if tp > 1 else ""
    lines = [
        f"{p['model']} ({p['params'] / 1e9:.2f} B parameters) on {cards}",
        f"  weights {p['dtype']}, KV cache {p['kv_dtype']}",
        f"  memory    {'per card: ' * (tp > 1)}{gib(p['memory_bytes'])} x 0.9 = {gib(p['usable_bytes'])}: weights "
        f"{gib(p['weight_bytes'])}{share} + activations {gib(p['activation_reserve_bytes'])} + KV "
        f"{gib(p['free_kv_bytes'])} ({kv_tokens:,} tokens)",
    ]
    if not p["weights_fit"]:
        more = " or more cards (--tp)" if tp > 1 or p["total_weight_bytes"] > p["usable_bytes"] else ""
        lines.append(f"  the weights alone do not fit: pick a bigger card{more}, a smaller model or a smaller --dtype")
        return "\n".join(lines)
    # a user's KV at this context (sliding-window layers: their window only)
    per_user = p["kv_bytes_per_user"] if p["why"] else p["kv_bytes_per_token"] * p["context"]
    lines.append(
        f"  KV        {p['kv_bytes_per_token'] / 1024:.0f} KiB per token{' per card' * (tp > 1)}: "
        f"{per_user / 2**20:,.0f} MiB per user{' on each card' * (tp > 1)} at {p['context']} tokens of context"
    )
    lines.append(f"  users     {n_users(p['max_users'])} fit at {p['context']:,} tokens of context")
    if not p["fits"]:
        lines.append(
            f"            {n_users(p['batch'])} need {gib(per_user * p['batch'])} of KV{' per card' * (tp > 1)}: "
            "they do not fit; the speed below is what bandwidth would allow if they did"
        )
        if p["at_fitting_context"]:
            s = p["at_fitting_context"]
            lines.append(
                f"            {n_users(p['batch'])} fit at {s['context']:,} tokens each: "
                f"{s['decode_step_s'] * 1e3:.1f} ms per step, {s['tokens_per_s']:,.0f} tokens/s in total, "
                f"{s['per_user_tokens_per_s']:.1f} per user"
            )
    lines += [f"  {'why' if i == 0 else '':<9} {line}" for i, line in enumerate(p["why"])]
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
    if p.get("preempted"):
        lines.append(f"  preempted {preempted_line(p)}")
    if tp > 1:
        by_tp = ", ".join(f"tp {t}: {x:.0%}" for t, x in p["comm_share_by_tp"].items())
        lines += [
            f"  all-reduce {p['allreduces_per_step']} per step (2 per layer, 1 after the embedding) and a gather of "
            f"the logits: {p['allreduce_bytes_per_step'] / 2**20:,.1f} MiB sent by each card, "
            f"{p['comm_s'] * 1e3:.2f} ms of the {p['decode_step_s'] * 1e3:.1f} ms step ({p['comm_share']:.0%})",
            f"            share of a batch-{p['batch']} step by tp: {by_tp}",
            f"            over half the step {p['comm_dominates']} (decode at {p['context']:,} tokens); a "
            f"{roofline.RESERVE_TOKENS}-token prompt chunk: {p['prefill_chunk_comm_share']:.0%}",
        ]
    return "\n".join(lines)


def preempted_line(p: dict) -> str:
    """A user preempted from this plan's step: which way back is cheaper, and from how many tokens."""
    q, cross = p["preempted"], p["preempted"]["crossover_tokens"]
    rule = (f"recompute below {cross:,} tokens, copy back from host memory above" if cross and cross > 1 else
            "copy back from host memory" if cross else "recompute")  # fmt: skip
    return (
        f"{rule} ({q['link']}): at {p['context']:,} tokens, recompute {q['recompute_s'] * 1e3:.1f} ms in a "
        f"batch-{p['batch']} step, copy {q['copy_s'] * 1e3:.1f} ms"
    )
