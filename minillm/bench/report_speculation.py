"""The report's section for speculation.py: speculative decoding beside batching, measured and predicted."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from minillm.bench.report_scheduling import verdict
from minillm.bench.speculation import KS


def plot(results: dict, out: Path, save) -> list[Path]:
    if "speculation" not in results:
        return []
    r = results["speculation"]
    rows, predicted = r["rows"], r["predicted"]
    batches = [x["batch"] for x in rows]
    fig, ax = plt.subplots(1, 2, figsize=(11, 3.8))
    ax[0].plot(batches, [x["tokens_per_s"] for x in rows], "o-", color="black", label="no speculation")
    for k, color in zip(KS, ("tab:blue", "tab:orange", "tab:green")):
        ax[0].plot(batches, [x[f"k{k}_tokens_per_s"] for x in rows], "o-", color=color, label=f"k = {k}")
        ax[1].plot(batches, [x[f"k{k}_speedup"] for x in rows], "o", color=color, label=f"k = {k}, measured")
        ax[1].plot(batches, predicted["speedup"][k], "--", color=color, label=f"k = {k}, predicted")
    ax[0].set(xscale="log", yscale="log", xlabel="users decoding at once", ylabel="tokens/s (all users)")
    ax[0].legend(fontsize=8)
    ax[1].axhline(1, color="grey", lw=1)
    ax[1].set(xscale="log", xlabel="users decoding at once", ylabel="speculative / plain tokens/s")
    ax[1].legend(fontsize=7, ncol=2)
    fig.suptitle("Two ways to spend idle compute: guesses for one user, or other users' rows")
    return [save(fig, out / "speculation.png")]


def markdown(r: dict, img) -> list[str]:
    draft, rows, predicted = r["draft"], r["rows"], r["predicted"]
    accuracy = (draft.get("heldout_accuracy") or {}).get("none", {})
    lines = ["## 14. Two ways to spend idle compute: speculative decoding beside batching", "",
             f"The shipped draft model (`minillm/weights/draft.safetensors`, `python -m minillm train --draft`): "
             f"{draft['parameters'] / 1e6:.2f} M parameters, trained in {draft['train_seconds']:.0f} s; held-out "
             "exact-match accuracy (no preamble): " + ", ".join(f"{t} {a:.0%}" for t, a in accuracy.items()) + ".",
             "", "Acceptance per task (8 users, k = 4): the share of guesses the model kept, and the tokens a verify "
             "row gained per step (at most k + 1 = 5).", "",
             "| task | drafter | guesses kept | tokens per verify row |", "|---|---|---:|---:|"]  # fmt: skip
    lines += [f"| {x['task']} | {x['drafter']} | {x['acceptance']:.1%} | {x['tokens_per_row']:.2f} |"
              for x in r["acceptance"]]  # fmt: skip
    lines += ["", "B users counting down from 100 to 152, decoding together; tokens/s over the steps all B decoded "
              "(median of paired rounds); in brackets speculative / plain, measured, then predicted by the cost model "
              f"(`minillm/card/speculation.py`, this machine calibrated, context {predicted['context']}).", "",
              "| users | no speculation | " + " | ".join(f"k = {k}" for k in KS) + " |",
              "|---:|---:|" + "---:|" * len(KS)]  # fmt: skip
    for i, x in enumerate(rows):
        cells = [f"{x[f'k{k}_tokens_per_s']:.0f} ({x[f'k{k}_speedup']:.2f}x; {predicted['speedup'][k][i]:.2f}x)"
                 for k in KS]  # fmt: skip
        lines.append(f"| {x['batch']} | {x['tokens_per_s']:.0f} | " + " | ".join(cells) + " |")
    show = lambda b: "never (in range)" if b is None else f"{b:.0f}"
    lines += ["", "Where speculation stops paying (the batch where speculative tokens/s falls below plain): "
              + "; ".join(f"k = {k}: measured {show(r['measured_crossover'][k])}, predicted "
                          f"{show(predicted['crossover'][k])} (alpha {predicted['alpha'][k]:.3f})" for k in KS) + ".",
              "", f"Goals: at batch 1 at least {r['goal_speedup_at_1']}x (measured "
              + ", ".join(f"k = {k}: {s:.2f}x" for k, s in r["speedup_at_1"].items())
              + f"); the measured crossover within {r['goal_crossover_within']:.0f}x of the predicted one: "
              f"{verdict(r['met'])}.", ""]  # fmt: skip
    img("speculation")
    cards = predicted["cards"]
    lines += [f"Predicted for {cards['target']} drafted by {cards['draft']} at {cards['context']} tokens of context "
              "(acceptance rate an input):", "",
              "| card | k | acceptance | speedup, 1 user | stops paying at | users that fit (both models) |",
              "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    lines += [f"| {x['gpu']} | {x['k']} | {x['alpha']:.0%} | {x['speedup_at_1']:.2f}x | {show(x['crossover_batch'])} "
              f"| {x['users_that_fit']} |" for x in cards["rows"]]  # fmt: skip
    return lines + [""]
