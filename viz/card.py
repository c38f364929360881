"""One model on one card in pictures: where the memory goes, how many users fit, how fast they go.

The numbers are roofline.py's (through whatif.plan, the `whatif` command's answer); these functions
only lay them out, for the app's what-if view and for lesson 07. Each has a data half (plain arrays,
tested) and a plotting half (a matplotlib Figure).
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.text import Text
from matplotlib.ticker import NullFormatter

from minillm.card import roofline
from minillm.card.hardware import Device
from minillm.card.modelspec import ModelSpec
from minillm.card.tensor_parallel import rank_spec, tp_decode

GiB = 2**30
BLOCK = 16  # tokens per KV block, roofline's default: users are counted in whole blocks
MEMORY_COLORS = {
    "weights": "#0072b2",
    "activation reserve": "#e69f00",
    "KV cache": "#009e73",
    "KV room left": "#a8dcc6",
    "unused": "#d9d9d9",
}


def memory_split(plan: dict) -> list[tuple[str, float]]:
    """The card's memory in parts that add up to it (GiB-agnostic bytes), from whatif.plan (split over tp cards:
    one card's, each holding 1/tp of the weights and of every user's KV):
    weights; the activation reserve; the KV cache of the users that fit at the plan's context;
    KV room left (less than one more user); unused (1 - utilization: the CUDA context, the
    allocator's slack). When the weights alone do not fit, the parts add up to more than the card."""
    memory, usable = plan["memory_bytes"], plan["usable_bytes"]
    per_user = plan["kv_bytes_per_user"]  # (whole blocks; a sliding-window layer keeps only its window)
    kv = min(plan["free_kv_bytes"], plan["max_users"] * per_user)
    room = plan["free_kv_bytes"] - kv
    return [
        ("weights", plan["weight_bytes"]),
        ("activation reserve", plan["activation_reserve_bytes"]),
        ("KV cache", kv),
        ("KV room left", room),
        ("unused", max(0.0, memory - max(usable, plan["weight_bytes"] + plan["activation_reserve_bytes"]))),
    ]


def plot_memory_split(plan: dict, ax=None) -> Figure:
    """One horizontal bar: the card's memory and what fills it."""
    if ax is None:
        ax = Figure(figsize=(10, 2.2), layout="constrained").add_subplot()
    parts, memory = memory_split(plan), plan["memory_bytes"]
    left = 0.0
    for name, size in parts:
        if size <= 0:
            continue
        ax.barh(0, size / GiB, left=left / GiB, color=MEMORY_COLORS[name], edgecolor="white",
                label=f"{name} {size / GiB:.1f} GiB")  # fmt: skip
        if size / max(memory, 1) > 0.07:  # room for the number inside the bar
            ax.text((left + size / 2) / GiB, 0, f"{size / GiB:.1f}", ha="center", va="center", color="white",
                    fontsize=11, fontweight="bold")  # fmt: skip
        left += size
    ax.axvline(memory / GiB, color="black", linewidth=2)
    ax.set_xlim(0, max(memory, left) / GiB * 1.01)
    ax.set_yticks([])
    ax.set_xlabel("GiB")
    users = f"{plan['max_users']} users fit at {plan['context']:,} tokens each"
    if not plan["weights_fit"]:
        users = "the weights alone do not fit"
    cards = f"on {plan['gpu']}" if plan.get("tp", 1) == 1 else f"1/{plan['tp']} on each {plan['gpu']}"
    ax.set_title(f"{plan['model']} ({plan['dtype']} weights, {plan['kv_dtype']} KV) {cards}: {users}",
                 loc="left", fontsize=11)  # fmt: skip
    ncol = 5 if ax.figure.get_figwidth() >= 9 else 3  # a narrow figure: the legend in two rows
    if ax.get_subplotspec() is not None and len(ax.figure.axes) == 1:  # a figure of its own: the legend beside the
        # bar (under it, it fell below the first screen of the what-if view at 1280x720)
        ax.figure.legend(loc="outside right center", ncol=1, frameon=False, fontsize=9)
    else:
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.4), ncol=ncol, frameon=False, fontsize=9)
    return ax.figure


def context_grid(chosen: int, longest: int = 131072) -> np.ndarray:
    """Contexts from 256 tokens to `longest` by powers of two, plus the chosen one."""
    powers = 2 ** np.arange(8, int(np.log2(max(longest, 512))) + 1)
    return np.unique(np.append(powers, chosen))


def users_by_context(spec: ModelSpec, device: Device, contexts, dtype="bf16", kv_dtype="bf16") -> np.ndarray:
    """Users that fit at each context (the KV ceiling)."""
    return np.array([roofline.max_users(spec, device, int(c), dtype, kv_dtype) for c in contexts])


def plot_users_by_context(spec, device, context: int, dtype="bf16", kv_dtype="bf16", ax=None) -> Figure:
    """Users that fit against context length: halve the context, double the users."""
    if ax is None:
        ax = Figure(figsize=(6, 3.6), layout="constrained").add_subplot()
    contexts = context_grid(context, max(spec.max_context or 0, 2 * context, 32768))
    users = users_by_context(spec, device, contexts, dtype, kv_dtype)
    some = users > 0  # (a log axis has no 0: contexts where not even one user fits are left out)
    ax.plot(contexts[some], users[some], marker="o", markersize=3, color=MEMORY_COLORS["KV cache"])
    here = roofline.max_users(spec, device, context, dtype, kv_dtype)
    if here:
        ax.plot([context], [here], marker="o", markersize=9, color="black")
        ax.annotate(f"{here} users at {context:,}", (context, here), textcoords="offset points", xytext=(8, 8),
                    fontsize=10)  # fmt: skip
    else:
        ax.axvline(context, color="black", linewidth=1.5)
        ax.text(context, 0.5, f" not one user fits at {context:,}", fontsize=10, transform=ax.get_xaxis_transform())
    if spec.max_context:
        ax.axvline(spec.max_context, color="#999999", linestyle=":", linewidth=1)
    _log_axes(ax, tokens=True)
    ax.set_xlim(contexts[0] / 1.3, contexts[-1] * 1.3)
    ax.set_ylim(0.7, max(users.max(), 1) * 1.6)
    ax.set_xlabel("context per user (tokens)")
    ax.set_ylabel("users that fit")
    ax.set_title("The KV ceiling", loc="left", fontsize=11)
    ax.grid(alpha=0.3)
    return ax.figure


def batch_grid(largest: int = 1024) -> np.ndarray:
    return np.unique(np.geomspace(1, largest, 60).round().astype(int))


def speed_by_batch(spec, device, context: int, batches, dtype="bf16", kv_dtype="bf16", tp: int = 1, link=None
                   ) -> dict[str, np.ndarray]:  # fmt: skip
    """Decode speed at each batch (every user holding `context` tokens): step time, tokens/s in total and
    per user, and which bound applies. Over tp cards joined by `link`: one card's share of the step, plus the
    all-reduces between them (tensor_parallel.py), as whatif.plan's bound_step_s."""
    rank = rank_spec(spec, tp)
    costs = [roofline.decode_cost(rank, device, int(b), context, dtype, kv_dtype) for b in batches]
    comm = [tp_decode(spec, device, int(b), context, dtype, kv_dtype, tp, link).comm_s if tp > 1 else 0.0
            for b in batches]  # fmt: skip
    step = np.array([c.time_s for c in costs]) + np.array(comm)
    batches = np.asarray(batches)
    return {
        "batch": batches,
        "step_s": step,
        "total": batches / step,
        "per_user": 1 / step,
        "compute_bound": np.array([c.bound == "compute" for c in costs]),
    }


def plot_speed_by_batch(spec, device, context: int, dtype="bf16", kv_dtype="bf16", ax=None, tp: int = 1,
                        link=None) -> Figure:  # fmt: skip
    """Total and per-user tokens/s against batch: flat per user (memory-bound, batching is nearly free)
    until the ridge, where the step turns compute-bound; beyond the KV ceiling the users do not fit.
    tp cards joined by `link`: speed_by_batch's (the ridge and the ceiling are one card's, on its share)."""
    if ax is None:
        ax = Figure(figsize=(6, 3.6), layout="constrained").add_subplot()
    speed = speed_by_batch(spec, device, context, batch_grid(), dtype, kv_dtype, tp, link)
    spec = rank_spec(spec, tp)
    ax.plot(speed["batch"], speed["total"], color="#0072b2", linewidth=2, label="total tokens/s")
    ax.plot(speed["batch"], speed["per_user"], color="#d55e00", linewidth=2, linestyle="--", label="per user")
    _log_axes(ax)
    # The ridge and the KV ceiling are named in the legend, not written on the chart: words beside a line
    # end up over a curve at some model, card or context.
    ridge = roofline.ridge_batch(spec, device, context, dtype, kv_dtype)
    short = roofline.ridge_batch(spec, device, 0, dtype, kv_dtype)
    if ridge:
        ax.axvline(ridge, color="black", linestyle=":", linewidth=1.5, label=f"ridge: batch {ridge:.0f}")
    elif short:
        ax.axvline(short, color="#777777", linestyle=":", linewidth=1.5,
                   label=f"ridge at short context: batch {short:.0f}")  # fmt: skip
    fit = roofline.max_users(spec, device, context, dtype, kv_dtype)
    if fit < speed["batch"][-1]:
        ax.axvspan(max(fit + 0.5, 0.8), speed["batch"][-1], color="#eeeeee", zorder=0,
                   label=f"over {fit} users: KV full")  # fmt: skip
    ax.set_xlabel(f"batch (users decoding together, {context:,} tokens each)")
    ax.set_ylabel("tokens/s")
    bound = "memory-bound at every batch" if not ridge else f"compute-bound from batch {ridge:.0f}"
    ax.set_title(f"Decode speed: {bound}", loc="left", fontsize=11)
    ax.legend(frameon=True, framealpha=0.9, edgecolor="none", fontsize=9, loc="best")
    ax.grid(alpha=0.3)
    return ax.figure


def plot_comm_share_by_tp(plan: dict, ax=None) -> Figure:
    """The all-reduces' share of a decode step at each tp the model splits into (whatif.plan's comm_share_by_tp:
    the plan's batch and context, over its link), the plan's tp in black, and the half-step line."""
    if ax is None:
        ax = Figure(figsize=(4.8, 2.88), layout="constrained").add_subplot()
    tps, shares = list(plan["comm_share_by_tp"]), list(plan["comm_share_by_tp"].values())
    colors = ["black" if t == plan["tp"] else MEMORY_COLORS["weights"] for t in tps]
    bars = ax.bar([str(t) for t in tps], shares, color=colors)
    ax.bar_label(bars, [f"{v:.0%}" for v in shares], fontsize=10)
    ax.axhline(0.5, color="#d55e00", linestyle="--", linewidth=1.5, label="half the step")
    ax.set_ylim(0, max(0.6, max(shares) * 1.2))
    ax.yaxis.set_major_formatter(lambda v, _: f"{v:.0%}")
    ax.set_xlabel("cards (tp)")
    ax.set_ylabel("all-reduce share")
    ax.set_title(f"All-reduces per decode step, batch {plan['batch']:,}", loc="left", fontsize=11)
    ax.legend(frameon=False, fontsize=9, loc="upper left")
    ax.grid(alpha=0.3, axis="y")
    return ax.figure


def _plain(value: float, tokens: bool = False) -> str:
    if tokens and value >= 1024:
        return f"{value / 1024:g}k"
    return f"{value:g}"


def _log_axes(ax, tokens: bool = False) -> None:
    """Log axes labelled with plain numbers (a room reads "64", not "2^6"); token counts as 4k, 32k."""
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(lambda v, _: _plain(v, tokens))
    ax.yaxis.set_major_formatter(lambda v, _: _plain(v))
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_minor_formatter(NullFormatter())


def smallest_text_pt(fig: Figure) -> float:
    """The smallest lettering on a drawn figure (ticks, legend, labels, annotations), in points: at `dpi` it is
    pt x dpi / 72 pixels of the PNG, and the browser scales those by the width it shows the picture at."""
    fig.canvas.draw()  # (tick labels exist once drawn)
    sizes = [t.get_fontsize() for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    return min(sizes, default=0.0)
