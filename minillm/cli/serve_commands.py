"""The engine behind HTTP: `serve` (an OpenAI-compatible server) and `load` (a client-side load generator)."""

from __future__ import annotations

import argparse

from minillm.cli.args import (
    compile_arg,
    load_model_from,
    model_args,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)
from minillm.errors import ConfigError


def cmd_serve(args: argparse.Namespace) -> None:
    from minillm.layers.policies import make_policy
    from minillm.serving.api_key import ENV, api_key_from
    from minillm.serving.server import LOOPBACK, bind, build_fleet, build_loop, serve

    fleet_error = replicas_error(args)
    if fleet_error:
        raise ConfigError(fleet_error)
    make_policy(args.scheduler, args.token_budget, args.victim)  # a policy and victim that do not go together: now
    sock = bind(args.host, args.port)  # first: a port that is taken fails in one line, before the model loads
    model = load_model_from(args)  # (on one torch thread unless --threads says otherwise: see main())
    if args.replicas > 1:  # each replica is the engine process `serve` runs alone, behind a router
        loop = build_fleet(model, args.replicas, args.route or "cache-aware", scheduler=args.scheduler, kv=args.kv,
                           slots=args.slots, num_blocks=args.num_blocks, block_size=args.block_size,
                           token_budget=args.token_budget, prefix_caching=args.prefix_caching,
                           max_waiting=args.max_waiting, keep_steps=args.keep_steps,
                           stream_interval=args.stream_interval, tp=args.tp, victim=args.victim)  # fmt: skip
    else:
        loop = build_loop(model, args.scheduler, args.kv, args.slots, args.num_blocks, args.block_size,
                          args.token_budget, args.prefix_caching, args.max_waiting, args.keep_steps,
                          stream_interval=args.stream_interval, process=args.engine == "process", tp=args.tp,
                          disaggregate=args.disaggregate, victim=args.victim)  # fmt: skip
    where = f"http://{args.host}:{args.port}/v1"
    split = f", the model split across {args.tp} processes" if args.tp > 1 else ""
    fleet = f"{args.replicas} replicas, {args.route or 'cache-aware'} routing; each: " if args.replicas > 1 else ""
    policy = args.scheduler + (f" batching, preempting {args.victim}" if args.victim else " batching")
    print(f"minillm serving on {where} ({fleet}{policy}, {args.slots} seats, {args.kv} KV, the engine "
          f"in a {args.engine} of its own{split}); Ctrl-C stops", flush=True)  # fmt: skip
    api_key = api_key_from(args.api_key)  # (never printed: the banner says that one is needed, not what it is)
    bearer = f'-H "Authorization: Bearer ${ENV}" ' if api_key else ""
    print(f"  try: curl {where}/chat/completions -H 'Content-Type: application/json' {bearer}"
          """-d '{"messages": [{"role": "user", "content": "count down from 12"}]}'""")  # fmt: skip
    if api_key:
        source = "--api-key" if args.api_key else ENV
        print(f"  a key is required ({source}): /v1/* and /trace answer 401 without `Authorization: Bearer KEY`")
    if args.host != LOOPBACK:
        guard = "each needs the key" if api_key else f"on purpose? --api-key (or {ENV}) asks them for a key"
        print(f"  note: bound to {args.host}: other machines on this network can send requests ({guard})")
    serve(loop, sock, args.model_name, args.drain_s, args.max_body_bytes, api_key)


def replicas_error(args: argparse.Namespace) -> str | None:
    """What is wrong with --replicas and --route as given, if anything."""
    if args.route is not None and args.replicas == 1:
        return "--route chooses among replicas: give --replicas 2 or more"
    if args.replicas > 1 and args.engine != "process":
        return "--replicas runs each replica's engine in a process of its own: drop --engine thread"
    if args.replicas > 1 and getattr(args, "disaggregate", False):
        return "--replicas with --disaggregate is not built yet: choose one"
    return None


def cmd_load(args: argparse.Namespace) -> None:
    import asyncio
    import json
    from dataclasses import asdict
    from pathlib import Path

    from minillm.cli.run_commands import replies_flag
    from minillm.errors import InputError
    from minillm.serving.loadgen import jobs_from_workload, run_jobs, summarize_load

    jobs = jobs_from_workload(args.workload, args.requests, args.rate_per_s, args.seed, args.force_lengths,
                              args.hang_up, replies_flag(args.n))  # fmt: skip
    from minillm.serving.api_key import api_key_from

    outcomes = asyncio.run(run_jobs(args.url, jobs, args.model, args.api, args.max_concurrency, args.timeout_s,
                                    tokenizer=args.tokenizer, api_key=api_key_from(args.api_key)))  # fmt: skip
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
    ms = lambda key, d=s: "–" if d[key] is None else f"{1000 * d[key]:.0f} ms"
    trio = lambda name, d=s: f"p50 {ms(name + '_p50_s', d)}, p90 {ms(name + '_p90_s', d)}, p99 {ms(name + '_p99_s', d)}"
    classes = [f"    {cls:<10} {trio('ttft', c)} ({c['finished']} of {c['requests']} finished)"
               for cls, c in s.get("by_class", {}).items()]  # fmt: skip
    rate = "all at once" if s["rate_per_s"] is None else f"{s['rate_per_s']:g}/s (Poisson)"
    return "\n".join([
        f"{s['workload']} against {s['url']}: {s['requests']} requests, arriving {rate}",
        f"  requests     {s['finished']} finished, {s['errors']} errors, {s['aborted']} hung up on purpose"
        + (f"; {s['replies']} replies (n each)" if s.get("replies", s["finished"]) != s["finished"] else ""),
        f"  throughput   {s['tokens_per_s']:.0f} output tokens/s, {s['requests_per_s']:.2f} requests/s "
        f"over {s['wall_s']:.2f} s (client's clock)",
        f"  TTFT         {trio('ttft')}",
        *classes,  # (the mixed crowd: each class's own)
        f"  TPOT         {trio('tpot')}",
        f"  ITL          {trio('itl')}",
        f"  latency      {trio('latency')}",
        f"  goodput      {s['goodput_per_s']:.2f} requests/s ({s['goodput_share']:.0%} of those finished) with TTFT "
        f"<= {s['ttft_target_s']:g} s and TPOT <= {s['tpot_target_s']:g} s",
    ] + ([f"  first error  {s['first_error']}"] if s.get("first_error") else []))  # fmt: skip


def add_commands(sub) -> None:
    from minillm.engine.scheduler import DEFAULT_TOKEN_BUDGET
    from minillm.layers.policies import POLICIES, VICTIMS
    from minillm.layers.replies import MAX_REPLIES
    from minillm.serving.loadgen import LOAD_WORKLOADS

    p = sub.add_parser("serve", help="an OpenAI-compatible HTTP server over the engine (streaming)")
    p.add_argument("--host", default="127.0.0.1",
                   help="127.0.0.1: this machine only; 0.0.0.0: every network it is on (a workshop room)")  # fmt: skip
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--scheduler", default="continuous", choices=list(POLICIES),
                   help="who is seated: first come first served (static, continuous), by the request body's "
                   "priority (lower first, as vLLM's), or by deadline (layers/policies.py)")  # fmt: skip
    p.add_argument("--victim", default=None, choices=VICTIMS,
                   help="whom priority or deadline preempts (default: the policy's own: lowest-priority, "
                   "latest-due); static and continuous preempt the newest")  # fmt: skip
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
    p.add_argument("--max-body-bytes", type=positive_int, default=1_000_000,
                   help="a bigger request body is refused (413) before it is read")  # fmt: skip
    p.add_argument("--drain-s", type=non_negative_float, default=10.0,
                   help="on Ctrl-C or SIGTERM: seconds the replies in flight get to finish (then: abort)")  # fmt: skip
    p.add_argument(
        "--tp",
        type=positive_int,
        default=1,
        help="tensor parallelism: split the model across this many processes (torch.distributed; gloo on a CPU)",
    )
    p.add_argument("--disaggregate", action="store_true", help="prefill on one engine process, decode on another; "
                   "each prompt's KV sent between them (torch.distributed)")  # fmt: skip
    p.add_argument("--replicas", type=positive_int, default=1,
                   help="engine processes behind one endpoint, each with its own KV cache (a router sends each "
                   "request to one)")  # fmt: skip
    p.add_argument("--route", default=None, choices=["round-robin", "least-loaded", "cache-aware"],
                   help="how the router picks a replica (default with --replicas 2 or more: cache-aware, the one "
                   "whose prefix cache holds the most of the prompt; see serving/routing.py)")  # fmt: skip
    p.add_argument("--engine", default="process", choices=["process", "thread"],
                   help="process: the engine in a process of its own (the HTTP side never waits on a step); thread: on "
                   "a thread of the server's process, sharing its interpreter lock (lesson 10 compares)")  # fmt: skip
    p.add_argument("--api-key", default=None, help="requests to /v1/* and /trace must carry `Authorization: Bearer "
                   "KEY` (else 401), as vLLM's --api-key; default: $MINILLM_API_KEY (which `ps` does not show), "
                   "else none")  # fmt: skip
    model_args(p)
    compile_arg(p)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("load", help="send a workload to any OpenAI-compatible server and time it from the client")
    p.add_argument("--url", default="http://127.0.0.1:8000/v1", help="the server's API root (ends in /v1)")
    p.add_argument("--workload", default="chat", choices=LOAD_WORKLOADS,
                   help="mixed: chat users and batch jobs, each sending its class's priority")  # fmt: skip
    p.add_argument("--requests", type=positive_int, default=200)
    p.add_argument("--n", default=1, metavar="N", help=f"replies each request asks for (OpenAI's n, 1 to "
                   f"{MAX_REPLIES}): every choice read and counted")  # fmt: skip
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
    p.add_argument("--tokenizer", default="minillm",
                   help="how output tokens are counted, the same on every server: the reply's text tokenized by "
                   "minillm's byte-level tokenizer (default; its export's too), or by a tokenizer.json (or its "
                   "folder) for another model; 'usage': as each server's usage says (some count the end "
                   "token)")  # fmt: skip
    p.add_argument("--api-key", default=None, help="the server's key, sent as `Authorization: Bearer KEY` "
                   "(default: $MINILLM_API_KEY, else none)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print one JSON object (run --json's names)")
    p.add_argument("--out", default=None, help="also write the summary and every request's timings here (JSON)")
    p.set_defaults(func=cmd_load)
