"""Running workloads through the engine: `run` (one workload, summarized) and `bench` (every claim measured)."""

from __future__ import annotations

import argparse
import time

from minillm.card.simulate import MAX_NUM_SEQS
from minillm.cli.args import (
    compile_arg,
    load_model_from,
    model_args,
    non_negative_int,
    positive_float,
    positive_int,
    sampling_args,
)
from minillm.errors import ConfigError


def seats(text: str) -> int:
    """--slots: 1 to MAX_NUM_SEQS (vLLM's default cap on sequences per step; the simulated pool's books and the
    trace grow with it, and no card here serves more at once)."""
    value = positive_int(text)
    if value > MAX_NUM_SEQS:
        raise argparse.ArgumentTypeError(f"at most {MAX_NUM_SEQS} seats, got {value}")
    return value


def replies_flag(value) -> int:
    """--n (run and load): the replies each request asks for, checked in the command so a bad one gets one line."""
    from minillm.layers.replies import MAX_REPLIES

    try:
        n = int(value)
    except ValueError:
        n = None
    if n is None or not 1 <= n <= MAX_REPLIES:
        raise ConfigError(f"--n is the replies to each request: a whole number from 1 to {MAX_REPLIES}, got {value}")
    return n


def conversations_of(args: argparse.Namespace):
    """The multi-turn workload's knobs from the flags (None for any other workload)."""
    if args.workload != "multi-turn":
        return None
    from minillm.runs.conversations import ConversationKnobs

    return ConversationKnobs(users=args.requests, rate_per_s=args.rate_per_s or 2.0, think_s=args.think_s,
                             seed=args.seed)  # fmt: skip


def cmd_run(args: argparse.Namespace) -> None:
    import json

    from minillm.config import Sampling
    from minillm.runs.classes import ClassTargets
    from minillm.runs.metrics import summarize
    from minillm.runs.run import run_workload
    from minillm.runs.workload import SIMULATED_WORKLOADS, ChatKnobs

    if args.workload in SIMULATED_WORKLOADS and not args.simulate:
        raise ConfigError(
            f"{args.workload} has prompts longer than the tiny model's context (lengths only): "
            f"run it on a simulated card, e.g. --simulate llama-3.1-8b --gpu rtx-4090"
        )
    if (args.prompt_len or args.reply_len) and args.workload not in SIMULATED_WORKLOADS:
        raise ConfigError(
            f"--prompt-len and --reply-len fix the lengths of a simulated card's workload "
            f"({', '.join(SIMULATED_WORKLOADS)}), not of {args.workload}: e.g. --simulate llama-3.1-8b "
            "--workload azure-conv --prompt-len 128 --reply-len 128"
        )
    if args.simulate and args.tp > 1:
        raise ConfigError("--tp splits the tiny model across processes here; a real model's tensor parallelism on "
                          "real cards is priced by `whatif --tp N` instead")  # fmt: skip
    args.n = replies_flag(args.n)
    model = simulated_runner(args) if args.simulate else load_model_from(args)
    knobs = ChatKnobs(requests=args.requests, rate=args.rate, spread=args.spread, force_lengths=args.force_lengths,
                      rate_per_s=args.rate_per_s, prompt_len=args.prompt_len, reply_len=args.reply_len)  # fmt: skip
    started = time.perf_counter()
    trace = run_workload(
        model, args.workload, args.scheduler, args.kv, args.slots, args.num_blocks, args.block_size, knobs,
        args.seed, progress=not args.json, token_budget=args.token_budget, prefix_caching=args.prefix_caching,
        sampling=Sampling(args.temperature, args.top_p, args.top_k) if args.temperature > 0 else None,
        speculate=args.speculate, drafter=args.drafter, tp=args.tp, victim=args.victim,
        targets=ClassTargets(args.chat_ttft_s, args.chat_tpot_s, args.batch_deadline_s), n=args.n,
        host_blocks=args.host_blocks, swap_above=args.swap_above, conversations=conversations_of(args),
    )  # fmt: skip
    if args.trace:
        trace.save(args.trace)
    summary = summarize(trace) | {"run_wall_s": time.perf_counter() - started, "n": args.n}
    if args.simulate:  # the steps' seconds are the simulated clock's, not this machine's: say so
        summary = {("simulated_s" if key == "wall_s" else key): value for key, value in summary.items()}
    if args.json:
        print(json.dumps(summary))
        return
    from minillm.cli.run_summary import run_summary_text

    print(run_summary_text(args, trace.config, summary))


def simulated_runner(args: argparse.Namespace):
    from minillm.card.hardware import get_device
    from minillm.card.modelspec import load_spec
    from minillm.card.simulate import SimulatedRunner

    return SimulatedRunner(load_spec(args.simulate), get_device(args.gpu), args.dtype, args.kv_dtype)


def cmd_bench(args: argparse.Namespace) -> None:
    import json
    import os
    from pathlib import Path

    from minillm.bench.common import BenchSettings
    from minillm.bench.report import markdown, plot_all
    from minillm.bench.suite import BENCHES, run_benchmarks

    if args.roofline:
        args.only = [*(args.only or []), "roofline"]
    if args.vllm_python:  # (the peer entry reads it: bench/peer.py)
        os.environ["MINILLM_VLLM_PYTHON"] = args.vllm_python
    unknown = set(args.only or []) - set(BENCHES)
    if unknown:
        raise ConfigError(f"unknown benchmark(s) {sorted(unknown)}; choose from {', '.join(BENCHES)}")
    model = load_model_from(args, default_forward="plain")  # (the entries measure the model as written)
    results = run_benchmarks(model, BenchSettings(quick=args.quick), args.only, progress=not args.json)
    command = "python -m minillm bench" + " --quick" * args.quick + f" --device {args.device}" * (args.device != "auto")
    command += " --compile" * args.compile
    command += f" --vllm-python {args.vllm_python}" if args.vllm_python else ""
    if args.out:
        out = Path(args.out)
        plot_all(results, out)
        (out / "results.json").write_text(json.dumps(results, indent=2))
    if args.markdown:
        plots = None if not args.out else os.path.relpath(args.out, Path(args.markdown).resolve().parent)
        Path(args.markdown).write_text("# Benchmarks\n\n" + markdown(results, command, plots) + "\n")
    if args.json:
        print(json.dumps(results))
    else:
        print(markdown(results, command))


def add_commands(sub) -> None:
    from minillm.engine.scheduler import DEFAULT_TOKEN_BUDGET
    from minillm.layers.policies import POLICIES, VICTIMS
    from minillm.layers.replies import MAX_REPLIES
    from minillm.runs.classes import ClassTargets
    from minillm.runs.workload import ALL_WORKLOADS

    p = sub.add_parser("run", help="serve a workload through the engine and summarize it")
    p.add_argument("--workload", default="seed-story", choices=ALL_WORKLOADS,
                   help="azure-conv and azure-code need --simulate")  # fmt: skip
    p.add_argument("--scheduler", default="continuous", choices=POLICIES,
                   help="who is seated: static or continuous batching (first come, first served), or by priority "
                   "or deadline (earliest first): the mixed workload's classes say theirs")  # fmt: skip
    p.add_argument("--victim", default=None, choices=VICTIMS,
                   help="whom priority or deadline preempts (default: lowest-priority, latest-due)")  # fmt: skip
    p.add_argument("--chat-ttft-s", type=positive_float, default=ClassTargets.chat_ttft_s,
                   help="mixed workload: a chat user's time-to-first-token target, seconds")  # fmt: skip
    p.add_argument("--chat-tpot-s", type=positive_float, default=ClassTargets.chat_tpot_s,
                   help="mixed workload: a chat user's time-per-output-token target, seconds")  # fmt: skip
    p.add_argument("--batch-deadline-s", type=positive_float, default=ClassTargets.batch_deadline_s,
                   help="mixed workload: a batch job's whole reply within this many seconds")  # fmt: skip
    p.add_argument("--kv", default="paged", choices=["paged", "contiguous"])
    p.add_argument(
        "--slots",
        type=seats,
        default=None,
        help=f"seats, at most {MAX_NUM_SEQS} (default 4 for seed-story, else 8; simulated: the users the KV memory "
        "holds)",
    )
    p.add_argument("--num-blocks", type=positive_int, default=None, help="paged pool size (default: same memory)")
    p.add_argument("--block-size", type=positive_int, default=16)
    p.add_argument(
        "--token-budget",
        type=non_negative_int,
        default=None,
        help=f"tokens per step: decode rows first, prompts in chunks (default {DEFAULT_TOKEN_BUDGET}; on a simulated "
        "card vLLM's server default: 8192 with 70 GiB or more, else 2048); 0: no budget, whole prompts at once",
    )
    p.add_argument("--prefix-caching", action="store_true", help="share the KV blocks of prompts that start alike")
    p.add_argument("--host-blocks", type=non_negative_int, default=0, help="a second KV tier: blocks kept in host "
                   "memory under the prefix cache (needs --prefix-caching; default 0: none)")  # fmt: skip
    p.add_argument("--swap-above", type=non_negative_int, default=0, metavar="TOKENS", help="with --host-blocks: a "
                   "preempted user with this many tokens comes back by copy, a shorter one recomputes")  # fmt: skip
    p.add_argument("--think-s", type=positive_float, default=5.0, help="multi-turn: mean seconds a user thinks "
                   "between a reply and their next turn (an assumption: runs/conversations.py)")  # fmt: skip
    p.add_argument("--speculate", type=non_negative_int, default=0, metavar="K",
                   help="speculative decoding: each decoding user guesses K tokens a step for the model to check "
                   "(greedy replies stay exact; default 0: off)")  # fmt: skip
    p.add_argument(
        "--tp",
        type=positive_int,
        default=1,
        help="tensor parallelism: split the model across this many processes (torch.distributed; gloo on a CPU)",
    )
    p.add_argument("--drafter", default="model", choices=["model", "ngram"],
                   help="who guesses: the shipped draft model, or prompt lookup (no model)")  # fmt: skip
    p.add_argument("--requests", type=positive_int, default=32, help="how many users (not seed-story)")
    p.add_argument("--n", default=1, metavar="N", help=f"replies to each user's prompt (OpenAI's n, 1 to "
                   f"{MAX_REPLIES}): its KV computed once and shared; reply i draws from the seed + i")  # fmt: skip
    p.add_argument(
        "--rate",
        type=positive_float,
        default=0.5,
        help="mean arrivals per engine step (Poisson): reproducible step for step",
    )
    p.add_argument(
        "--rate-per-s",
        type=positive_float,
        default=None,
        help="mean arrivals per second (Poisson), the offered load a real server sees: exact on a "
        "simulated clock; on the tiny model by the wall clock, so not step-for-step reproducible",
    )
    p.add_argument("--spread", type=float, default=1.0, help="reply-length spread: 0 fixed, 1 exponential")
    p.add_argument("--force-lengths", action="store_true", help="ignore EOS: run replies to their drawn length")
    p.add_argument("--seed", type=int, default=0, help="the workload's draws (and each user's sampling seed)")
    sampling_args(p)
    p.add_argument(
        "--simulate",
        default=None,
        metavar="MODEL",
        help="serve a real model (e.g. llama-3.1-8b, or a config.json) on a simulated --gpu instead",
    )
    p.add_argument("--gpu", default="rtx-4090", help="the simulated card (with --simulate)")
    p.add_argument(
        "--prompt-len",
        type=positive_int,
        default=None,
        help="simulated workloads: every prompt this many tokens (as a published table states it)",
    )
    p.add_argument("--reply-len", type=positive_int, default=None,
                   help="simulated workloads: every reply this many tokens")  # fmt: skip
    p.add_argument("--dtype", default="bf16", help="simulated weights: fp32, bf16, fp16, fp8, int4 or mxfp4")
    p.add_argument("--kv-dtype", default="bf16", help="simulated KV cache: bf16, fp16 or fp8")
    p.add_argument("--trace", default=None, help="write the trace JSON here")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the summary")
    model_args(p)
    compile_arg(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("bench", help="measure every claim of the lessons on this machine")
    p.add_argument("--quick", action="store_true", help="smaller runs: about 2 minutes on 2 CPU cores")
    p.add_argument("--only", nargs="+", default=None, help="run only these benchmarks")
    p.add_argument("--roofline", action="store_true", help="this machine's roofline: the cost model against measured "
                   "steps of every model size, and real cards against published figures (--only roofline)")  # fmt: skip
    p.add_argument(
        "--vllm-python",
        default=None,
        help="a Python with vLLM's CPU build, for the peer entry (or set "
        "MINILLM_VLLM_PYTHON; vLLM is no minillm dependency: minillm/bench/peer.py says how to install it)",
    )
    p.add_argument("--out", default=None, help="folder for the plots (PNG) and results.json")
    p.add_argument("--markdown", default=None, help="also write a Markdown report here (e.g. BENCHMARKS.md)")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    model_args(p)
    compile_arg(p)
    p.set_defaults(func=cmd_bench)
