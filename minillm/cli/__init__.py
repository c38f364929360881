"""The one command line: python -m minillm {generate, train, eval, export, run, bench, whatif, calibrate, serve,
load, papers, doctor} (see --help of each). Each group of commands lives in a file of its own, beside what it runs."""

from __future__ import annotations

import argparse
import sys

from minillm.cli import card_commands, doctor, model_commands, papers_commands, run_commands, serve_commands
from minillm.errors import MinillmError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m minillm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for group in (model_commands, run_commands, card_commands, serve_commands, papers_commands, doctor):
        group.add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "threads", None):
        import torch

        torch.set_num_threads(args.threads)
    try:
        args.func(args)
    except MinillmError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
