"""The papers, reproduced (minillm/papers/): each experiment's published figures beside the simulated clock's, with a
measured account of every figure that does not reproduce.

PAPERS names each paper's bench entry: quick -> (its report as plain data, with "headlines" whose "verdict" the total
counts, and its report as text)."""

from __future__ import annotations

from minillm.model.transformer import Transformer

QUICK_REQUESTS = 200  # the post's crowd is 1,000 requests: --quick samples 200 (the report says so)


def bench_anyscale(quick: bool) -> tuple[dict, str]:
    from minillm.papers.anyscale import Options
    from minillm.papers.anyscale_report import report_json, report_text, reproduce

    report = reproduce(Options(requests=QUICK_REQUESTS) if quick else Options())
    return report_json(report), report_text(report)


def bench_sarathi(quick: bool) -> tuple[dict, str]:
    from minillm.papers.sarathi import Options
    from minillm.papers.sarathi_report import report_json, report_text, reproduce

    report = reproduce(Options())  # quick or not: the default sample (fewer requests never load the card to 2 s)
    return report_json(report), report_text(report)


def bench_vllm(quick: bool) -> tuple[dict, str]:
    from minillm.papers.vllm_report import Options, report_json, report_text, reproduce

    report = reproduce(Options())  # quick or not: the default sample (200 requests, about 30 s)
    return report_json(report), report_text(report)


def bench_orca(quick: bool) -> tuple[dict, str]:
    from minillm.papers.orca import Options
    from minillm.papers.orca_report import report_json, report_text, reproduce

    report = reproduce(Options())  # quick or not: the default sample (400 requests, about 30 s)
    return report_json(report), report_text(report)


def bench_sglang(quick: bool) -> tuple[dict, str]:
    from minillm.papers.sglang import Options
    from minillm.papers.sglang_report import report_json, report_text, reproduce

    report = reproduce(Options())  # quick or not: the benchmarks' own programs (about 20 s)
    return report_json(report), report_text(report)


def bench_distserve(quick: bool) -> tuple[dict, str]:
    from minillm.papers.distserve import Options
    from minillm.papers.distserve_report import report_json, report_text, reproduce

    apps = ("chatbot-13b",) if quick else ("chatbot-13b", "figure-1")  # (about 55 s and 15 s)
    reports = [reproduce(Options(app=app)) for app in apps]
    data = {"paper": "distserve", "apps": {app: report_json(r) for app, r in zip(apps, reports)}}
    data["headlines"] = [h for app in apps for h in data["apps"][app]["headlines"]]
    return data, "\n\n".join(report_text(r) for r in reports)


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
