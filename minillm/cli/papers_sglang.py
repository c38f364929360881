"""`papers sglang`: SGLang's RadixAttention, the prefix cache's hit rates and the throughput they buy on MMLU 5-shot
and multi-turn chat, on a simulated A10G (minillm/papers/sglang*.py)."""

from __future__ import annotations

import argparse


def cmd_sglang(args: argparse.Namespace) -> None:
    from minillm.cli.paper_report import print_report
    from minillm.papers.sglang import Options

    options = Options(tuple(args.workload), args.requests, args.block_size, args.parallel, args.seed, args.gpu)
    print_report("sglang", options, args.json)


def add_parser(papers) -> None:
    from minillm.cli.args import positive_int
    from minillm.papers import sglang_setup as setup

    s = papers.add_parser("sglang", help="SGLang (NeurIPS 2024): RadixAttention's cache hit rates (50-99%%) and the "
                          "throughput they buy, Llama-2-7B on an A10G (the default: about 20 s here)")  # fmt: skip
    s.add_argument("--workload", nargs="+", choices=list(setup.WORKLOADS), default=list(setup.WORKLOADS),
                   help="the benchmarks to run (default: all three)")  # fmt: skip
    s.add_argument("--requests", type=positive_int, default=None,
                   help="programs per workload (default: the benchmark's, 1,369 MMLU questions of its first 10 "
                   "subjects and 20 chats; MMLU keeps that share of every subject)")  # fmt: skip
    s.add_argument("--block-size", type=positive_int, default=setup.BLOCK,
                   help=f"tokens per KV block, the unit the cache shares (default {setup.BLOCK}; SGLang's radix "
                   "tree: 1). Above 1, the report also runs each workload at 1 to show what sharing whole blocks "
                   "costs")  # fmt: skip
    s.add_argument("--parallel", type=positive_int, default=setup.PARALLEL,
                   help=f"programs in flight, the benchmarks' --parallel (default {setup.PARALLEL})")  # fmt: skip
    s.add_argument("--gpu", default=setup.GPU,
                   help=f"the simulated card (card/hardware.py; default {setup.GPU}, the paper's)")  # fmt: skip
    s.add_argument("--seed", type=int, default=0, help="the prompts' seed (lengths and token ids)")
    s.set_defaults(func=cmd_sglang)
