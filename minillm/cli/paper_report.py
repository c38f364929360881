"""What every `papers NAME` command does once its options are read: run the experiment and print its report."""

from __future__ import annotations


def print_report(paper: str, options, as_json: bool) -> None:
    """Run a paper's experiment at these options and print its report, or (--json) the same as one JSON object
    (bench's default_report: the bench entries render it the same way)."""
    import json

    from minillm.bench.papers import default_report

    data, text = default_report(paper, options)
    print(json.dumps(data) if as_json else text)
