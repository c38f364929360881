"""A fleet of cards against its split: N replicas, then each P prefill : D decode, serving one crowd (card/fleet.py).

Three panels side by side over the same splits: TTFT p99 on a log scale (too few prefill cards and the prompts queue:
orders of magnitude), ITL p99 (too few decode cards and each decode step carries a bigger batch; a replica's steps
carry prompts), and goodput, the share of requests that meet both a TTFT and a TPOT target, for each pair of targets
given (DistServe's measure: fleet_figures.py). The rows are fleet_figures' dicts, one per split.
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.ticker import LogLocator, NullFormatter

from viz.colors import DECODE, PREFILL, STATE_COLORS

GOODPUT_MARKERS = "os^"


def split_labels(rows: list[dict]) -> list[str]:
    return [r["split"].replace(" replicas", "\nreplicas") for r in rows]


def plot_splits(rows: list[dict], goodput: dict[str, list[float]], figsize=(8.0, 2.9)) -> Figure:
    """rows: fleet_figures of each split, in order; goodput: a target pair's name -> each split's goodput (0-1),
    named in a legend under the panels."""
    fig = Figure(figsize=figsize, layout="constrained")
    ttft, itl, good = fig.subplots(1, 3)
    labels = split_labels(rows)
    ms = lambda key: [1e3 * (r[key] or 0) for r in rows]
    ttft.bar(labels, ms("ttft_p99_s"), color=STATE_COLORS[PREFILL])
    ttft.set(ylabel="ms", yscale="log", ylim=(min(ms("ttft_p99_s")) / 2, max(ms("ttft_p99_s")) * 1.5))
    ttft.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5), numticks=12))  # 200, 500, 1000: no powers of 10
    ttft.yaxis.set_major_formatter(lambda v, _: f"{v:g}")
    ttft.yaxis.set_minor_formatter(NullFormatter())
    ttft.set_title("TTFT p99", loc="left", fontsize=11)
    itl.bar(labels, ms("itl_p99_s"), color=STATE_COLORS[DECODE])
    itl.set(ylabel="ms")
    itl.set_title("ITL p99", loc="left", fontsize=11)
    for (name, shares), marker in zip(goodput.items(), GOODPUT_MARKERS):
        good.plot(labels, [100 * g for g in shares], marker=marker, label=name)
    good.set(ylabel="% of requests", ylim=(0, 105))
    good.set_title("goodput", loc="left", fontsize=11)
    fig.legend(*good.get_legend_handles_labels(), loc="outside lower center", ncol=2, fontsize=9, frameon=False)
    for ax in (ttft, itl, good):
        ax.tick_params(labelsize=9)
        ax.grid(alpha=0.3, axis="y")
    return fig
