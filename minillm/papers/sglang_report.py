"""The SGLang experiment's report: each workload through the three systems, the headlines beside the paper's, and
what moves the figures, measured (the waiting queue's order; sharing whole blocks against single tokens)."""

from __future__ import annotations

from dataclasses import asdict
from statistics import mean

from minillm.papers import sglang_setup as setup
from minillm.papers.sglang import Options, Served, run, run_workload
from minillm.papers.verdict import TOLERANCE, Headline, headline_table

WHERE_RANGE = f'{setup.PAPER}, section 6.2: "the cache hit rate ranges from 50% to 99%"'
WHERE_OPTIMAL = f'{setup.PAPER}, section 6.2 and Fig. 13: "approaches 96% of the optimal hit rate on average"'


def setting(options: Options, served: Served) -> str:
    return f"{served.programs:,} programs, block {options.block_size}"


def headlines(options: Options, found: dict[str, dict[str, Served]]) -> list[Headline]:
    """Per workload: its hit rate against the paper's range (a bound: at least 50%); over the workloads: the achieved
    share of the optimal hit rate, on average, against the paper's 96%."""
    out, shares = [], []
    for workload, systems in found.items():
        cache = systems.get("cache")
        if cache is None:
            continue
        label = setup.WORKLOADS[workload].label.split(" (")[0]
        out.append(Headline(f"{label}: cache hit rate", setup.HIT_RANGE[0], 100 * cache.hit_rate, "%",
                            setting(options, cache), WHERE_RANGE, at_least=True, about=workload))  # fmt: skip
        if cache.optimal_rate:
            shares.append(cache.hit_rate / cache.optimal_rate)
    if shares:
        out.append(Headline("achieved / optimal hit rate, mean", setup.OF_OPTIMAL, 100 * mean(shares), "%",
                            f"{len(shares)} workloads, block {options.block_size}", WHERE_OPTIMAL,
                            about="of-optimal"))  # fmt: skip
    return out


def granularity(options: Options, found: dict[str, dict[str, Served]]) -> dict[str, dict]:
    """SGLang's radix tree shares to the token, minillm's cache whole blocks: each workload's cached system again at
    block size 1, and how its hit rate and throughput move."""
    if options.block_size == 1:
        return {}
    out = {}
    for workload, systems in found.items():
        if "cache" not in systems:
            continue
        token = run_workload(options, workload, ("cache",), block_size=1)["cache"]
        blocks = systems["cache"]
        out[workload] = {"block_hit_rate": blocks.hit_rate, "token_hit_rate": token.hit_rate,
                         "block_throughput": blocks.throughput, "token_throughput": token.throughput,
                         "optimal_rate": token.optimal_rate}  # fmt: skip
    return out


def roomier(options: Options, found: dict[str, dict[str, Served]]) -> dict[str, dict]:
    """The chats' contexts outgrow the A10G's KV pool: each chat's cached system again on a card whose pool holds
    every conversation (setup.ROOMY_GPU), and how close to the optimal hit rate it comes."""
    if options.gpu == setup.ROOMY_GPU:
        return {}
    out = {}
    for workload in (w for w in found if w.startswith("chat") and "cache" in found[w]):
        roomy = run_workload(options, workload, ("cache",), gpu=setup.ROOMY_GPU)["cache"]
        out[workload] = {"hit_rate": found[workload]["cache"].hit_rate, "roomy_hit_rate": roomy.hit_rate,
                         "optimal_rate": roomy.optimal_rate}  # fmt: skip
    return out


def reproduce(options: Options) -> dict:
    found = run(options)
    return {"options": asdict(options), "served": found, "headlines": headlines(options, found),
            "granularity": granularity(options, found), "memory": roomier(options, found)}  # fmt: skip


def gain(systems: dict[str, Served], system: str) -> str:
    base = systems.get("no-cache")
    if base is None or not base.throughput or system == "no-cache":
        return ""
    return f"{systems[system].throughput / base.throughput:.2f}x"


def workload_lines(workload: str, systems: dict[str, Served]) -> list[str]:
    w, any_run = setup.WORKLOADS[workload], next(iter(systems.values()))
    rows = [("system", "hit rate", "optimal", "of optimal", "prompt tokens run", "seconds", "programs/s",
             "over no cache")]  # fmt: skip
    for key, s in systems.items():
        share = f"{s.hit_rate / s.optimal_rate:.0%}" if s.optimal_rate else ""
        rows.append((key, f"{s.hit_rate:.1%}", f"{s.optimal_rate:.1%}", share, f"{s.computed_tokens:,}",
                     f"{s.seconds:,.1f}", f"{s.throughput:.3g}", gain(systems, key)))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    table = ["    " + "  ".join(c.ljust(n) for c, n in zip(r, widths)).rstrip() for r in rows]
    return [f"  {w.label}: {any_run.programs:,} programs, {any_run.requests:,} requests, "
            f"{any_run.prompt_tokens / any_run.requests:,.0f} prompt tokens a request on average ({w.source})",
            *table]  # fmt: skip


def account_lines(report: dict) -> list[str]:
    found, lines = report["served"], []
    for workload, systems in found.items():
        if {"cache", "fcfs"} <= set(systems):
            lpm, fcfs = systems["cache"], systems["fcfs"]
            lines.append(f"  {workload}: waiting queue first come first served instead of longest prefix first: hit "
                         f"rate {lpm.hit_rate:.1%} -> {fcfs.hit_rate:.1%}, {gain(systems, 'cache') or '-'} -> "
                         f"{gain(systems, 'fcfs') or '-'} over no cache")  # fmt: skip
    for workload, g in report["granularity"].items():
        lines.append(f"  {workload}: one token a block (SGLang's radix tree) instead of "
                     f"{report['options']['block_size']}: hit rate {g['block_hit_rate']:.1%} -> "
                     f"{g['token_hit_rate']:.1%} (optimal {g['optimal_rate']:.1%}), throughput "
                     f"{g['block_throughput']:.3g} -> {g['token_throughput']:.3g} programs/s")  # fmt: skip
    for workload, m in report.get("memory", {}).items():
        lines.append(f"  {workload}: a KV pool that holds every conversation ({setup.ROOMY_GPU}, same engine) "
                     f"instead of the {report['options']['gpu']}'s: hit rate {m['hit_rate']:.1%} -> "
                     f"{m['roomy_hit_rate']:.1%} (optimal {m['optimal_rate']:.1%}): the rest of the gap is evictions, "
                     "as Theorem 3.1 assumes a cache at least as large as the requests in flight")  # fmt: skip
    return lines


def report_text(report: dict) -> str:
    options = Options(**{**report["options"], "workloads": tuple(report["options"]["workloads"])})
    lines = [
        'Zheng et al., "SGLang: Efficient Execution of Structured Language Model Programs" (NeurIPS 2024): '
        "RadixAttention",
        f"  {setup.PAPER}; code {setup.CODE}",
        f"{setup.MODEL} ({setup.DTYPE}) on a simulated {options.gpu} ({setup.MEM_FRACTION:.0%} of its memory for "
        f"weights and KV), {options.parallel} programs in flight, prefill steps of at most {setup.PREFILL_TOKENS} "
        f"tokens, KV blocks of {options.block_size} tokens; hit rate = cached prompt tokens / prompt tokens (the "
        "paper's); optimal = every prompt token some earlier request computed (Theorem 3.1)",
    ]
    for workload, systems in report["served"].items():
        lines += workload_lines(workload, systems)
    if report["headlines"]:
        lines += ["", headline_table(report["headlines"]),
                  f"(reproduced: within {TOLERANCE:.0%} of the published figure; kept: the reproduced hit rate "
                  "is at least the bottom of the paper's 50-99% range)"]  # fmt: skip
    lines += ["", "what moves the figures, measured (the paper's Fig. 8(c) ablations, on the simulated card):",
              *account_lines(report),
              "  the throughput the cache alone buys: Fig. 8(c) measures it (\"No Cache\" against \"Full "
              "optimizations\", Llama-7B on an A10G) but its bars are an image no copy of the paper here gives as "
              "numbers, so the column 'over no cache' above has no published figure beside it",
              "  the radix tree's own cost (0.2 s of 74.3 s for 100 ShareGPT requests, section 6.3) is not priced: "
              "the simulated clock charges nothing for the books",
              "", "each system as minillm's knobs:",
              *(f"  {k}: {v}" for k, v in setup.SYSTEMS.items()),
              f"  MMLU prompt lengths: EvalScope's per-subject means, {setup.CHARS_PER_TOKEN:g} characters a token "
              f"and the examples {setup.SHARED_SHARE:.0%} of a prompt (assumptions: sglang_setup.py)"]  # fmt: skip
    return "\n".join(lines)


def report_json(report: dict) -> dict:
    served = {w: {k: s.to_dict() for k, s in systems.items()} for w, systems in report["served"].items()}
    return {"paper": "sglang", "source": setup.PAPER, "code": setup.CODE, "options": report["options"],
            "served": served, "headlines": [h.to_dict() for h in report["headlines"]],
            "granularity": report["granularity"], "memory": report.get("memory", {})}  # fmt: skip
