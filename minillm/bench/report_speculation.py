"""The report's section for speculation.py: speculative decoding beside batching, measured and predicted."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from minillm.bench.report_scheduling import verdict
from minillm.bench.speculation import CROWDS, KS

COLORS = dict(zip(KS, ("tab:blue", "tab:orange", "tab:green")))


def plot(results: dict, out: Path, save) -> list[Path]:
    if "speculation" not in results:
        return []
    r = results["speculation"]
    fig, axes = plt.subplots(1, len(CROWDS), figsize=(12, 3.8), sharey=True)
    for ax, task in zip(axes, CROWDS):
        rows, predicted = r["batches"][task], r["predicted"][task]
        batches = [x["batch"] for x in rows]
        for k in KS:
            ax.plot(batches, [x[f"k{k}_speedup"] for x in rows], "o", color=COLORS[k], label=f"k = {k}, measured")
            ax.plot(batches, predicted["speedup"][str(k)], "--", color=COLORS[k], label=f"k = {k}, predicted")
        ax.axhline(1, color="grey", lw=1)
        ax.set(xscale="log", xlabel="users served at once", title=f"{task}: speculative / plain tokens/s")
        ax.legend(fontsize=7, ncol=2)
    fig.suptitle("Two ways to spend idle compute: guesses for each user, or more users")
    return [save(fig, out / "speculation.png")]


def markdown(r: dict, img) -> list[str]:
    draft, predicted = r["draft"], r["predicted"]
    accuracy = (draft.get("heldout_accuracy") or {}).get("none", {})
    show = lambda b: "past the largest batch" if b is None else f"{b:.0f}"
    lines = ["## 15. Two ways to spend idle compute: speculative decoding beside batching", "",
             f"The shipped draft model (`minillm/weights/draft.safetensors`, `python -m minillm train --draft`): "
             f"{draft['parameters'] / 1e6:.2f} M parameters, trained in {draft['train_seconds']:.0f} s; held-out "
             "exact-match accuracy (no preamble): " + ", ".join(f"{t} {a:.0%}" for t, a in accuracy.items()) + ".",
             "", "Acceptance per task (8 seats, k = 4): the share of guesses the model kept, and the tokens a verify "
             "row gained per step (at most k + 1 = 5).", "",
             "| task | drafter | guesses kept | tokens per verify row |", "|---|---|---:|---:|"]  # fmt: skip
    lines += [f"| {x['task']} | {x['drafter']} | {x['acceptance']:.1%} | {x['tokens_per_row']:.2f} |"
              for x in r["acceptance"]]  # fmt: skip
    for task in CROWDS:
        rows, mine = r["batches"][task], predicted[task]
        what = ("users counting down from 100 to 152, decoding together" if task == "countdown" else
                "seats serving spellings of 5-6 digits, newcomers taking the seats users leave")  # fmt: skip
        lines += ["", f"**{task}**: B {what}; tokens/s over the steps all B seats were busy (median of paired "
                  "rounds); in brackets speculative / plain, measured, then predicted (`minillm/card/speculation.py`, "
                  f"this machine's calibration, op by op, context {predicted['context'][task]}).", "",
                  "| users | no speculation | " + " | ".join(f"k = {k}" for k in KS) + " |",
                  "|---:|---:|" + "---:|" * len(KS)]  # fmt: skip
        for i, x in enumerate(rows):
            cells = [f"{x[f'k{k}_tokens_per_s']:.0f} ({x[f'k{k}_speedup']:.2f}x; {mine['speedup'][str(k)][i]:.2f}x)"
                     for k in KS]  # fmt: skip
            lines.append(f"| {x['batch']} | {x['tokens_per_s']:.0f} | " + " | ".join(cells) + " |")
        where = [f"k = {k}: measured {show(r['measured_crossover'][task][str(k)])}, predicted "
                 f"{show(mine['crossover'][str(k)])} (acceptance rate {mine['alpha'][str(k)]:.3f})"
                 for k in KS]  # fmt: skip
        lines += ["", "Where speculation stops paying: " + "; ".join(where) + "."]
    lines += ["", f"Goals: one user counting down, with the best k, at least {r['goal_speedup_at_1']}x (measured "
              + ", ".join(f"k = {k}: {s:.2f}x" for k, s in r["speedup_at_1"].items())
              + f"): {verdict(r['met_speedup'])}; every measured crossover within {r['goal_crossover_within']:.0f}x "
              "of the predicted one (one past the largest batch measured agrees with a prediction at least half that "
              f"batch): {verdict(r['met_crossover'])}.", ""]  # fmt: skip
    lines += img("speculation")
    cards = predicted["cards"]
    lines += [f"Predicted for {cards['target']} drafted by {cards['draft']} at {cards['context']} tokens of context "
              "(the roofline; acceptance rate an input):", "",
              "| card | k | acceptance | speedup, 1 user | stops paying at | users that fit (both models) |",
              "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    lines += [f"| {x['gpu']} | {x['k']} | {x['alpha']:.0%} | {x['speedup_at_1']:.2f}x | {show(x['crossover_batch'])} "
              f"| {x['users_that_fit']} |" for x in cards["rows"]]  # fmt: skip
    return lines + [""]
