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
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
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
    p.add_argument("--compile", action="store_true", help="torch.compile the model's forward (a CUDA GPU only)")


def load_model_from(args: argparse.Namespace):
    from minillm.model.checkpoint import load_model

    model = load_model(args.checkpoint, args.device)
    return compile_forward(model) if getattr(args, "compile", False) else model


# Measured on this project's 2-core CPU machine (torch 2.13, gcc present): torch.compile of the forward took 48 s
# for one prefill shape and 62 s for one decode shape, shapes change every step (rows, context), and the compiled
# decode step then ran at 80 ms against 3 ms eager; with dynamic=True Inductor failed ("mul expected 2 arguments").
NO_COMPILE_ON_CPU = ("--compile is for a CUDA GPU: on a CPU, torch.compile of minillm's forward takes about a "
                     "minute per shape and the steps ran slower, not faster (the code you read runs: drop "
                     "--compile)")  # fmt: skip


def compile_forward(model):
    """--compile: the forward through torch.compile where it works (a CUDA GPU). If compiling fails, say why once and
    run the plain forward: the steps do not depend on it."""
    import sys

    import torch

    from minillm.errors import ConfigError

    if next(model.parameters()).device.type != "cuda":
        raise ConfigError(NO_COMPILE_ON_CPU)
    plain, compiled = model.forward, torch.compile(model.forward, dynamic=True)

    def forward(*args, **kwargs):
        try:
            return compiled(*args, **kwargs)
        except Exception as e:  # any compiler failure: fall back, never stop serving
            print(f"--compile: torch.compile failed ({type(e).__name__}: {str(e)[:200]}); running uncompiled",
                  file=sys.stderr)  # fmt: skip
            model.forward = plain
            return plain(*args, **kwargs)

    model.forward = forward
    return model


def sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy (the default); higher: more varied")
    p.add_argument("--top-p", type=float, default=1.0, help="draw from the likeliest tokens that make up this share")
    p.add_argument("--top-k", type=int, default=0, help="draw from the k likeliest tokens (0: all)")
