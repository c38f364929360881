"""The Orca experiment's report: each system's capacity search, the headline beside the paper's, and a missed headline
taken apart by measurement: FasterTransformer's first iteration at the shortest input (orca_ft.py), then Orca's
batches in flight, one per pipeline stage, each searched again and the multiple shown moving."""

from __future__ import annotations

from dataclasses import asdict, replace

from minillm.papers import orca_setup as setup
from minillm.papers.orca import Capacity, Costs, Options, bound_of, capacities, deployment_of, micro_ms
from minillm.papers.verdict import TOLERANCE, Headline, headline_table


def ratio(found: dict[str, Capacity]) -> float | None:
    if {"orca", "ft"} <= set(found) and found["ft"].rate > 0 and all(c.bounded for c in found.values()):
        return found["orca"].rate / found["ft"].rate
    return None


def headlines(options: Options, found: dict[str, Capacity]) -> list[Headline]:
    published = next((p for p in setup.PUBLISHED if p.model == options.model), None)
    multiple, deployment = ratio(found), deployment_of(options)
    at_paper_bound = options.bound_ms in (None, deployment.bound_ms) and not options.rates
    if published is None or multiple is None or not at_paper_bound:
        return []
    setting = (f"{options.model}, {deployment.pp} x {deployment.tp} A100-40GB, median normalized latency "
               f"{bound_of(options):g} ms, {options.requests:,} requests")  # fmt: skip
    return [Headline("Orca over FasterTransformer, throughput at the same latency", published.multiple, multiple, "x",
                     setting, published.where, about="orca/ft")]  # fmt: skip


def reproduce(options: Options) -> dict:
    found = capacities(options)
    found_headlines = headlines(options, found)
    missed = [h for h in found_headlines if not h.reproduced_ok and options.costs == Costs()]
    return {
        "options": asdict(options),
        "capacities": found,
        "headlines": found_headlines,
        "micro_ms": micro_ms(deployment_of(options)),
        "accounts": [account(options, found, h) for h in missed],
    }


def account(options: Options, found: dict[str, Capacity], h: Headline) -> dict:
    """Each cost searched again on the system it touches (the other's capacity stands), then both together."""
    ft = capacities(replace(options, systems=("ft",)), Costs(shortest_first=True))["ft"]
    steps = [("FasterTransformer's first iteration at the batch's shortest input, the rest one token an iteration "
              "(section 6.2)", found["orca"].rate, ft.rate)]  # fmt: skip
    if deployment_of(options).pp > 1:
        orca = capacities(replace(options, systems=("orca",)), Costs(pipelined=True))["orca"]
        steps += [
            (
                "+ Orca's batches in flight, one per pipeline stage (Figure 8a; FasterTransformer's (max_bs, mbs) "
                "= (1, 1) or (8, 8) is one microbatch a batch: its stages take turns)",
                orca.rate,
                ft.rate,
            )
        ]
    moved = [{"cost": c, "orca": o, "ft": f, "ratio": o / f if f else None} for c, o, f in steps]
    return {"headline": h.name, "mechanism": {k: c.rate for k, c in found.items()}, "mechanism_ratio": h.reproduced,
            "steps": moved, "published": h.published}  # fmt: skip


def account_text(a: dict) -> str:
    lines = [f"{a['headline']}: measured",
             f"  the mechanism alone: orca {a['mechanism']['orca']:.3g}, ft {a['mechanism']['ft']:.3g} req/s, "
             f"{a['mechanism_ratio']:.2f}x"]  # fmt: skip
    for step in a["steps"]:
        r = step["ratio"]
        verdict = "" if r is None else ("within" if abs(r / a["published"] - 1) <= TOLERANCE else "not within")
        lines.append(
            f"  {step['cost']}: orca {step['orca']:.3g}, ft {step['ft']:.3g} req/s, "
            + (f"{r:.2f}x, {verdict} {TOLERANCE:.0%} of the paper's {a['published']:g}x" if r else "no rate")
        )
    return "\n".join(lines)


def search_lines(found: dict[str, Capacity], bound: float) -> list[str]:
    lines = []
    for key, cap in found.items():
        tried = ", ".join(f"{p.rate:.3g} ({p.median_ms:.0f} ms, {p.throughput:.3g}{'' if p.meets(bound) else ' x'})"
                          for p in cap.points)  # fmt: skip
        best = f"capacity {cap.rate:.3g} req/s at max_bs {cap.max_bs}" if cap.rate else "no rate met the bound"
        if not cap.bounded:
            best = f"capacity at least {cap.rate:.3g} req/s (no rate tried missed: more --requests)"
        lines += [f"  {key}: {best}", f"    rates tried (median normalized latency, throughput; x: missed): {tried}"]
    return lines


def report_text(report: dict) -> str:
    o = report["options"]
    options = Options(**{**o, "systems": tuple(o["systems"]), "rates": tuple(o["rates"]), "costs": Costs(**o["costs"]),
                         "ft_batches": tuple(o["ft_batches"]) if o["ft_batches"] else None})  # fmt: skip
    d, bound = deployment_of(options), bound_of(options)
    costs = [k for k, on in o["costs"].items() if on]
    lines = ['Yu et al., "Orca: A Distributed Serving System for Transformer-Based Generative Models" (OSDI 2022)',
             f"  {setup.PAPER}",
             f"{options.model} (fp16) on {d.pp * d.tp} simulated {d.gpu} ({d.pp} pipeline stages x {d.tp} tensor "
             f"parallel); trace: input U{setup.INPUT_TOKENS}, max_gen_tokens U{setup.GEN_TOKENS}, no EOS, Poisson "
             f"arrivals; {options.requests:,} requests sampled (seed {options.seed}; the paper's trace length is "
             "not said)" + (f"; costs on: {', '.join(costs)}" if costs else ""),
             f"  simulated orca(128) (Figure 9: 128 input tokens, 32 generated, batch 1): {report['micro_ms']:.1f} ms "
             "per generated token"
             + ("; the paper's 190 ms bound is twice its own, 95 ms" if d.bound_ms else ""),
             f"capacity: the highest rate whose median normalized latency is at most {bound:.3g} ms and whose "
             "throughput keeps up (>= 85% of the rate); Orca max_bs "
             f"{options.orca_batch}, FasterTransformer's best of max_bs "
             f"{', '.join(map(str, options.ft_batches or d.ft_batches))}",
             *search_lines(report["capacities"], bound), ""]  # fmt: skip
    if report["headlines"]:
        lines += [
            headline_table(report["headlines"]),
            f"(reproduced: within {TOLERANCE:.0%}; the paper: ft 0.185, orca 6.81 req/s at 190 ms)",
        ]
    elif (multiple := ratio(report["capacities"])) is not None:
        lines.append(f"Orca over FasterTransformer: {multiple:.2f}x (the paper states no figure at this point: "
                     "its only stated multiple is 175B's 36.9x at 190 ms)")  # fmt: skip
    lines += [
        "",
        "each system as minillm's knobs:",
        *(f"  {k}: {v}" for k, v in setup.SYSTEMS.items()),
        "  every step priced by the roofline (card/enginecost.py); dense attention",
    ]
    if report["accounts"]:
        lines += ["", "what does not reproduce, measured:", *(account_text(a) for a in report["accounts"])]
    return "\n".join(lines)


def report_json(report: dict) -> dict:
    caps = {k: {"capacity": c.rate, "max_bs": c.max_bs, "points": [asdict(p) for p in c.points]}
            for k, c in report["capacities"].items()}  # fmt: skip
    return {"paper": "orca", "source": setup.PAPER, "options": report["options"], "capacities": caps,
            "micro_ms": report["micro_ms"], "headlines": [h.to_dict() for h in report["headlines"]],
            "accounts": report["accounts"]}  # fmt: skip
