"""`papers NAME`: a paper's experiment on the simulated clock, its published figures beside the reproduced ones
(minillm/papers/)."""

from __future__ import annotations

import argparse
import importlib
import sys

PAPER_PARSERS: tuple[str, ...] = (
    "papers_distserve",
    "papers_orca",
    "papers_sarathi",
    "papers_sglang",
    "papers_vllm",
)  # modules minillm.cli.NAME of the other papers, each with add_parser(papers)


def cmd_anyscale(args: argparse.Namespace) -> None:
    from minillm.cli.paper_report import print_report
    from minillm.papers.anyscale import Options

    options = Options(tuple(args.max_tokens), args.requests, tuple(args.system), args.seed, args.mechanism_only,
                      args.static_batch)  # fmt: skip
    print_report("anyscale", options, args.json)


def seats(text: str) -> int | str:
    """--static-batch: a number of seats, or "fit" (as many as the card's KV memory holds)."""
    from minillm.cli.args import positive_int

    return text if text == "fit" else positive_int(text)


def add_commands(sub) -> None:
    from minillm.cli.args import positive_int
    from minillm.papers import anyscale_setup as setup

    p = sub.add_parser("papers", help="a serving paper's experiment on the simulated clock, beside what it published")
    papers = p.add_subparsers(dest="paper", required=True)
    a = papers.add_parser("anyscale", help="Anyscale's continuous batching post (2023): 23x, 8x and 4x over naive "
                          "static batching, OPT-13B on an A100 40GB (the default: about 50 s here)")  # fmt: skip
    a.add_argument("--max-tokens", type=positive_int, nargs="+", default=list(setup.MAX_TOKENS),
                   help="the cap on reply lengths, one run per value (default: the post's 32 128 512 1536; the "
                   "headlines are read at 1536)")  # fmt: skip
    a.add_argument("--requests", type=positive_int, default=setup.REQUESTS,
                   help=f"requests in the crowd (default {setup.REQUESTS}, the post's)")  # fmt: skip
    a.add_argument("--system", nargs="+", choices=list(setup.SYSTEMS), default=list(setup.SYSTEMS),
                   help="the systems to run (naive static always runs: every multiple is over it)")  # fmt: skip
    a.add_argument("--static-batch", type=seats, default=None,
                   help="seats of the static systems: a number, or fit (as many rows of prompt + max tokens as the "
                   "card's KV memory holds); default: the benchmark's, 16/12/8/4 for max 32/128/512/1536")  # fmt: skip
    a.add_argument("--mechanism-only", action="store_true",
                   help="every system priced as a serving engine, without the costs its code and the benchmark's "
                   "harness add, every reply its own length: the batching mechanism alone")  # fmt: skip
    a.add_argument("--seed", type=int, default=0, help="the reply lengths' seed")
    a.set_defaults(func=cmd_anyscale)
    for name in PAPER_PARSERS:
        importlib.import_module(f"minillm.cli.{name}").add_parser(papers)
    for paper in papers.choices.values():  # every paper speaks JSON, and its runs can be saved for the step player
        paper.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
        paper.add_argument("--save-traces", metavar="FOLDER", default=None,
                           help="write every run's trace there (NAME.json) for the app's step player (\"replay a "
                           "saved trace\"); every step is recorded: sample the crowd (e.g. --requests 40)")  # fmt: skip
        paper.set_defaults(func=saving_traces_of(paper.get_default("func")))


def saving_traces_of(command):
    """The paper's command, run inside papers/traces.py's saving_traces when --save-traces asks."""

    def run(args: argparse.Namespace) -> None:
        if not args.save_traces:
            return command(args)
        from minillm.papers.traces import saving_traces

        with saving_traces(args.save_traces) as written:
            command(args)
        print(f"{len(written)} traces written to {args.save_traces} (the app: replay a saved trace)", file=sys.stderr)

    return run
