"""The roofline's section of the report: this machine's measured steps against both predictions, the picture
that puts them beside two datasheet cards, and the published table."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from minillm.bench.report_scheduling import verdict

GRID = np.unique(np.geomspace(1, 128, 29).round().astype(int))  # batches the curves are drawn at
GPU_GRID = np.unique(np.geomspace(1, 512, 31).round().astype(int))
CARDS = (("rtx-4090", "RTX 4090"), ("h100-sxm", "H100 SXM"))
GPU_MODEL, GPU_CONTEXT = "llama-3.1-8b", 1024


def ridge_line(ax, ridge: float | None) -> None:
    """The batch at which the bound turns compute-bound (the card's ridge point, for this model), named in the
    legend: written beside the line, the words ran off a panel whose ridge sits near its right edge."""
    if ridge:
        ax.axvline(ridge, color="grey", lw=0.8, ls="--", label=f"ridge: batch {ridge:.0f}")


def machine_panel(ax, rows: list[dict], cal: dict, size: str) -> None:
    """Measured decode steps of one size as dots; the op-by-op prediction through them; the roofline's bound; the
    batch at which the bound turns compute-bound (this machine's ridge point)."""
    from minillm.card import roofline
    from minillm.card.hardware import from_calibration
    from minillm.card.opcost import step_bill
    from minillm.card.sizes import size_spec
    from minillm.card.validate import bound_s

    spec, machine = size_spec(size), from_calibration(cal)
    mine = [r for r in rows if r["size"] == size and not r["chunk"]]
    for i, (context, color) in enumerate(zip(sorted({r["context"] for r in mine}), ("#0072b2", "#d55e00"))):
        dots = [r for r in mine if r["context"] == context]
        calls = dots[0]["calls"]
        ax.plot([r["batch"] for r in dots], [1e3 * r["measured_s"] for r in dots], "o", color=color,
                label=f"measured, {context} tokens cached")  # fmt: skip
        predicted = [step_bill(spec, cal, [(1, context)] * b, calls).time_s for b in GRID]
        ax.plot(GRID, 1e3 * np.array(predicted), "-", color=color, lw=1.5, label=None if i else "predicted, op by op")
        bound = [bound_s(spec, machine, [(1, context)] * b, calls) for b in GRID]
        ax.plot(GRID, 1e3 * np.array(bound), ":", color=color, lw=1.2, label=None if i else "roofline: the bound")
    ridge_line(ax, roofline.ridge_batch(spec, machine, 0, "fp32", "fp32"))
    weights = spec.num_parameters * 4 / 2**20
    where = "fits in" if weights * 2**20 < cal["cache_bytes"] else f"{weights * 2**20 / cal['cache_bytes']:.0f}x"
    ax.set(xscale="log", yscale="log", xlabel="users in the batch", ylabel="ms per decode step",
           title=f"this machine: {size} ({weights:.0f} MiB fp32, {where} the cache)")  # fmt: skip


def card_panel(ax, gpu: str, label: str) -> None:
    """A datasheet card: Llama-3.1-8B in bf16, the serving-engine prediction and the bound, and the ridge."""
    from minillm.bench.published import PUBLISHED_SINGLE_STREAM
    from minillm.card import roofline
    from minillm.card.enginecost import engine_decode
    from minillm.card.hardware import DEVICES
    from minillm.card.modelspec import load_spec

    spec, card = load_spec(GPU_MODEL), DEVICES[gpu]
    predicted = [engine_decode(spec, card, b, GPU_CONTEXT).time_s for b in GPU_GRID]
    bound = [roofline.decode_cost(spec, card, b, GPU_CONTEXT).time_s for b in GPU_GRID]
    ax.plot(GPU_GRID, 1e3 * np.array(predicted), "-", color="#009e73", lw=1.5, label="predicted, kernel by kernel")
    ax.plot(GPU_GRID, 1e3 * np.array(bound), ":", color="#009e73", lw=1.2, label="roofline: the bound")
    if gpu in PUBLISHED_SINGLE_STREAM:
        ax.plot([1], [1e3 / PUBLISHED_SINGLE_STREAM[gpu]], "o", color="black", label="published (llama.cpp)")
    ridge_line(ax, roofline.ridge_batch(spec, card, 0))
    ax.set(xscale="log", yscale="log", xlabel="users in the batch", ylabel="ms per decode step",
           title=f"{label}: {GPU_MODEL} bf16, {GPU_CONTEXT} tokens cached")  # fmt: skip


def roofline_figure(rows: list[dict], cal: dict, small: str = "3m", big: str = "100m"):
    """This machine's smallest and largest size measured, beside two datasheet cards: the same formula, different
    numbers. rows and cal: a whatif --validate (or bench --roofline) result's."""
    fig, axes = plt.subplots(2, 2, figsize=(10, 6.6))
    machine_panel(axes[0, 0], rows, cal, small)
    machine_panel(axes[0, 1], rows, cal, big)
    for ax, (gpu, label) in zip(axes[1], CARDS):
        card_panel(ax, gpu, label)
    plain = FuncFormatter(lambda value, _: f"{value:g}")  # 20 and 60, not 2 x 10^1 and 6 x 10^1
    for ax in axes.flat:
        ax.legend(fontsize=7, loc="upper left")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(plain)
            axis.set_minor_formatter(NullFormatter())
    fig.suptitle("Step time against batch: the same formula, different numbers (flat until the ridge, then rising)")
    fig.tight_layout()
    return fig


def plots(results: dict, out: Path, save) -> list[Path]:
    if "roofline" not in results:
        return []
    r = results["roofline"]
    sizes = list(r["per_size"])
    return [save(roofline_figure(r["rows"], r["calibration"], sizes[0], sizes[-1]), out / "roofline.png")]


def markdown(results: dict, img) -> list[str]:
    if "roofline" not in results:
        return []
    from minillm.card.calibrate import describe

    r = results["roofline"]
    lines = ["## 11. This machine's roofline: the cost model against measured steps", "",
             "`python -m minillm bench --roofline` (the sweep of `python -m minillm whatif --validate`, denser in "
             "batch): for each model size (random weights through the same engine code, `minillm/card/sizes.py`), "
             "decode steps at batches 1-128 and two contexts, and prompt chunks; each predicted op by op "
             "(`minillm/card/opcost.py`) from microbenchmarks only, priced by the one-line roofline (the bound), "
             "then measured. One torch thread.", "",
             f"Calibration ({r['calibration']['seconds']:.0f} s): {describe(r['calibration'])}.", "",
             f"Load average {r['load_before']:.1f} before the sweep and {r['load_after']:.1f} after.", "",
             "| size | batch | context | chunk | torch calls | predicted (ms) | measured (ms) | error | bound (ms) "
             "| largest term |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]  # fmt: skip
    lines += [f"| {x['size']} | {x['batch']} | {x['context']} | {x['chunk'] or ''} | {x['calls']} | "
              f"{1e3 * x['predicted_s']:.2f} | {1e3 * x['measured_s']:.2f} | {x['error']:+.0%} | "
              f"{1e3 * x['bound_s']:.2f} | {x['dominant']} ({x['shares'][x['dominant']]:.0%}) |"
              for x in r["rows"]]  # fmt: skip
    g = r["goals"]
    lines += [""] + [f"- {name}: decode median error {s['median_abs_error']:.0%}, worst {s['worst_abs_error']:.0%}"
                     for name, s in r["per_size"].items()]  # fmt: skip
    if r["prefill"]:
        lines.append(f"- prompt chunks: median {r['prefill']['median_abs_error']:.0%}, worst "
                     f"{r['prefill']['worst_abs_error']:.0%}")  # fmt: skip
    lines += ["", f"Goals: median at most {g['median']:.0%} and worst at most {g['worst']:.0%} for every size, prompt "
              f"chunks within {g['prefill']:.0%}: {verdict(r['met'])}.", ""]  # fmt: skip
    lines += img("roofline")
    return lines + published_markdown(r["published"])


def published_markdown(p: dict) -> list[str]:
    sources = "; ".join(dict.fromkeys(x["source"] for x in p["rows"]))  # each once, in the table's order
    lines = ["### Real cards against published measurements", "",
             "Each figure was measured and published by others; beside it, `run --simulate`'s prediction of the "
             "same run (the engine on a simulated clock, priced by `minillm/card/enginecost.py`; a model split over "
             f"N cards, by `minillm/card/tensor_parallel.py`: N x card). Sources: {sources}.", "",
             "| kind | card | model | dtype (KV) | run | published | predicted | error | goal | why |",
             "|---|---|---|---|---|---:|---:|---:|---:|---|"]  # fmt: skip
    for x in p["rows"]:
        card = f"{x['tp']} x {x['gpu']}" if x.get("tp", 1) > 1 else x["gpu"]
        lines.append(f"| {x['kind']} | {card} | {x['model']} | {x['dtype']} ({x['kv_dtype']}) | {x['label']} | "
                     f"{x['reported']:,.1f} {x['unit']} | {x['predicted']:,.1f} | {x['error']:+.0%} | "
                     f"{x['goal']:.0%}{'' if x['met'] else ' (missed)'} | {x['why']} |")  # fmt: skip
    met = sum(x["met"] for x in p["rows"])
    return lines + ["", f"{met} of {len(p['rows'])} within their goals: {verdict(p['met'])}.", ""]
