"""A real model on a real card: `whatif` (memory, users, tokens/s; --fleet: many cards serving a crowd) and
`calibrate` (this machine measured)."""

from __future__ import annotations

import argparse


def cmd_whatif(args: argparse.Namespace) -> None:
    import json

    from minillm.card import whatif

    if args.validate:
        from minillm.card.validate import validate, validation_text

        result = validate(args.device, sizes=args.sizes, progress=not args.json)
        print(json.dumps(result) if args.json else validation_text(result))
        return
    from minillm.card.hardware import get_device
    from minillm.card.modelspec import load_spec
    from minillm.card.roofline import check_dtypes

    check_dtypes(args.dtype, args.kv_dtype)
    spec, device = load_spec(args.model), get_device(args.gpu, args.device)
    if args.fleet:
        return fleet_table(args, spec, device)
    result = whatif.plan(spec, device, args.dtype, args.kv_dtype, args.context, args.batch, args.tp, args.link)
    print(json.dumps(result) if args.json else whatif.summary(result))


def parse_splits(text: str, cards: int) -> list[int]:
    """--split: "all" (every P:D of the cards), or splits like "2:6" or "2:6,4:4"; returns the prefill counts."""
    from minillm.errors import ConfigError

    if text == "all":
        return list(range(1, cards))
    prefill = []
    for part in text.split(","):
        p, _, d = part.partition(":")
        if not (p.isdigit() and d.isdigit() and int(p) >= 1 and int(d) >= 1):
            raise ConfigError(f"--split takes prefill:decode card counts such as 2:6 (or all), got {part!r}")
        if int(p) + int(d) != cards:
            raise ConfigError(f"--split {part} is {int(p) + int(d)} cards, but the fleet has --cards {cards}")
        prefill.append(int(p))
    return prefill


def fleet_table(args: argparse.Namespace, spec, device) -> None:
    """whatif --fleet: the crowd on replicas, then on each prefill:decode split of the same cards."""
    import json

    from minillm.card.fleet_figures import compare_splits, splits_text
    from minillm.card.roofline import kv_bytes_per_token
    from minillm.card.tensor_parallel import link_of
    from minillm.errors import ConfigError
    from minillm.runs.workload import ChatKnobs, make_workload

    if args.tp > 1:
        raise ConfigError("--fleet runs one engine per card: drop --tp")
    splits = parse_splits(args.split, args.cards)
    requests = make_workload(args.workload, ChatKnobs(requests=args.requests, rate_per_s=args.rate_per_s), args.seed)
    rows = compare_splits(spec, device, requests, args.cards, splits, args.ttft_target_s, args.tpot_target_s,
                          route=args.route, link=args.link, dtype=args.dtype, kv_dtype=args.kv_dtype)  # fmt: skip
    if args.json:
        print(json.dumps({"model": spec.name, "gpu": device.name, "workload": args.workload, "rate_per_s":
                          args.rate_per_s, "requests": args.requests, "rows": rows}))  # fmt: skip
        return
    wire, per_token = link_of(device, args.link), kv_bytes_per_token(spec, args.kv_dtype)
    title = (f"{spec.name} on {args.cards} x {device.label}: {args.requests:,} {args.workload} requests at "
             f"{args.rate_per_s:g}/s\n  replicas routed {args.route.replace('-', ' ')}; a split hands each prompt's KV "
             f"({per_token / 1024:.0f} KiB a token) over {wire.label}")  # fmt: skip
    print(splits_text(rows, title))


def cmd_calibrate(args: argparse.Namespace) -> None:
    from minillm.card.calibrate import calibrate, calibration_path, describe

    result = calibrate(args.device)
    print(describe(result))
    print(f"saved {calibration_path(result['device'])}")


def add_commands(sub) -> None:
    from minillm.card.sizes import SIZES
    from minillm.cli.args import positive_float, positive_int

    p = sub.add_parser("whatif", help="a real model on a real card: memory, users that fit, tokens/s (roofline)")
    p.add_argument("--model", default="llama-3.1-8b", help="a shipped model (e.g. qwen3-0.6b) or a config.json path")
    p.add_argument("--gpu", default="rtx-4090", help="a card (e.g. h100-sxm) or this-machine (calibrated)")
    p.add_argument("--dtype", default="bf16", help="weights: fp32, bf16, fp16, fp8, int4 or mxfp4 (gpt-oss)")
    p.add_argument("--kv-dtype", default="bf16", help="KV cache: bf16, fp16 or fp8")
    p.add_argument("--context", type=int, default=4096, help="tokens of context per user")
    p.add_argument("--batch", type=int, default=1, help="users decoding together")
    p.add_argument("--tp", type=int, default=1, help="cards the model is split over (tensor parallelism)")
    p.add_argument("--link", default=None, help="between the cards: nvlink-4, nvlink-3, pcie-4, pcie-5 or ib-400 "
                   "(InfiniBand, between servers; default: the card's own, e.g. NVLink on an H100 SXM, PCIe on an "
                   "RTX 4090); with --fleet, what a prompt's KV crosses from a prefill to a decode card")  # fmt: skip
    p.add_argument(
        "--validate",
        action="store_true",
        help="check the cost model on this machine: calibrate "
        "(microbenchmarks), then predict and time decode steps of every --sizes model at batches 1-128 "
        "and two contexts, and prompt chunks of 64-512 tokens (one torch thread; a few minutes)",
    )
    p.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES),
                   help="model sizes --validate times (random weights; sizes.py)")  # fmt: skip
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="for this-machine and --validate")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the summary")
    fleet = p.add_argument_group("a fleet (--fleet): many cards serving one crowd on a simulated clock (card/fleet.py)")
    fleet.add_argument("--fleet", action="store_true",
                       help="serve a crowd on --cards cards: as replicas (each prefills and decodes), then split into "
                       "P prefill and D decode cards; prints TTFT, ITL and TPOT p99, goodput and tokens/s per split "
                       "(each split of the default crowd: some 10-20 s of this machine's time)")  # fmt: skip
    fleet.add_argument("--cards", type=positive_int, default=8, help="cards in the fleet (default 8)")
    fleet.add_argument("--split", default="all", help="prefill:decode splits beside the replicas, e.g. 2:6 or 2:6,4:4 "
                       "(default all: 1:N-1 to N-1:1)")  # fmt: skip
    fleet.add_argument("--requests", type=positive_int, default=2000, help="requests in the crowd (default 2000)")
    fleet.add_argument("--rate-per-s", type=positive_float, default=60.0,
                       help="arrivals per second (Poisson; default 60)")  # fmt: skip
    fleet.add_argument("--workload", default="azure-conv", choices=["azure-conv", "azure-code"],
                       help="prompt and reply lengths of Azure's 2023 trace: conversations, or code (long prompts, "
                       "short replies)")  # fmt: skip
    fleet.add_argument("--route", default="least-loaded", choices=["least-loaded", "round-robin"],
                       help="how replicas get their requests (cache aware needs real shared prefixes: the azure "
                       "crowds are lengths only)")  # fmt: skip
    fleet.add_argument("--ttft-target-s", type=positive_float, default=0.25, help="goodput: TTFT at most this "
                       "(default 0.25: DistServe's chatbot target)")  # fmt: skip
    fleet.add_argument("--tpot-target-s", type=positive_float, default=0.1,
                       help="goodput: TPOT at most this (default 0.1)")  # fmt: skip
    fleet.add_argument("--seed", type=int, default=0, help="the crowd's seed")
    p.set_defaults(func=cmd_whatif)

    p = sub.add_parser("calibrate", help="measure this machine: bandwidth, matmul FLOP/s, fixed cost per op")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.set_defaults(func=cmd_calibrate)
