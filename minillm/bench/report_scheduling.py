"""The report's sections for scheduling.py: chunked prefill, prefix caching, packing, end to end, simulation."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt


def verdict(met: bool) -> str:
    return "**met**" if met else "**not met**"


def plots(results: dict, out: Path, save) -> list[Path]:
    paths = []
    if "chunked_prefill" in results:
        rows = results["chunked_prefill"]["rows"]
        labels = [str(r["token_budget"] or "none") for r in rows]
        fig, ax = plt.subplots(1, 3, figsize=(11, 3.4))
        for axis, key, title in zip(ax, ("tpot_p99_s", "itl_p99_s", "ttft_p50_s"),
                                    ("TPOT p99 (ms)", "inter-token p99 (ms)", "TTFT p50 (ms)")):  # fmt: skip
            axis.bar(labels, [1e3 * r[key] for r in rows], color="tab:purple")
            axis.set(xlabel="token budget", title=title)
        fig.suptitle("long-prompts: a token budget trades a little TTFT for a steady TPOT")
        paths.append(save(fig, out / "chunked_prefill.png"))
    if "prefix_caching" in results:
        r = results["prefix_caching"]
        fig, ax = plt.subplots(1, 2, figsize=(8, 3.4))
        names, colors = ["off", "on"], ["tab:grey", "tab:cyan"]
        ax[0].bar(names, [r[n]["prefill_tokens"] for n in names], color=colors)
        ax[0].set(xlabel="prefix caching", ylabel="prompt tokens computed")
        ax[1].bar(names, [1e3 * r[n]["ttft_p50_s"] for n in names], color=colors)
        ax[1].set(xlabel="prefix caching", ylabel="TTFT p50 (ms)")
        fig.suptitle("system-prompt: the shared system prompt is computed once")
        paths.append(save(fig, out / "prefix_caching.png"))
    return paths


def latency_table(rows: list[dict]) -> list[str]:
    lines = ["| token budget | tokens/s | TPOT p50 (ms) | TPOT p99 (ms) | inter-token p99 (ms) | TTFT p50 (ms) "
             "| TTFT p99 (ms) | steps | TPOT p99, ITL p99: x lower than none |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---|"]  # fmt: skip
    return lines + [f"| {x['token_budget'] or 'none'} | {x['tokens_per_s']:.0f} | {1e3 * x['tpot_p50_s']:.1f} | "
                    f"{1e3 * x['tpot_p99_s']:.1f} | {1e3 * x['itl_p99_s']:.1f} | {1e3 * x['ttft_p50_s']:.0f} | "
                    f"{1e3 * x['ttft_p99_s']:.0f} | {x['steps']} | {x['tpot_p99_ratio']:.2f}, "
                    f"{x['itl_p99_ratio']:.2f} |" for x in rows]  # fmt: skip


def markdown(results: dict, img) -> list[str]:
    lines: list[str] = []
    if "chunked_prefill" in results:
        r = results["chunked_prefill"]
        lines += ["## 6. Chunked prefill: a token budget per step", "",
                  "`long-prompts`, continuous batching, 16 seats: a quarter of the users send a 300-600 byte prompt.",
                  ""] + latency_table(r["rows"])  # fmt: skip
        lines += ["", f"Goal: with the default budget ({r['budget']} tokens) TPOT p99 at least "
                  f"{r['goal_tpot_ratio']:.0f}x lower than with none, total tokens/s within "
                  f"{r['goal_throughput_within']:.0%}. Measured {r['tpot_p99_ratio']:.2f}x lower (inter-token p99 "
                  f"{r['itl_p99_ratio']:.2f}x), tokens/s x{r['throughput_ratio']:.2f}: {verdict(r['met'])}.", "",
                  "Why TPOT p99 is the wrong gauge of the stall: TPOT averages a request's whole reply, and a budget "
                  "does not remove the prefill work done while it decodes; it spreads that work over more steps. "
                  "What it removes is the long gap: the inter-token p99. TPOT falls only for replies short enough "
                  "to end before the chunks of a prompt they met are done, which needs prompts many budgets long "
                  "(here prompts of 300-600 tokens are 1 to 3 chunks of the default budget, 5 to 10 of 64).",
                  ""]  # fmt: skip
        card = r.get("card")
        if card:
            lines += [
                f"The same on a simulated card: {card['model']} on {card['gpu']}, {card['requests']} "
                f"`azure-conv` requests at {card['rate_per_s']} per second (prompts of about 1000 tokens).",
                "",
            ]
            lines += latency_table(card["rows"]) + [""]
        lines += img("chunked_prefill")
    if "prefix_caching" in results:
        r = results["prefix_caching"]
        off, on = r["off"], r["on"]
        lines += ["## 7. Prefix caching", "", "`system-prompt`, continuous batching, 16 seats.", "",
                  "| prefix caching | prompt tokens computed | from the cache | hit rate | TTFT p50 (ms) | "
                  "TTFT p99 (ms) | tokens/s |", "|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
        for name, x in (("off", off), ("on", on)):
            lines.append(
                f"| {name} | {x['prefill_tokens']} | {x['prompt_tokens_from_cache']} | {x['prefix_hit_rate']:.0%} "
                f"| {1e3 * x['ttft_p50_s']:.0f} | {1e3 * x['ttft_p99_s']:.0f} | {x['tokens_per_s']:.0f} |"
            )
        lines += ["", f"Goal: at least {r['goal_reduction']:.0f}x fewer prompt tokens computed, a lower TTFT p50, "
                  f"identical outputs. Measured {r['prefill_reduction']:.1f}x fewer, outputs identical: "
                  f"{r['outputs_identical']}: {verdict(r['met'])}.", ""]  # fmt: skip
        lines += img("prefix_caching")
    if "packing" in results:
        r = results["packing"]
        lines += ["## 8. One ragged forward per step", "",
                  f"A step that admits newcomers: {r['decode_rows']} decode rows and {r['prompts']} new "
                  f"{r['prompt_len']}-token prompts. One forward with the rows laid end to end took "
                  f"{1e3 * r['one_forward_s']:.2f} ms; the way before (a decode forward, then one forward per new "
                  f"prompt) took {1e3 * r['separate_forwards_s']:.2f} ms. Ratio {r['ratio']:.2f}, goal at most "
                  f"{r['goal']}: {verdict(r['met'])}.", ""]  # fmt: skip
    if "batching_e2e" in results:
        r = results["batching_e2e"]
        lines += ["## 9. Batching end to end", "",
                  f"`chat`, {r['requests']} requests queued at step 0, through the whole engine (prefill rides in "
                  f"the decode forward): {r['seats_64']['tokens_per_s']:.0f} tokens/s at 64 seats, "
                  f"{r['seats_1']['tokens_per_s']:.0f} at 1 seat: {r['speedup']:.1f}x. Goal at least "
                  f"{r['goal']:.0f}x: {verdict(r['speedup'] >= r['goal'])}.", ""]  # fmt: skip
        if "budget_cost" in r:
            lines += [f"The same 64 seats with the default token budget and without one, in turns (means of two runs "
                      f"each): {r['budget_tokens_per_s']:.0f} and {r['no_budget_tokens_per_s']:.0f} tokens/s, so the "
                      f"budget costs {r['budget_cost']:.1%} of the tokens/s on this crowd of short prompts "
                      f"(goal at most {r['goal_budget_cost']:.0%}: {verdict(r['budget_cost'] <= r['goal_budget_cost'])}"
                      ").", ""]  # fmt: skip
        many = r["seats_64"]
        lines += [f"Why less than a full batch's decode speedup (section 1): the 64 seats were "
                  f"{many['slot_utilization']:.0%} busy over the run (exponential reply lengths: the last requests "
                  f"finish with the seats emptying), and the steps also computed {many['prefill_tokens']} prompt "
                  f"tokens beside the {many['output_tokens']} output tokens counted; at 1 seat a prompt is one "
                  "forward's extra rows, nearly free.", ""]  # fmt: skip
    if "simulation" in results:
        r = results["simulation"]
        lines += ["## 10. A simulated card", "",
                  f"{r['requests']} `azure-conv` requests at 4 per second, Llama-3.1-8B (bf16) on a simulated "
                  "H100 SXM: "
                  f"{r['simulated_s']:.0f} simulated seconds, {r['steps']} steps, {r['tokens_per_s']:.0f} tokens/s, "
                  f"TTFT p50 {1e3 * r['ttft_p50_s']:.0f} ms (p99 {1e3 * r['ttft_p99_s']:.0f}), TPOT p50 "
                  f"{1e3 * r['tpot_p50_s']:.1f} ms (p99 {1e3 * r['tpot_p99_s']:.1f}). This machine simulated it in "
                  f"{r['seconds']:.1f} s; the trace is {r['trace_mb']:.1f} MB. Goals (for 2000 requests): at most "
                  f"{r['goal_seconds']:.0f} s and {r['goal_trace_mb']:.0f} MB: {verdict(r['met'])}.", ""]  # fmt: skip
    return lines
