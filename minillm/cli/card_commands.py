"""A real model on a real card: `whatif` (memory, users, tokens/s) and `calibrate` (this machine measured)."""

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
    result = whatif.plan(spec, device, args.dtype, args.kv_dtype, args.context, args.batch, args.tp, args.link)
    print(json.dumps(result) if args.json else whatif.summary(result))


def cmd_calibrate(args: argparse.Namespace) -> None:
    from minillm.card.calibrate import calibrate, calibration_path, describe

    result = calibrate(args.device)
    print(describe(result))
    print(f"saved {calibration_path(result['device'])}")


def add_commands(sub) -> None:
    from minillm.card.sizes import SIZES

    p = sub.add_parser("whatif", help="a real model on a real card: memory, users that fit, tokens/s (roofline)")
    p.add_argument("--model", default="llama-3.1-8b", help="a shipped model (e.g. qwen3-0.6b) or a config.json path")
    p.add_argument("--gpu", default="rtx-4090", help="a card (e.g. h100-sxm) or this-machine (calibrated)")
    p.add_argument("--dtype", default="bf16", help="weights: fp32, bf16, fp16, fp8 or int4")
    p.add_argument("--kv-dtype", default="bf16", help="KV cache: bf16, fp16 or fp8")
    p.add_argument("--context", type=int, default=4096, help="tokens of context per user")
    p.add_argument("--batch", type=int, default=1, help="users decoding together")
    p.add_argument("--tp", type=int, default=1, help="cards the model is split over (tensor parallelism)")
    p.add_argument("--link", default=None, help="between the cards: nvlink-4, nvlink-3, pcie-4 or pcie-5 "
                   "(default: the card's own, e.g. NVLink on an H100 SXM, PCIe on an RTX 4090)")  # fmt: skip
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
    p.set_defaults(func=cmd_whatif)

    p = sub.add_parser("calibrate", help="measure this machine: bandwidth, matmul FLOP/s, fixed cost per op")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.set_defaults(func=cmd_calibrate)
