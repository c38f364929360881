"""The model's commands: generate a reply, train, evaluate, export to the standard Llama layout."""

from __future__ import annotations

import argparse
import sys
import time

from minillm.cli.args import model_args, positive_int, sampling_args
from minillm.errors import ConfigError


def cmd_generate(args: argparse.Namespace) -> None:
    from minillm.errors import InputError
    from minillm.layers import generate  # (the one-user loop with every pick rule: temperature, top-k/p, seed)
    from minillm.model.checkpoint import load_model
    from minillm.model.tokenizer import decode, encode_prompt
    from minillm.training import tasks

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
        top_p=args.top_p,
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
    import dataclasses

    from minillm.config import ModelConfig
    from minillm.layers.drafters import DRAFT_CHECKPOINT
    from minillm.model.checkpoint import DEFAULT_CHECKPOINT
    from minillm.training.draft import DRAFT_MODEL, DRAFT_TRAINING
    from minillm.training.train import TrainConfig, format_accuracy, train_and_save

    out = args.out or (DRAFT_CHECKPOINT if args.draft else DEFAULT_CHECKPOINT)
    cfg, model_cfg = (DRAFT_TRAINING, DRAFT_MODEL) if args.draft else (TrainConfig(), ModelConfig())
    cfg = dataclasses.replace(cfg, seed=args.seed, steps=args.steps or cfg.steps)
    results = train_and_save(out, cfg, model_cfg=model_cfg)
    print(format_accuracy(results))
    print(f"saved {out}")


def cmd_eval(args: argparse.Namespace) -> None:
    from minillm.layers.drafters import DRAFT_CHECKPOINT, DRAFT_RETRAIN_HINT
    from minillm.model.checkpoint import RETRAIN_HINT, load_model
    from minillm.training.train import evaluate, format_accuracy

    if args.draft and args.checkpoint:
        raise ConfigError("give --draft (the shipped draft model) or --checkpoint FILE, not both")
    path, hint = (DRAFT_CHECKPOINT, DRAFT_RETRAIN_HINT) if args.draft else (args.checkpoint, RETRAIN_HINT)
    model = load_model(path, args.device, hint=hint)
    results = evaluate(model, per_task=args.per_task)
    print(format_accuracy(results))


def cmd_export(args: argparse.Namespace) -> None:
    from minillm.model.checkpoint import load_model
    from minillm.serving.export import EXPORTED_FILES, export_llama

    out = export_llama(load_model(args.checkpoint, "cpu"), args.out)
    print(f"wrote {', '.join(EXPORTED_FILES)} to {out}: e.g. `transformers serve {out}` serves it")


def add_commands(sub) -> None:
    p = sub.add_parser("generate", help="reply to one prompt")
    p.add_argument("--prompt", required=True, help='e.g. "count down from 12", "spell 4096"')
    p.add_argument("--max-new-tokens", type=int, default=None, help="default: until EOS or the context is full")
    sampling_args(p)
    p.add_argument("--seed", type=int, default=None, help="the same seed, the same reply (with --temperature)")
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
    p.add_argument("--draft", action="store_true",
                   help="train the draft model speculative decoding guesses with (minillm/training/draft.py; "
                   "default --out: minillm/weights/draft.safetensors)")  # fmt: skip
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("eval", help="held-out exact-match accuracy per task")
    p.add_argument("--per-task", type=positive_int, default=50)
    p.add_argument("--draft", action="store_true", help="evaluate the shipped draft model")
    model_args(p)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("export", help="write a Llama-layout folder (weights, config, tokenizer, chat template) any "
                       "server can load")  # fmt: skip
    p.add_argument("--out", required=True)
    p.add_argument("--checkpoint", default=None)
    p.set_defaults(func=cmd_export)
