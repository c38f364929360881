"""The roofline drawn as a roofline: the FLOP/s a step attains against its arithmetic intensity, both axes log.

A card's roof has two parts: the bandwidth slope (FLOP/s = intensity x bytes/s: the step waits on memory) and
the compute roof (the dense peak: it waits on the multipliers). They meet at the ridge, peak / bandwidth FLOPs
per byte. A decode step is a dot at (its FLOPs / its bytes, its FLOPs / its time). Each user adds FLOPs but
hardly any bytes (the weights are read once for all of them), so as the batch grows the dots walk up the slope
toward the corner; a long context adds bytes per user (its KV cache) and the memory fills before the corner.
The numbers are roofline.py's; this file only lays them out (lesson 07).
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from minillm.card import roofline
from minillm.card.hardware import Device
from minillm.card.modelspec import ModelSpec

TERA = 1e12
SLOPE, ROOF, DOTS, CEILING = "#0072b2", "#d55e00", "#009e73", "#cc79a7"
INTENSITY_RANGE = (0.5, 2000.0)  # FLOPs per byte: one user of a bf16 model sits at 1, the ridges at 30-400


def roof(device: Device, intensity, dtype: str = "bf16") -> np.ndarray:
    """FLOP/s the card allows at each intensity: the lower of the bandwidth slope and the compute roof."""
    peak = device.peak_flops(roofline.compute_dtype(dtype, device))
    return np.minimum(np.asarray(intensity, dtype=float) * device.bandwidth, peak)


def decode_dots(spec: ModelSpec, device: Device, context: int, batches, dtype="bf16", kv_dtype="bf16") -> dict:
    """Decode steps of `batches` users holding `context` tokens each, as the roofline sees them: intensity,
    the FLOP/s the cost model's step time gives (kernels at the card's efficiency, launches included), and
    whether that many users fit in memory (the KV ceiling)."""
    batches = np.asarray(batches, dtype=int)
    costs = [roofline.decode_cost(spec, device, int(b), context, dtype, kv_dtype) for b in batches]
    fit = roofline.max_users(spec, device, context, dtype, kv_dtype)
    return {
        "batch": batches,
        "intensity": np.array([c.intensity for c in costs]),
        "flops_per_s": np.array([c.flops / c.time_s for c in costs]),
        "fits": batches <= fit,
    }


def plot_roofline(spec: ModelSpec, device: Device, context=128, long_context=4096, batches=(1, 4, 16, 64, 256, 1024),
                  dtype="bf16", kv_dtype="bf16", ax=None, title: str | None = None) -> Figure:  # fmt: skip
    """The card's roof, its ridge, the decode batches that fit at `context` tokens each as labelled dots, and
    the most users that fit at `long_context` tokens each (the KV ceiling) as one open square."""
    if ax is None:
        ax = Figure(figsize=(6.5, 4.4), layout="constrained").add_subplot()
    compute = roofline.compute_dtype(dtype, device)
    peak, ridge = device.peak_flops(compute), roofline.ridge_intensity(device, dtype)
    slope_x = np.array([INTENSITY_RANGE[0], ridge])
    ax.plot(slope_x, slope_x * device.bandwidth / TERA, color=SLOPE, lw=2.5,
            label=f"memory: {device.bandwidth / 1e9:,.0f} GB/s x intensity")  # fmt: skip
    ax.plot([ridge, INTENSITY_RANGE[1]], [peak / TERA] * 2, color=ROOF, lw=2.5,
            label=f"compute: {peak / TERA:,.0f} dense {compute} TFLOP/s")  # fmt: skip
    ax.axvline(ridge, color="#777777", ls=":", lw=1)
    # left of the line, at the bottom: under the slope, where nothing else is drawn (to its right the text
    # would run off a card whose ridge sits near the axis's end)
    ax.text(ridge, 0.03, f"ridge: {ridge:.0f} FLOPs/byte ", ha="right", fontsize=9, color="#555555",
            transform=ax.get_xaxis_transform())  # fmt: skip

    dots = decode_dots(spec, device, context, batches, dtype, kv_dtype)
    fits = dots["fits"]
    ax.plot(dots["intensity"][fits], dots["flops_per_s"][fits] / TERA, "o", color=DOTS, markersize=7,
            label=f"decode steps, {context:,} tokens each (users)")  # fmt: skip
    for b, x, y in zip(dots["batch"][fits], dots["intensity"][fits], dots["flops_per_s"][fits]):
        # On the slope, above-left of the dot is empty (the slope runs up to the right); past the ridge the roof
        # is flat above the dot, and below-right of it is empty.
        left = x < ridge
        ax.annotate(f"{b}", (x, y / TERA), textcoords="offset points", xytext=(-5, 5) if left else (5, -5),
                    ha="right" if left else "left", va="bottom" if left else "top", fontsize=9, color=DOTS)  # fmt: skip

    users = roofline.max_users(spec, device, long_context, dtype, kv_dtype) if long_context else 0
    if users:
        full = decode_dots(spec, device, long_context, [users], dtype, kv_dtype)
        x, y = full["intensity"][0], full["flops_per_s"][0] / TERA
        ax.plot([x], [y], "s", mfc="none", mec=CEILING, mew=2, markersize=9,
                label=f"{long_context:,} tokens each: the most users that fit")  # fmt: skip
        # below-right: under the slope, where no dot sits
        ax.annotate(f"{users} users: KV full", (x, y), textcoords="offset points", xytext=(7, -7), ha="left",
                    va="top", fontsize=9, color=CEILING)  # fmt: skip

    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(*INTENSITY_RANGE)
    low, high = INTENSITY_RANGE[0] * device.bandwidth / TERA / 2, peak / TERA * 3
    for other in ax.get_shared_y_axes().get_siblings(ax):  # panels sharing this y axis: room for all their roofs
        if other is not ax and other.lines:
            low, high = min(low, other.get_ylim()[0]), max(high, other.get_ylim()[1])
    ax.set_ylim(low, high)
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(lambda v, _: f"{v:g}")  # a room reads "100", not "10^2"
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("arithmetic intensity (FLOPs per byte moved)")
    ax.set_ylabel("TFLOP/s the step attains")
    ax.set_title(title or f"{spec.name} ({dtype}) on {device.name}", loc="left", fontsize=11)
    ax.legend(loc="upper left", fontsize=8.5, frameon=False)
    ax.grid(alpha=0.25, which="major")
    return ax.figure
