"""Command line: python -m minillm {generate, train, eval, run, bench, whatif, calibrate, serve, load, export}
(see --help of each)."""

from __future__ import annotations

import argparse
import sys
import time

from minillm.errors import ConfigError, MinillmError


def cmd_generate(args: argparse.Namespace) -> None:
    from minillm import tasks
    from minillm.checkpoint import load_model
    from minillm.errors import InputError
    from minillm.generate import generate
    from minillm.tokenizer import decode, encode_prompt

    if not args.prompt.strip():
        raise InputError("the prompt is empty; give one, e.g. --prompt 'count down from 12'")
    preamble = tasks.PREAMBLES.get(args.preamble, args.preamble)  # a shipped system prompt's name, or any text
    model = load_model(args.checkpoint, args.device)
    start = time.perf_counter()
    out = generate(
        model,
        encode_prompt(args.prompt, preamble),
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        seed=args.seed,
        use_cache=not args.no_cache,
    )
    seconds = time.perf_counter() - start
    print(decode(out.tokens))
    rate = len(out.tokens) / seconds if seconds > 0 else 0.0
    print(f"[{len(out.tokens)} tokens, stopped by {out.finish_reason}, {rate:.0f} tokens/s]", file=sys.stderr)
    if not tasks.is_trained_shape(args.prompt):
        print(f"note: the model was trained only on {tasks.KNOWN_TASKS}; expect nonsense here", file=sys.stderr)


def cmd_train(args: argparse.Namespace) -> None:
    from minillm.checkpoint import DEFAULT_CHECKPOINT
    from minillm.train import TrainConfig, format_accuracy, train_and_save

    out = args.out or DEFAULT_CHECKPOINT
    cfg = TrainConfig(seed=args.seed) if args.steps is None else TrainConfig(steps=args.steps, seed=args.seed)
    results = train_and_save(out, cfg)
    print(format_accuracy(results))
    print(f"saved {out}")


def cmd_eval(args: argparse.Namespace) -> None:
    from minillm.checkpoint import load_model
    from minillm.train import evaluate, format_accuracy

    results = evaluate(load_model(args.checkpoint, args.device), per_task=args.per_task)
    print(format_accuracy(results))


def cmd_export(args: argparse.Namespace) -> None:
    from minillm.checkpoint import load_model
    from minillm.export import export_llama

    out = export_llama(load_model(args.checkpoint, "cpu"), args.out)
    print(f"wrote {out / 'config.json'} and {out / 'model.safetensors'}")


def cmd_run(args: argparse.Namespace) -> None:
    import json

    from minillm.metrics import summarize
    from minillm.run import run_workload
    from minillm.workload import SIMULATED_WORKLOADS, ChatKnobs

    if args.workload in SIMULATED_WORKLOADS and not args.simulate:
        raise ConfigError(
            f"{args.workload} has prompts longer than the tiny model's context (lengths only): "
            f"run it on a simulated card, e.g. --simulate llama-3.1-8b --gpu rtx-4090"
        )
    model = simulated_runner(args) if args.simulate else load_model_from(args)
    knobs = ChatKnobs(requests=args.requests, rate=args.rate, spread=args.spread, force_lengths=args.force_lengths,
                      rate_per_s=args.rate_per_s)  # fmt: skip
    started = time.perf_counter()
    trace = run_workload(
        model, args.workload, args.scheduler, args.kv, args.slots, args.num_blocks, args.block_size, knobs,
        args.seed, progress=not args.json, token_budget=args.token_budget, prefix_caching=args.prefix_caching,
    )  # fmt: skip
    if args.trace:
        trace.save(args.trace)
    summary = summarize(trace) | {"run_wall_s": time.perf_counter() - started}
    if args.json:
        print(json.dumps(summary))
        return
    print(run_summary_text(args, trace.config, summary))


def load_model_from(args: argparse.Namespace):
    from minillm.checkpoint import load_model

    return load_model(args.checkpoint, args.device)


def simulated_runner(args: argparse.Namespace):
    from minillm.hardware import get_device
    from minillm.modelspec import load_spec
    from minillm.simulate import SimulatedRunner

    return SimulatedRunner(load_spec(args.simulate), get_device(args.gpu), args.dtype, args.kv_dtype)


def run_summary_text(args: argparse.Namespace, cfg: dict, summary: dict) -> str:
    where = f"{cfg['model']} on a simulated {cfg['gpu']}" if args.simulate else "the tiny model"
    budget = cfg["token_budget"] or "no"
    ms = lambda key: "–" if summary[key] is None else f"{1000 * summary[key]:.0f} ms"
    lines = [
        f"{args.workload}: {args.scheduler} batching, {args.kv} KV, {cfg['slots']} seats, {cfg['num_blocks']} "
        f"blocks, {budget} token budget, prefix caching {'on' if cfg['prefix_caching'] else 'off'} ({where})",
        f"  requests     {summary['finished']} finished, {summary['rejected']} rejected of {summary['requests']}",
        f"  steps        {summary['steps']}  ({summary['output_tokens']} tokens, "
        f"{summary['tokens_per_step']:.2f}/step)",
        f"  throughput   {summary['tokens_per_s']:.0f} tokens/s over {summary['wall_s']:.2f} s "
        + ("simulated" if args.simulate else "of steps"),
        f"  utilization  {summary['slot_utilization']:.1%} of seat-steps did useful work",
        f"  TTFT         p50 {ms('ttft_p50_s')}, p99 {ms('ttft_p99_s')}   ({summary['ttft_p50_steps']} steps at p50)",
        f"  TPOT         p50 {ms('tpot_p50_s')}, p99 {ms('tpot_p99_s')}",
        f"  prefill      {summary['prefill_tokens']} prompt tokens computed, {summary['cached_prompt_tokens']} "
        f"from the prefix cache (hit rate {summary['prefix_hit_rate']:.0%})",
        f"  KV waste     {summary['kv_waste']:.1%}   preemptions {summary['preemptions']}",
    ]
    if args.simulate:
        lines.append(f"  simulated in {summary['run_wall_s']:.1f} s of this machine's time")
    if args.trace:
        lines.append(f"  trace        {args.trace}")
    return "\n".join(lines)


def cmd_bench(args: argparse.Namespace) -> None:
    import json
    import os
    from pathlib import Path

    from minillm.bench import BENCHES, BenchSettings, run_benchmarks
    from minillm.bench_report import markdown, plot_all
    from minillm.checkpoint import load_model

    unknown = set(args.only or []) - set(BENCHES)
    if unknown:
        raise ConfigError(f"unknown benchmark(s) {sorted(unknown)}; choose from {', '.join(BENCHES)}")
    model = load_model(args.checkpoint, args.device)
    results = run_benchmarks(model, BenchSettings(quick=args.quick), args.only, progress=not args.json)
    command = "python -m minillm bench" + " --quick" * args.quick + f" --device {args.device}" * (args.device != "auto")
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


def cmd_whatif(args: argparse.Namespace) -> None:
    import json

    from minillm import whatif

    if args.validate:
        result = whatif.validate(args.device, progress=not args.json)
        print(json.dumps(result) if args.json else whatif.validation_text(result))
        return
    from minillm.hardware import get_device
    from minillm.modelspec import load_spec
    from minillm.roofline import check_dtypes

    check_dtypes(args.dtype, args.kv_dtype)
    spec, device = load_spec(args.model), get_device(args.gpu, args.device)
    result = whatif.plan(spec, device, args.dtype, args.kv_dtype, args.context, args.batch)
    print(json.dumps(result) if args.json else whatif.summary(result))


def cmd_calibrate(args: argparse.Namespace) -> None:
    from minillm.calibrate import calibrate, calibration_path, describe

    result = calibrate(args.device)
    print(describe(result))
    print(f"saved {calibration_path(result['device'])}")


def cmd_serve(args: argparse.Namespace) -> None:
    from minillm.server import LOOPBACK, bind, build_loop, serve

    sock = bind(args.host, args.port)  # first: a port that is taken fails in one line, before the model loads
    model = load_model_from(args)  # (on one torch thread unless --threads says otherwise: see main())
    loop = build_loop(model, args.scheduler, args.kv, args.slots, args.num_blocks, args.block_size, args.token_budget,
                      args.prefix_caching, args.max_waiting, args.keep_steps,
                      stream_interval=args.stream_interval)  # fmt: skip
    where = f"http://{args.host}:{args.port}/v1"
    print(f"minillm serving on {where} ({args.scheduler} batching, {args.slots} seats, {args.kv} KV); Ctrl-C stops")
    print(f"  try: curl {where}/completions -H 'Content-Type: application/json' "
          """-d '{"prompt": "count down from 12"}'""")  # fmt: skip
    if args.host != LOOPBACK:
        print(f"  note: bound to {args.host}: other machines on this network can send requests (on purpose?)")
    serve(loop, sock, args.model_name)


def cmd_load(args: argparse.Namespace) -> None:
    import asyncio
    import json
    from dataclasses import asdict
    from pathlib import Path

    from minillm.errors import InputError
    from minillm.loadgen import jobs_from_workload, run_jobs, summarize_load

    jobs = jobs_from_workload(args.workload, args.requests, args.rate_per_s, args.seed, args.force_lengths,
                              args.hang_up)  # fmt: skip
    outcomes = asyncio.run(run_jobs(args.url, jobs, args.model, args.api, args.max_concurrency, args.timeout_s))
    summary = summarize_load(outcomes, args.ttft_target_s, args.tpot_target_s)
    summary |= {"url": args.url, "workload": args.workload, "rate_per_s": args.rate_per_s, "seed": args.seed}
    if args.out:
        try:
            Path(args.out).write_text(json.dumps({"summary": summary, "requests": [asdict(o) for o in outcomes]}))
        except OSError as e:
            raise ConfigError(f"cannot write --out {args.out}: {e.strerror}") from None
    if summary["finished"] == 0 and summary["errors"]:
        raise InputError(f"no request got a whole reply from {args.url}; the first error: {summary['first_error']}")
    print(json.dumps(summary) if args.json else load_summary_text(summary))


def load_summary_text(s: dict) -> str:
    ms = lambda key: "–" if s[key] is None else f"{1000 * s[key]:.0f} ms"
    trio = lambda name: f"p50 {ms(name + '_p50_s')}, p90 {ms(name + '_p90_s')}, p99 {ms(name + '_p99_s')}"
    rate = "all at once" if s["rate_per_s"] is None else f"{s['rate_per_s']:g}/s (Poisson)"
    return "\n".join([
        f"{s['workload']} against {s['url']}: {s['requests']} requests, arriving {rate}",
        f"  requests     {s['finished']} finished, {s['errors']} errors, {s['aborted']} hung up on purpose",
        f"  throughput   {s['tokens_per_s']:.0f} output tokens/s, {s['requests_per_s']:.2f} requests/s "
        f"over {s['wall_s']:.2f} s (client's clock)",
        f"  TTFT         {trio('ttft')}",
        f"  TPOT         {trio('tpot')}",
        f"  ITL          {trio('itl')}",
        f"  latency      {trio('latency')}",
        f"  goodput      {s['goodput_per_s']:.2f} requests/s ({s['goodput_share']:.0%} of those finished) with TTFT "
        f"<= {s['ttft_target_s']:g} s and TPOT <= {s['tpot_target_s']:g} s",
    ] + ([f"  first error  {s['first_error']}"] if s.get("first_error") else []))  # fmt: skip


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    from minillm.scheduler import DEFAULT_TOKEN_BUDGET
    from minillm.workload import ALL_WORKLOADS

    parser = argparse.ArgumentParser(prog="python -m minillm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def model_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
        p.add_argument("--checkpoint", default=None, help="safetensors file (default: the shipped model)")
        p.add_argument("--threads", type=positive_int, default=1, help=THREADS_HELP)

    p = sub.add_parser("generate", help="reply to one prompt")
    p.add_argument("--prompt", required=True, help='e.g. "count down from 12", "spell 4096"')
    p.add_argument("--max-new-tokens", type=int, default=None, help="default: until EOS or the context is full")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--no-cache", action="store_true", help="re-read the whole sequence every step (the reference)")
    p.add_argument("--preamble", default=None,
                   help="a system prompt before the task, which the model ignores: a name (assistant, teacher, "
                   "workshop, rules) or any text")  # fmt: skip
    model_args(p)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("train", help="train the tiny model from scratch and save it")
    p.add_argument("--out", default=None, help="default: overwrite the shipped checkpoint")
    p.add_argument("--steps", type=positive_int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("eval", help="held-out exact-match accuracy per task")
    p.add_argument("--per-task", type=positive_int, default=50)
    model_args(p)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("run", help="serve a workload through the engine and summarize it")
    p.add_argument("--workload", default="seed-story", choices=ALL_WORKLOADS,
                   help="azure-conv and azure-code need --simulate")  # fmt: skip
    p.add_argument("--scheduler", default="continuous", choices=["static", "continuous"])
    p.add_argument("--kv", default="paged", choices=["paged", "contiguous"])
    p.add_argument(
        "--slots",
        type=positive_int,
        default=None,
        help="seats (default 4 for seed-story, else 8; simulated: the users the KV memory holds, <= 256)",
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
    p.add_argument("--requests", type=positive_int, default=32, help="how many users (not seed-story)")
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
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--simulate",
        default=None,
        metavar="MODEL",
        help="serve a real model (e.g. llama-3.1-8b, or a config.json) on a simulated --gpu instead",
    )
    p.add_argument("--gpu", default="rtx-4090", help="the simulated card (with --simulate)")
    p.add_argument("--dtype", default="bf16", help="simulated weights: fp32, bf16, fp16, fp8 or int4")
    p.add_argument("--kv-dtype", default="bf16", help="simulated KV cache: bf16, fp16 or fp8")
    p.add_argument("--trace", default=None, help="write the trace JSON here")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the summary")
    model_args(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("bench", help="measure every claim of the lessons on this machine")
    p.add_argument("--quick", action="store_true", help="smaller runs: about 2 minutes on 2 CPU cores")
    p.add_argument("--only", nargs="+", default=None, help="run only these benchmarks")
    p.add_argument("--out", default=None, help="folder for the plots (PNG) and results.json")
    p.add_argument("--markdown", default=None, help="also write a Markdown report here (e.g. BENCHMARKS.md)")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    model_args(p)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("whatif", help="a real model on a real card: memory, users that fit, tokens/s (roofline)")
    p.add_argument("--model", default="llama-3.1-8b", help="a shipped model (e.g. qwen3-0.6b) or a config.json path")
    p.add_argument("--gpu", default="rtx-4090", help="a card (e.g. h100-sxm) or this-machine (calibrated)")
    p.add_argument("--dtype", default="bf16", help="weights: fp32, bf16, fp16, fp8 or int4")
    p.add_argument("--kv-dtype", default="bf16", help="KV cache: bf16, fp16 or fp8")
    p.add_argument("--context", type=int, default=4096, help="tokens of context per user")
    p.add_argument("--batch", type=int, default=1, help="users decoding together")
    p.add_argument("--validate", action="store_true", help="check the cost model against the shipped model here "
                   "(microbenchmarks -> predicted decode steps, against measured ones; on a busy shared machine "
                   "OMP_NUM_THREADS=1 steadies the timings)")  # fmt: skip
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="for this-machine and --validate")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the summary")
    p.set_defaults(func=cmd_whatif)

    p = sub.add_parser("calibrate", help="measure this machine: bandwidth, matmul FLOP/s, fixed cost per op")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("serve", help="an OpenAI-compatible HTTP server over the engine (streaming)")
    p.add_argument("--host", default="127.0.0.1",
                   help="127.0.0.1: this machine only; 0.0.0.0: every network it is on (a workshop room)")  # fmt: skip
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--scheduler", default="continuous", choices=["static", "continuous"])
    p.add_argument("--kv", default="paged", choices=["paged", "contiguous"])
    p.add_argument("--slots", type=positive_int, default=8, help="seats")
    p.add_argument("--num-blocks", type=positive_int, default=None, help="paged pool size (default: same memory)")
    p.add_argument("--block-size", type=positive_int, default=16)
    p.add_argument("--token-budget", type=non_negative_int, default=DEFAULT_TOKEN_BUDGET,
                   help="tokens per step (0: no budget)")  # fmt: skip
    p.add_argument("--prefix-caching", action="store_true", help="share the KV blocks of prompts that start alike")
    p.add_argument("--max-waiting", type=positive_int, default=256,
                   help="queue length beyond which new requests get 429 (with Retry-After)")  # fmt: skip
    p.add_argument("--keep-steps", type=positive_int, default=10_000,
                   help="steps the live trace keeps (GET /trace): memory stays bounded")  # fmt: skip
    p.add_argument("--stream-interval", type=positive_int, default=1,
                   help="send tokens once this many piled up (the first at once): less work per token")  # fmt: skip
    p.add_argument("--model-name", default="minillm", help="the model name clients send and /v1/models lists")
    model_args(p)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("load", help="send a workload to any OpenAI-compatible server and time it from the client")
    p.add_argument("--url", default="http://127.0.0.1:8000/v1", help="the server's API root (ends in /v1)")
    p.add_argument("--workload", default="chat", choices=["chat", "system-prompt", "long-prompts"])
    p.add_argument("--requests", type=positive_int, default=200)
    p.add_argument("--rate-per-s", type=positive_float, default=None,
                   help="mean arrivals per second (Poisson); default: everyone at once")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="the same seed as `run` sends the same users")
    p.add_argument("--force-lengths", action="store_true",
                   help="ask for the drawn reply lengths (ignore_eos): the same work on any model")  # fmt: skip
    p.add_argument("--model", default=None, help="default: the first model the server lists")
    p.add_argument("--api", default="chat", choices=["chat", "completions"])
    p.add_argument("--max-concurrency", type=positive_int, default=None, help="at most this many requests in flight")
    p.add_argument("--ttft-target-s", type=positive_float, default=1.0, help="goodput: TTFT at most this")
    p.add_argument("--tpot-target-s", type=positive_float, default=0.1, help="goodput: TPOT at most this")
    p.add_argument("--hang-up", type=float, default=0.0, help="share of users who hang up mid-stream (0 to 1)")
    p.add_argument("--timeout-s", type=positive_float, default=600.0, help="give up on a request silent this long")
    p.add_argument("--json", action="store_true", help="print one JSON object (run --json's names)")
    p.add_argument("--out", default=None, help="also write the summary and every request's timings here (JSON)")
    p.set_defaults(func=cmd_load)

    p = sub.add_parser("export", help="write a Llama-layout config.json + model.safetensors")
    p.add_argument("--out", required=True)
    p.add_argument("--checkpoint", default=None)
    p.set_defaults(func=cmd_export)
    return parser


# The tiny model's CPU ops are too small to split: a second thread mostly waits, and when another program
# uses a core the two threads stall each other (seed story, continuous, on this project's busy 2-core machine:
# 2.5 s on one thread, 29-102 s on two).
THREADS_HELP = "torch CPU threads (default 1: the tiny model's ops are too small to split, and one thread stays fast "
THREADS_HELP += "when other programs share the cores)"


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
