"""`papers distserve`: DistServe's per-GPU goodput, prefill and decoding disaggregated against vLLM's colocation, on
the simulated clock (minillm/papers/distserve*.py)."""

from __future__ import annotations

import argparse


def cmd_distserve(args: argparse.Namespace) -> None:
    from minillm.cli.paper_report import print_report
    from minillm.papers.distserve import Options

    options = Options(args.app, args.model, args.slo_scale, args.requests, args.seed,
                      tuple(args.system) if args.system else None, args.prices, args.vllm_tp, args.prefill_tp,
                      args.decode_tp, args.prefill, args.decode, args.trace, args.attainment)  # fmt: skip
    print_report("distserve", options, args.json)


def add_parser(papers) -> None:
    from minillm.cli.args import positive_float, positive_int
    from minillm.papers import distserve_setup as setup
    from minillm.papers.distserve_cost import PRICES
    from minillm.papers.distserve_systems import SYSTEMS
    from minillm.papers.distserve_trace import TRACES

    d = papers.add_parser("distserve", help="DistServe (OSDI 2024): per-GPU goodput of prefill/decode "
                          "disaggregation against vLLM, OPT-13B on A100 80GB (the default: about 55 s)")  # fmt: skip
    d.add_argument("--app", choices=list(setup.APPS), default="chatbot-13b",
                   help="chatbot-13b: Table 1's OPT-13B chatbot on ShareGPT (2 prefill cards + 1 decoding card "
                   "against vLLM on 1); figure-1: section 1's 512-in / 64-out example (vLLM, each phase alone, "
                   "2 prefill + 1 decoding card)")  # fmt: skip
    d.add_argument("--model", default=None, help="a model of minillm/card/models (default: the app's, opt-13b)")
    d.add_argument("--slo-scale", type=positive_float, default=1.0,
                   help="both SLOs times this (section 6.2's SLO Scale; default 1)")  # fmt: skip
    d.add_argument("--attainment", type=positive_float, default=setup.ATTAINMENT,
                   help="the share of requests that must meet both SLOs (default 0.9)")  # fmt: skip
    d.add_argument(
        "--requests",
        type=positive_int,
        default=setup.REQUESTS_PER_GPU,
        help=f"requests sampled per GPU of each system (default {setup.REQUESTS_PER_GPU}, the artifact's)",
    )
    d.add_argument(
        "--system",
        nargs="+",
        choices=list(SYSTEMS),
        default=None,
        help="the systems to search (default: the app's; the ratio needs vllm and distserve)",
    )
    d.add_argument("--prices", choices=list(PRICES), default="roofline",
                   help="each step's price: minillm's roofline (default), or DistServe's profiles of vLLM and of "
                   "its own engine (OPT-13B only)")  # fmt: skip
    d.add_argument("--vllm-tp", type=positive_int, default=None, help="vLLM's tensor parallelism (paper: 1)")
    d.add_argument("--prefill-tp", type=positive_int, default=None, help="a prefill instance's cards (paper: 2)")
    d.add_argument("--decode-tp", type=positive_int, default=None, help="a decoding instance's cards (paper: 1)")
    d.add_argument("--prefill", type=positive_int, default=None, help="prefill instances (default 1; figure-1: 2)")
    d.add_argument("--decode", type=positive_int, default=None, help="decoding instances (default 1)")
    d.add_argument("--trace", choices=list(TRACES), default=None, help="the lengths (default: the app's)")
    d.add_argument("--seed", type=int, default=0, help="the crowd's seed (lengths and arrivals)")
    d.set_defaults(func=cmd_distserve)
