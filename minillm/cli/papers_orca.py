"""`papers orca`: Orca's iteration-level scheduling against FasterTransformer's request-level batching, throughput at
the same median normalized latency, on the simulated clock (minillm/papers/orca*.py)."""

from __future__ import annotations

import argparse


def cmd_orca(args: argparse.Namespace) -> None:
    from minillm.cli.paper_report import print_report
    from minillm.papers.orca import Costs, Options

    options = Options(args.model, args.requests, args.seed, tuple(args.system), args.orca_batch,
                      tuple(args.ft_batch) if args.ft_batch else None, args.bound_ms, tuple(args.rate or ()),
                      args.start_rate, Costs(args.ft_shortest_first, args.pipelined))  # fmt: skip
    print_report("orca", options, args.json)


def add_parser(papers) -> None:
    from minillm.cli.args import positive_float, positive_int
    from minillm.papers import orca as experiment
    from minillm.papers import orca_setup as setup

    s = papers.add_parser("orca", help="Orca (OSDI 2022): 36.9x FasterTransformer's throughput at the same latency, "
                          "GPT-3 175B on 16 A100s (the default: about 30 s here)")  # fmt: skip
    s.add_argument("--model", choices=list(setup.DEPLOYMENTS), default="gpt3-175b", help="the model and its cards "
                   "(Table 1)")  # fmt: skip
    s.add_argument("--requests", type=positive_int, default=experiment.REQUESTS,
                   help=f"requests sampled per run (default {experiment.REQUESTS})")  # fmt: skip
    s.add_argument("--system", nargs="+", choices=list(setup.SYSTEMS), default=list(setup.SYSTEMS))
    s.add_argument("--orca-batch", type=positive_int, default=setup.ORCA_MAX_BS, help="Orca's max_bs (default 32)")
    s.add_argument("--ft-batch", type=positive_int, nargs="+", default=None,
                   help="FasterTransformer's max_bs to try, the best counts (default: (1, 8) for 175B)")  # fmt: skip
    s.add_argument("--bound-ms", type=positive_float, default=None,
                   help="the median normalized latency bound, ms/token (default: the paper's 190 for 175B, else "
                   "twice the simulated orca(128))")  # fmt: skip
    s.add_argument("--rate", type=positive_float, nargs="+", default=None,
                   help="only these arrival rates (req/s), no search")  # fmt: skip
    s.add_argument("--start-rate", type=positive_float, default=1.0, help="where the search starts (req/s)")
    s.add_argument(
        "--ft-shortest-first",
        action="store_true",
        help="FasterTransformer's first iteration at the batch's shortest input, the rest token by token",
    )
    s.add_argument("--pipelined", action="store_true", help="Orca keeps one batch in flight per pipeline stage")
    s.add_argument("--seed", type=int, default=0, help="the trace's seed (lengths and arrivals)")
    s.set_defaults(func=cmd_orca)
