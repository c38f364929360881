"""`papers vllm`: the vLLM / PagedAttention paper (Kwon et al., SOSP 2023) on the simulated clock
(minillm/papers/vllm_*.py)."""

from __future__ import annotations

import argparse


def cmd_vllm(args: argparse.Namespace) -> None:
    from minillm.cli.paper_report import print_report
    from minillm.papers.vllm_report import Options

    options = Options(args.model, args.gpu, args.requests, args.seed, args.rate, args.slo, tuple(args.system),
                      not args.rate_only, args.step_ms)  # fmt: skip
    print_report("vllm", options, args.json)


def add_parser(papers) -> None:
    from minillm.cli.args import non_negative_float, positive_float, positive_int
    from minillm.papers import vllm_setup as setup

    p = papers.add_parser("vllm", help="the vLLM / PagedAttention paper (SOSP 2023): KV memory wasted by contiguous "
                          "reservations, and 2-4x the request rate at the same latency; OPT-13B on an A100 40GB, a "
                          "ShareGPT-like trace (the default: about 30 s here)")  # fmt: skip
    p.add_argument("--model", default=setup.MODEL_CONFIG, help="a shipped model config (default: the paper's opt-13b; "
                   "the published figures are OPT-13B's)")  # fmt: skip
    p.add_argument("--gpu", default=setup.GPU, help=f"the simulated card (default {setup.GPU}, the paper's)")
    p.add_argument("--requests", type=positive_int, default=setup.REQUESTS,
                   help=f"requests in the sampled trace (default {setup.REQUESTS}; the paper's traces are an hour "
                   "long)")  # fmt: skip
    p.add_argument(
        "--rate",
        type=positive_float,
        default=setup.FIG13_RATE,
        help="req/s of the run that measures the batch and the KV memory (default 2, Fig. 13a's)",
    )
    p.add_argument(
        "--slo",
        type=positive_float,
        default=setup.LATENCY_SLO,
        help=f"the normalized latency (s/token) a sustained rate stays under (default {setup.LATENCY_SLO})",
    )
    p.add_argument(
        "--system",
        nargs="+",
        choices=list(setup.SYSTEMS),
        default=list(setup.SYSTEMS),
        help="the systems to run (vLLM always runs: every multiple is of it)",
    )
    p.add_argument(
        "--rate-only", action="store_true", help="only the run at --rate (no search for each system's sustained rate)"
    )
    p.add_argument(
        "--step-ms",
        type=non_negative_float,
        default=0.0,
        help="milliseconds added to every step of every system (the measured account's cost; 0: none)",
    )
    p.add_argument("--seed", type=int, default=0, help="the trace's seed (lengths and arrivals)")
    p.set_defaults(func=cmd_vllm)
