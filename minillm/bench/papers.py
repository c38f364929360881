"""The papers, reproduced (minillm/papers/): each experiment's published figures beside the simulated clock's, with a
measured account of every figure that does not reproduce. One paper so far: Anyscale's continuous batching post."""

from __future__ import annotations

from minillm.model.transformer import Transformer

QUICK_REQUESTS = 200  # the post's crowd is 1,000 requests: --quick samples 200 (the report says so)


def bench_papers(model: Transformer, s) -> dict:
    from minillm.papers.anyscale import Options
    from minillm.papers.anyscale_report import report_json, report_text, reproduce

    report = reproduce(Options(requests=QUICK_REQUESTS) if s.quick else Options())
    verdicts = [h.verdict for h in report["headlines"]]
    return {"anyscale": report_json(report), "anyscale_text": report_text(report),
            "reproduced": sum(v in ("reproduced", "kept") for v in verdicts), "headlines": len(verdicts)}  # fmt: skip


def markdown(r: dict, img) -> list[str]:
    return ["## 23. The papers, reproduced", "",
            "Each paper's experiment on the simulated clock, with minillm's own engine, policies and KV books, its "
            "published figures beside the reproduced ones (`python -m minillm papers NAME` runs any point of its "
            f"sweep). {r['reproduced']} of {r['headlines']} of the Anyscale post's stated figures reproduce within "
            "35%; what does not is taken apart by measurement below.", "",
            "```", r["anyscale_text"], "```", ""]  # fmt: skip
