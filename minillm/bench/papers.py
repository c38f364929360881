"""The papers, reproduced (minillm/papers/): each experiment's published figures beside the simulated clock's, with a
measured account of every figure that does not reproduce.

PAPERS names each paper's bench entry: quick -> (its report as plain data, with "headlines" whose "verdict" the total
counts, and its report as text)."""

from __future__ import annotations

import importlib

from minillm.model.transformer import Transformer

QUICK_REQUESTS = 200  # the post's crowd is 1,000 requests: --quick samples 200 (the report says so)


def default_report(paper: str, options=None) -> tuple[dict, str]:
    """A paper's report (minillm/papers/PAPER_report.py) at the options given, else at its defaults (each a sample
    sized to run within a minute here)."""
    papers_report = importlib.import_module(f"minillm.papers.{paper}_report")
    report = papers_report.reproduce(options or papers_report.Options())
    return papers_report.report_json(report), papers_report.report_text(report)


def at_defaults(paper: str):
    """The bench entry of a paper run at its defaults, quick or not (fewer requests would not load its card)."""
    return lambda quick: default_report(paper)


def bench_anyscale(quick: bool) -> tuple[dict, str]:
    from minillm.papers.anyscale import Options

    return default_report("anyscale", Options(requests=QUICK_REQUESTS) if quick else None)


def bench_distserve(quick: bool) -> tuple[dict, str]:
    from minillm.papers.distserve import Options
    from minillm.papers.distserve_report import report_json, report_text, reproduce

    apps = ("chatbot-13b",) if quick else ("chatbot-13b", "figure-1")  # (about 55 s and 15 s)
    reports = [reproduce(Options(app=app)) for app in apps]
    data = {"paper": "distserve", "apps": {app: report_json(r) for app, r in zip(apps, reports)}}
    data["headlines"] = [h for app in apps for h in data["apps"][app]["headlines"]]
    return data, "\n\n".join(report_text(r) for r in reports)


bench_orca, bench_sarathi, bench_sglang, bench_vllm = (at_defaults(p) for p in ("orca", "sarathi", "sglang", "vllm"))

PAPERS = {
    "anyscale": bench_anyscale,
    "distserve": bench_distserve,
    "orca": bench_orca,
    "sarathi": bench_sarathi,
    "sglang": bench_sglang,
    "vllm": bench_vllm,
}


def bench_papers(model: Transformer, s) -> dict:
    out = {"papers": list(PAPERS), "reproduced": 0, "headlines": 0}
    for name, bench in PAPERS.items():
        data, text = bench(s.quick)
        verdicts = [h["verdict"] for h in data["headlines"]]
        out |= {name: data, f"{name}_text": text}
        out["reproduced"] += sum(v in ("reproduced", "kept") for v in verdicts)
        out["headlines"] += len(verdicts)
    return out


def markdown(r: dict, img) -> list[str]:
    names = r.get("papers", ["anyscale"])
    lines = ["## 23. The papers, reproduced", "",
             "Each paper's experiment on the simulated clock, with minillm's own engine, policies and KV books, its "
             "published figures beside the reproduced ones (`python -m minillm papers NAME` runs any point of its "
             f"sweep). {r['reproduced']} of {r['headlines']} stated figures ({len(names)} papers) reproduce within "
             "35%; what does not is taken apart by measurement below.", ""]  # fmt: skip
    for name in names:
        lines += ["```", r[f"{name}_text"], "```", ""]
    return lines
