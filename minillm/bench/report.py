"""Turn benchmark results into plots (PNG) and a Markdown report, with a verdict per goal."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from minillm.bench import report_roofline as roofline  # noqa: E402
from minillm.bench import report_scheduling as scheduling  # noqa: E402

verdict = scheduling.verdict


def plot_all(results: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    if "batching" in results:
        rows = results["batching"]["rows"]
        fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
        xs = [r["batch"] for r in rows]
        ax[0].plot(xs, [r["tokens_per_s"] for r in rows], "o-")
        ax[0].set(xscale="log", yscale="log", xlabel="concurrent sequences", ylabel="tokens/s (all users)")
        ax[1].plot(xs, [r["per_user_tokens_per_s"] for r in rows], "o-", color="tab:orange")
        ax[1].set(xscale="log", xlabel="concurrent sequences", ylabel="tokens/s per user")
        fig.suptitle("Batching is nearly free: one decode step serves everyone in the batch")
        paths.append(_save(fig, out / "batching.png"))
    if "paged_step" in results:
        rows = results["paged_step"]["rows"]
        fig, ax = plt.subplots(figsize=(6, 3.6))
        for context, style in ((128, "o-"), (512, "s--")):
            sel = [r for r in rows if r["context"] == context]
            ax.plot([r["batch"] for r in sel], [r["ratio"] for r in sel], style, label=f"context {context}")
        ax.axhline(1.3, color="grey", lw=1, ls=":", label="goal 1.3x")
        ax.set(xscale="log", xlabel="concurrent sequences", ylabel="paged / contiguous step time")
        ax.legend()
        paths.append(_save(fig, out / "paged_step.png"))
    if "static_vs_continuous" in results:
        r = results["static_vs_continuous"]
        fig, ax = plt.subplots(1, 2, figsize=(9, 3.4))
        names = ["static", "continuous"]
        ax[0].bar(names, [r[n]["tokens_per_s"] for n in names], color=["tab:grey", "tab:green"])
        ax[0].set(ylabel="tokens/s")
        ax[1].bar(names, [r[n]["slot_utilization"] for n in names], color=["tab:grey", "tab:green"])
        ax[1].set(ylabel="slot utilization", ylim=(0, 1))
        fig.suptitle(f"chat, {r['requests']} requests on {r['slots']} seats")
        paths.append(_save(fig, out / "static_vs_continuous.png"))
    if "memory" in results:
        r = results["memory"]
        fig, ax = plt.subplots(1, 2, figsize=(9, 3.4))
        names = ["contiguous", "paged"]
        ax[0].bar(names, [r[n]["peak_concurrency"] for n in names], color=["tab:grey", "tab:blue"])
        ax[0].set(ylabel="peak concurrent sequences")
        ax[1].bar(names, [r[n]["kv_waste"] for n in names], color=["tab:grey", "tab:blue"])
        ax[1].set(ylabel="KV waste (reserved, empty)", ylim=(0, 1))
        fig.suptitle(f"Same KV memory: {r['budget_token_slots']} token slots")
        paths.append(_save(fig, out / "memory.png"))
    if "two_by_two" in results:
        rows = results["two_by_two"]["rows"]
        fig, ax = plt.subplots(figsize=(7, 3.4))
        labels = [f"{r['scheduler']}\n{r['kv']}" for r in rows]
        ax.bar(labels, [r["tokens_per_s"] for r in rows], color=["tab:grey", "tab:blue", "tab:olive", "tab:green"])
        ax.set(ylabel="tokens/s", title="{static, continuous} x {contiguous, paged}, same KV memory")
        paths.append(_save(fig, out / "two_by_two.png"))
    from minillm.bench.replies import plot as replies_plot
    from minillm.bench.report_speculation import plot as speculation_plot
    from minillm.bench.who_goes_first import plot as who_goes_first_plot

    return (
        paths
        + scheduling.plots(results, out, _save)
        + roofline.plots(results, out, _save)
        + speculation_plot(results, out, _save)
        + who_goes_first_plot(results, out, _save)
        + replies_plot(results, out, _save)
    )


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def markdown(results: dict, command: str, plot_dir: str | None = None) -> str:
    """A report whose every figure comes from `results`."""
    lines = [f"Machine: {results['machine']} ({results['device']}); run {results['date']}.", "",
             f"Command: `{command}`", ""]  # fmt: skip

    def img(name) -> list[str]:  # a plot's lines, for a section to place after its own text
        return [f"![{name}]({plot_dir}/{name}.png)", ""] if plot_dir else []

    if "batching" in results:
        r = results["batching"]
        lines += ["## 1. Batching is nearly free", "", "| sequences | step (ms) | tokens/s | tokens/s per user |",
                  "|---:|---:|---:|---:|"]  # fmt: skip
        lines += [f"| {x['batch']} | {x['step_s'] * 1e3:.2f} | {x['tokens_per_s']:.0f} | "
                  f"{x['per_user_tokens_per_s']:.0f} |" for x in r["rows"]]  # fmt: skip
        lines += [
            "",
            f"Goal: tokens/s at 64 sequences at least {r['goal']:.0f}x tokens/s at 1. Measured "
            f"{r['speedup_64_vs_1']:.1f}x: {verdict(r['met'])}. Most of a decode step of the tiny model on "
            "a CPU is a fixed cost per torch call (section 12, lesson 7), paid once whatever the batch, so extra rows "
            "ride almost free until the per-row work dominates (on a GPU with a big model: reading the weights).",
            "",
        ]
        lines += img("batching")
    if "paged_step" in results:
        r = results["paged_step"]
        lines += [
            "## The cost of paging (decode step time)",
            "",
            "| context | sequences | paged (ms) | contiguous (ms) | paged / contiguous |",
            "|---:|---:|---:|---:|---:|",
        ]
        lines += [f"| {x['context']} | {x['batch']} | {x['paged_s'] * 1e3:.2f} | {x['contiguous_s'] * 1e3:.2f} | "
                  f"{x['ratio']:.2f} |" for x in r["rows"]]  # fmt: skip
        lines += ["", f"Goal: paged at most {r['goal']}x contiguous at 32 sequences. Worst measured at 32: "
                  f"{r['worst_ratio_at_32']:.2f}x: {verdict(r['met'])}. Both layouts gather each row's keys "
                  "with one indexing op; paging adds only the block-table lookup.", ""]  # fmt: skip
        lines += img("paged_step")
    if "static_vs_continuous" in results:
        r = results["static_vs_continuous"]
        lines += ["## 2. Static vs continuous batching", "",
                  f"`chat`, {r['requests']} requests all queued at step 0, exponential reply lengths (EOS ignored), "
                  f"{r['slots']} seats, paged KV.", "",
                  "| policy | tokens/s | slot utilization | TTFT p50 (steps) | TTFT p99 (steps) | TPOT p50 (ms) "
                  "| steps |",
                  "|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
        for p in ("static", "continuous"):
            x = r[p]
            lines.append(f"| {p} | {x['tokens_per_s']:.0f} | {x['slot_utilization']:.1%} | {x['ttft_p50_steps']:.0f} "
                         f"| {x['ttft_p99_steps']:.0f} | {x['tpot_p50_s'] * 1e3:.2f} | {x['steps']} |")  # fmt: skip
        lines += ["", f"Continuous / static tokens/s: {r['speedup']:.2f}x; the ideal implied by utilization: "
                  f"{r['ideal_speedup']:.2f}x, so measured / ideal = {r['share_of_ideal']:.2f}. Goals: at least "
                  f"{r['goal_speedup']:.0f}x and at least {r['goal_share_of_ideal']} of ideal: {verdict(r['met'])}. "
                  "The speedup tracks the ideal: it is bounded by how long static batching's seats sit idle behind "
                  "the longest reply of each batch, which the reply-length spread of the workload sets.",
                  ""]  # fmt: skip
        lines += img("static_vs_continuous")
    if "memory" in results:
        r = results["memory"]
        lines += [
            "## 3. Paged vs contiguous at a fixed KV memory budget",
            "",
            f"Budget: {r['budget_token_slots']} token slots (8 rows of the full context). Contiguous: 8 seats "
            "(one row each). Paged: the same memory as 16-token blocks, 64 seats, preemption when full.",
            "",
            "| layout | peak concurrent | KV waste | tokens/s | preemptions | steps |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for k in ("contiguous", "paged"):
            x = r[k]
            lines.append(f"| {k} | {x['peak_concurrency']} | {x['kv_waste']:.1%} | {x['tokens_per_s']:.0f} | "
                         f"{x['preemptions']} | {x['steps']} |")  # fmt: skip
        lines += ["", f"Goal: paged KV waste at most {r['goal_paged_waste']:.0%}: {verdict(r['met'])} "
                  f"({r['paged']['kv_waste']:.1%}). Paged waste is only the unfilled tail of each sequence's last "
                  "block, so it shrinks as sequences grow longer than a block.", ""]  # fmt: skip
        lines += img("memory")
    if "overhead" in results:
        r = results["overhead"]
        lines += ["## 4. Engine overhead", "",
                  f"{r['slots']} concurrent sequences, {r['steps']} steps: model forward {r['forward_s']:.2f} s of "
                  f"{r['total_s']:.2f} s of step time, so {r['overhead_share']:.1%} is spent outside the model "
                  f"(scheduling, block tables, sampling, records). Goal at most {r['goal']:.0%}: {verdict(r['met'])}.",
                  ""]  # fmt: skip
    if "two_by_two" in results:
        r = results["two_by_two"]
        lines += ["## 5. The 2 x 2", "", f"Same KV memory ({r['budget_token_slots']} token slots) for every cell.", "",
                  "| scheduler | KV | seats | tokens/s | peak concurrent | utilization | steps |",
                  "|---|---|---:|---:|---:|---:|---:|"]  # fmt: skip
        lines += [f"| {x['scheduler']} | {x['kv']} | {x['seats']} | {x['tokens_per_s']:.0f} | {x['peak_concurrency']} "
                  f"| {x['slot_utilization']:.1%} | {x['steps']} |" for x in r["rows"]]  # fmt: skip
        lines += [
            "",
            "Policy and layout are independent switches: continuous batching fills the seats; paging makes "
            "room for more seats in the same memory. Each helps alone; together they help most.",
            "",
        ]
        lines += img("two_by_two")
    lines += scheduling.markdown(results, img)
    lines += roofline.markdown(results, img)
    if "calls" in results:
        from minillm.bench.calls import markdown as calls_markdown

        lines += calls_markdown(results["calls"])
    if "vs_transformers" in results:
        from minillm.bench.versus import markdown as versus_markdown

        lines += versus_markdown(results["vs_transformers"])
    if "server" in results or "transformers_server" in results:
        from minillm.bench.server import markdown as server_markdown
        from minillm.bench.server import markdown_transformers

        lines += (
            server_markdown(results["server"])
            if "server" in results
            else ["## 14. The engine behind an HTTP server", ""]
        )
        lines += markdown_transformers(results["transformers_server"]) if "transformers_server" in results else []
    if "speculation" in results:
        from minillm.bench.report_speculation import markdown as speculation_markdown

        lines += speculation_markdown(results["speculation"], img)
    if "structured" in results:
        from minillm.bench.structured import markdown as structured_markdown

        lines += structured_markdown(results["structured"])
    if "tp" in results:
        from minillm.bench.tensor_parallel import markdown as tp_markdown

        lines += tp_markdown(results["tp"], img)
    if "fleet" in results:
        from minillm.bench.fleet import markdown as fleet_markdown

        lines += fleet_markdown(results["fleet"])
    if "peer" in results:
        from minillm.bench.peer import markdown as peer_markdown

        lines += peer_markdown(results["peer"])
    if "who_goes_first" in results:
        from minillm.bench.who_goes_first import markdown as who_markdown

        lines += who_markdown(results["who_goes_first"], img)
    if "replies" in results:
        from minillm.bench.replies import markdown as replies_markdown

        lines += replies_markdown(results["replies"], img)
    if "tier" in results:
        from minillm.bench.tier import markdown as tier_markdown

        lines += tier_markdown(results["tier"], img)
    if "papers" in results:
        from minillm.bench.papers import markdown as papers_markdown

        lines += papers_markdown(results["papers"], img)
    return "\n".join(lines)
