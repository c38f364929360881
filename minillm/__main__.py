"""Command line: python -m minillm {generate, run, bench, train, eval, export} (see --help of each)."""

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
    model = load_model(args.checkpoint, args.device)
    start = time.perf_counter()
    out = generate(
        model,
        encode_prompt(args.prompt),
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

    from minillm.checkpoint import load_model
    from minillm.metrics import summarize
    from minillm.run import run_workload
    from minillm.workload import ChatKnobs

    model = load_model(args.checkpoint, args.device)
    knobs = ChatKnobs(requests=args.requests, rate=args.rate, spread=args.spread, force_lengths=args.force_lengths)
    trace = run_workload(
        model, args.workload, args.scheduler, args.kv, args.slots, args.num_blocks, args.block_size, knobs,
        args.seed, progress=not args.json,
    )  # fmt: skip
    if args.trace:
        trace.save(args.trace)
    summary = summarize(trace)
    if args.json:
        print(json.dumps(summary))
        return
    cfg = trace.config
    print(f"{args.workload}: {args.scheduler} batching, {args.kv} KV, {cfg['slots']} seats, {cfg['num_blocks']} blocks")
    print(f"  requests     {summary['finished']} finished, {summary['rejected']} rejected of {summary['requests']}")
    print(
        f"  steps        {summary['steps']}  ({summary['output_tokens']} tokens, {summary['tokens_per_step']:.2f}/step)"
    )
    print(f"  throughput   {summary['tokens_per_s']:.0f} tokens/s in {summary['wall_s']:.2f} s")
    print(f"  utilization  {summary['slot_utilization']:.1%} of seat-steps did useful work")
    print(f"  TTFT p50     {summary['ttft_p50_steps']:.0f} steps   TPOT p50 {summary['tpot_p50_steps']:.2f} steps")
    print(f"  KV waste     {summary['kv_waste']:.1%}   preemptions {summary['preemptions']}")
    if args.trace:
        print(f"  trace        {args.trace}")


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


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m minillm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def model_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
        p.add_argument("--checkpoint", default=None, help="safetensors file (default: the shipped model)")

    p = sub.add_parser("generate", help="reply to one prompt")
    p.add_argument("--prompt", required=True, help='e.g. "count down from 12", "spell 4096"')
    p.add_argument("--max-new-tokens", type=int, default=None, help="default: until EOS or the context is full")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--no-cache", action="store_true", help="re-read the whole sequence every step (the reference)")
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
    p.add_argument("--workload", default="seed-story", choices=["seed-story", "chat", "bursty"])
    p.add_argument("--scheduler", default="continuous", choices=["static", "continuous"])
    p.add_argument("--kv", default="paged", choices=["paged", "contiguous"])
    p.add_argument("--slots", type=positive_int, default=None, help="seats (default 4 for seed-story, else 8)")
    p.add_argument("--num-blocks", type=positive_int, default=None, help="paged pool size (default: same memory)")
    p.add_argument("--block-size", type=positive_int, default=16)
    p.add_argument("--requests", type=positive_int, default=32, help="chat/bursty: how many users")
    p.add_argument("--rate", type=float, default=0.5, help="chat: mean arrivals per step")
    p.add_argument("--spread", type=float, default=1.0, help="reply-length spread: 0 fixed, 1 exponential")
    p.add_argument("--force-lengths", action="store_true", help="ignore EOS: run replies to their drawn length")
    p.add_argument("--seed", type=int, default=0)
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

    p = sub.add_parser("export", help="write a Llama-layout config.json + model.safetensors")
    p.add_argument("--out", required=True)
    p.add_argument("--checkpoint", default=None)
    p.set_defaults(func=cmd_export)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except MinillmError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
