"""The DistServe experiment's report: each system's goodput search, the headlines beside the paper's, and every
missed headline taken apart by measurement (distserve_account.py)."""

from __future__ import annotations

from dataclasses import asdict

from minillm.papers import distserve_setup as setup
from minillm.papers.distserve import Goodput, Options, app_of, deployment_of, goodputs, slos, systems_of
from minillm.papers.distserve_account import account, account_text, ratio
from minillm.papers.distserve_trace import TRACES, draw
from minillm.papers.sarathi_crowd import median
from minillm.papers.verdict import TOLERANCE, Headline, headline_table


def at_paper_point(options: Options) -> bool:
    """The paper's own setting: its model, cards, placement, trace, SLOs and goal (a headline only there)."""
    app, d = app_of(options), deployment_of(options)
    same = (d.model, d.vllm_tp, d.placement, options.trace or app.trace) == (app.model, app.vllm_tp, app.placement,
                                                                            app.trace)  # fmt: skip
    return same and options.slo_scale == 1 and options.attainment == setup.ATTAINMENT


def measured(figure: str, found: dict[str, Goodput], unit: str) -> float | None:
    if figure == "distserve/vllm":
        return ratio(found)
    g = found.get(figure)
    if g is None or not g.bounded or g.rate == 0:
        return None
    return g.per_gpu * (60 if unit == "req/min" else 1)


def setting(options: Options) -> str:
    d, (ttft_s, tpot_s) = deployment_of(options), slos(options)
    return (f"{d.model}, {options.trace or app_of(options).trace}, TTFT {ttft_s:g} s / TPOT {tpot_s:g} s, vLLM TP"
            f"{d.vllm_tp} vs {d.placement.name}, {options.requests} requests a GPU, {options.prices}")  # fmt: skip


def headlines(options: Options, found: dict[str, Goodput]) -> list[Headline]:
    if not at_paper_point(options):
        return []
    out = []
    for p in (p for p in setup.PUBLISHED if p.app == options.app):
        value = measured(p.figure, found, p.unit)
        if value is not None:
            out.append(Headline(p.what, p.value, value, p.unit, setting(options), f"{setup.PAPER} ({p.where})",
                                p.at_least, about=p.figure))  # fmt: skip
    return out


def reproduce(options: Options) -> dict:
    """The goodput searches, the headlines, and the measured account of the missed ones."""
    found = goodputs(options)
    found_headlines = headlines(options, found)
    missed = [h for h in found_headlines if not h.reproduced_ok]
    accounted = account(options, found, missed) if missed and options.prices == "roofline" else None
    return {"options": asdict(options), "goodputs": found, "headlines": found_headlines, "account": accounted}


def search_lines(found: dict[str, Goodput], quantile: bool) -> list[str]:
    lines = []
    for key, g in found.items():
        if not g.bounded:
            best = f"at least {g.per_gpu:.2f} req/s per GPU: no rate tried missed (more --requests)"
        elif g.rate == 0:
            best = "no rate met the goal"
        else:
            best = f"{g.rate:.3g} req/s on {g.gpus} GPU(s): {g.per_gpu:.2f} req/s per GPU"
        ms = lambda s: "-" if s is None else f"{s * 1e3:.0f}"  # noqa: E731
        tried = ", ".join(f"{p.rate:.3g} ({p.attainment:.0%}, {ms(p.p90_ttft_s)}/{ms(p.p90_tpot_s)} ms)"
                          for p in g.points)  # fmt: skip
        lines += [f"  {key}: goodput {best}",
                  f"    rates tried (share meeting both, P90 TTFT/TPOT): {tried}"]  # fmt: skip
    return lines


def crowd_line(options: Options) -> str:
    trace = options.trace or app_of(options).trace
    crowd = draw(trace, options.requests, options.seed)
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return (f"  crowd: {TRACES[trace]}; {options.requests} requests a GPU (the artifact's 100), seed {options.seed}: "
            f"prompt median {median(crowd.prompts):.0f} / mean {mean(crowd.prompts):.0f}, reply median "
            f"{median(crowd.outputs):.0f} / mean {mean(crowd.outputs):.0f} tokens; Poisson arrivals")  # fmt: skip


def report_text(report: dict) -> str:
    options = Options(**report["options"])
    app, d, (ttft_s, tpot_s) = app_of(options), deployment_of(options), slos(options)
    found = report["goodputs"]
    goal = (f"P90 TTFT <= {ttft_s:g} s and P90 TPOT <= {tpot_s:g} s" if app.quantile else
            f"{options.attainment:.0%} of requests with TTFT <= {ttft_s:g} s and TPOT <= {tpot_s:g} s")  # fmt: skip
    lines = [
        'Zhong et al., "DistServe: Disaggregating Prefill and Decoding for Goodput-optimized LLM Serving" (OSDI 2024)',
        f"  {setup.PAPER}",
        f"{options.app}: {d.model} ({setup.DTYPE}) on simulated {setup.GPU}; vLLM on {d.vllm_tp} card(s) against "
        f"DistServe's {d.placement.name}, the KV over {d.link}; steps priced by "
        + ("the roofline" if options.prices == "roofline" else "DistServe's measured profiles (--prices paper)"),
        crowd_line(options),
        f"goodput: the highest rate with {goal} (SLO scale {options.slo_scale:g}), per GPU; a search from 1 req/s a "
        "GPU, doubling then bisecting to 5%",
        *search_lines(found, app.quantile is not None),
    ]
    if "prefill" in found and "decode" in found and all(found[k].bounded for k in ("prefill", "decode")):
        ideal = min(2 * found["prefill"].per_gpu, found["decode"].per_gpu) / 3
        lines.append(f"  the paper's ideal 2P1D from the phases alone: min(2 x {found['prefill'].per_gpu:.2f}, "
                     f"{found['decode'].per_gpu:.2f}) / 3 = {ideal:.2f} req/s per GPU (the paper: 3.3)")  # fmt: skip
    lines.append("")
    if report["headlines"]:
        lines += [headline_table(report["headlines"]),
                  f"(reproduced: within {TOLERANCE:.0%}; kept: the bound holds. Figure 1's SLO lines are read off its "
                  "plot, distserve_setup.py)"]  # fmt: skip
    elif (multiple := ratio(found)) is not None:
        lines.append(f"DistServe over vLLM, per-GPU goodput: {multiple:.2f}x (the paper states no figure here)")
    lines += ["", "stated, not run here:"]
    lines += [f"  {what} ({where}): needs {why}" for what, where, why in setup.NOT_RUN]
    if report["account"]:
        lines += ["", account_text(report["account"])]
    return "\n".join(lines)


def report_json(report: dict) -> dict:
    found = {k: {"gpus": g.gpus, "rate": g.rate, "per_gpu": g.per_gpu, "bounded": g.bounded,
                 "points": [asdict(p) for p in g.points]} for k, g in report["goodputs"].items()}  # fmt: skip
    return {"paper": "distserve", "source": setup.PAPER, "code": setup.CODE, "options": report["options"],
            "systems": list(systems_of(Options(**report["options"]))), "goodputs": found,
            "headlines": [h.to_dict() for h in report["headlines"]], "account": report["account"]}  # fmt: skip
