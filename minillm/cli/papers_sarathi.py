"""`papers sarathi`: Sarathi-Serve's capacity under a P99 time-between-tokens SLO, chunked prefills against vLLM's
prefill-first scheduler, on the simulated clock (minillm/papers/sarathi*.py)."""

from __future__ import annotations

import argparse


def cmd_sarathi(args: argparse.Namespace) -> None:
    from minillm.cli.paper_report import print_report
    from minillm.papers.sarathi import Options

    options = Options(args.model, args.trace, args.slo, args.budget, args.requests, args.seed, tuple(args.system),
                      args.start_rate, args.host_overhead)  # fmt: skip
    print_report("sarathi", options, args.json)


def add_parser(papers) -> None:
    from minillm.cli.args import positive_float, positive_int
    from minillm.papers import sarathi as experiment
    from minillm.papers import sarathi_setup as setup

    s = papers.add_parser("sarathi", help="Sarathi-Serve (OSDI 2024): 2.6x the serving capacity of vLLM under a P99 "
                          "TBT SLO, Mistral-7B on an A100 (the default: about 20 s here)")  # fmt: skip
    s.add_argument("--model", choices=list(setup.DEPLOYMENTS), default="mistral-7b",
                   help="the model and its cards (Table 1)")  # fmt: skip
    s.add_argument("--trace", choices=list(setup.TRACES), default="openchat_sharegpt4",
                   help="the lengths' trace (Table 2; default openchat_sharegpt4)")  # fmt: skip
    s.add_argument("--slo", default="strict",
                   help="the P99 time-between-tokens target: strict or relaxed (Table 3: 0.1 s and 0.5 s for "
                   "Mistral-7B), or seconds (default strict)")  # fmt: skip
    s.add_argument("--budget", type=positive_int, default=None,
                   help="Sarathi-Serve's token budget (default: the paper's, 512 strict, 2048 relaxed)")  # fmt: skip
    s.add_argument("--requests", type=positive_int, default=experiment.REQUESTS,
                   help=f"requests sampled per run (default {experiment.REQUESTS}; the paper's "
                   f"{setup.REQUESTS:,})")  # fmt: skip
    s.add_argument("--system", nargs="+", choices=list(setup.SYSTEMS), default=list(setup.SYSTEMS),
                   help="the systems to search (the ratio needs both)")  # fmt: skip
    s.add_argument("--start-rate", type=positive_float, default=1.0,
                   help="where the search over rate starts, requests per second (default 1)")  # fmt: skip
    s.add_argument("--host-overhead", action="store_true",
                   help="every step also pays the host's measured time around it (Vidur's profile of the same "
                   "engine: schedule, sampler, inputs, outputs)")  # fmt: skip
    s.add_argument("--seed", type=int, default=0, help="the crowd's seed (lengths and arrivals)")
    s.set_defaults(func=cmd_sarathi)
