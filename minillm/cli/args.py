"""Argument types and the options every model-loading command shares."""

from __future__ import annotations

import argparse


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


def non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0:  # (nan too: "abc", "nan")
        raise argparse.ArgumentTypeError(f"must be a number above 0, got {text!r}")
    return value


# The tiny model's CPU ops are too small to split: a second thread mostly waits, and when another program
# uses a core the two threads stall each other (seed story, continuous, on this project's busy 2-core machine:
# 2.5 s on one thread, 29-102 s on two).
THREADS_HELP = "torch CPU threads (default 1: the tiny model's ops are too small to split, and one thread stays fast "
THREADS_HELP += "when other programs share the cores)"


def model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--checkpoint", default=None, help="safetensors file (default: the shipped model)")
    p.add_argument("--threads", type=positive_int, default=1, help=THREADS_HELP)


def compile_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the model's forward: one graph for every step, compiled at start (about 10 s "
                        "on a 2-core CPU); the same tokens")  # fmt: skip
    p.add_argument("--plain-matmul", action="store_true",
                   help="the model's Linear layers as written (MKL on a CPU), not through oneDNN with each weight "
                        "laid out once (layers/prepack.py)")  # fmt: skip


def load_model_from(args: argparse.Namespace, default_forward: str = "prepacked"):
    """The model --checkpoint and --device name, with the forward --compile and --plain-matmul ask for (layers/
    compiled.py); `default_forward` without either (a benchmark measures the model as written)."""
    import sys

    from minillm.layers.compiled import speed_up
    from minillm.model.checkpoint import load_model

    forward = "plain" if getattr(args, "plain_matmul", False) else default_forward
    forward = "compiled" if getattr(args, "compile", False) else forward
    model = speed_up(load_model(args.checkpoint, args.device), forward, compile_now=True)  # (before any step's clock)
    if getattr(model.forward, "compile_s", None) is not None:
        print(f"--compile: the forward compiled in {model.forward.compile_s:.0f} s", file=sys.stderr)
    return model


def sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy (the default); higher: more varied")
    p.add_argument("--top-p", type=float, default=1.0, help="draw from the likeliest tokens that make up this share")
    p.add_argument("--top-k", type=int, default=0, help="draw from the k likeliest tokens (0: all)")
