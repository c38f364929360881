"""The step player's runs: each prompt's reply computed once by the model, then every setting replayed from it.

A greedy reply does not depend on how it is served (policy, seats, KV layout, block size, token budget, prefix
cache, speculation), so a setting change needs no forward pass: minillm/runs/replay.py serves the crowd with the
recorded replies through the same engine, schedulers and KV cache (0.1-0.5 s for the seed story on a 2-core
laptop, where running the model took 4-8 s). The model runs only for prompts no reply is recorded for: a new
seed or knob draws new prompts, computed all at once (1-3 s) and kept in the user's cache directory beside the
replies shipped with the model (minillm/weights/replies.json: the app's default crowds, so it opens without
running the model at all).

    MINILLM_APP_REPLIES=off   keep new replies in memory only (tests)

Nothing here imports Streamlit.
"""

from __future__ import annotations

import os
from dataclasses import replace
from functools import cache
from pathlib import Path

from minillm.card.calibrate import cache_dir
from minillm.engine.request import Request
from minillm.engine.runner import ModelRunner
from minillm.grammar import compile_regex
from minillm.layers.trace import Trace
from minillm.model.tokenizer import encode_prompt
from minillm.runs.replay import SHIPPED_BOOK, DraftBook, ReplayRunner, ReplyBook, compute_replies, weights_fingerprint
from minillm.runs.run import workload_engine
from minillm.runs.workload import MAX_REPLY, ChatKnobs, longest_countdown_after, make_workload
from minillm.training import tasks
from viz.app import fleet_run

NUMBERS = r"[0-9]+( [0-9]+)*"  # numbers apart by one space: how the model counts down (lesson 14's "habit")
GUESSES: dict[str, list[int]] = {}  # the draft model's guesses by context (DraftBook), for every run of this process


def user_book_path() -> Path | None:
    if os.environ.get("MINILLM_APP_REPLIES", "").lower() == "off":
        return None
    return cache_dir() / "replies" / f"{weights_fingerprint()}.json"


@cache
def book() -> ReplyBook:
    """The shipped replies and the user's own, for the shipped weights (one book for every session)."""
    fingerprint = weights_fingerprint()
    shipped = ReplyBook.load(SHIPPED_BOOK, fingerprint)
    path = user_book_path()
    if path is not None:
        shipped.replies.update(ReplyBook.load(path, fingerprint).replies)
    return shipped


def hold_to_numbers(requests: list[Request]) -> None:
    """Every other user's reply held to NUMBERS (a countdown obeys it as it is; a spelling is forced into digits),
    so the chat shows what each step's mask allowed. (Submitted, not yet arrived: the mask applies from the first
    pick.)"""
    for r in requests[1::2]:
        if r.finish_reason is None and not r.ignore_eos:  # (a constrained reply must be able to end)
            r.sampling = replace(r.sampling, constraint=compile_regex(NUMBERS))


def requests_of(settings: dict) -> list[Request]:
    """The settings' crowd, as the engine will be given it."""
    knobs = settings["knobs"]
    requests = make_workload(settings["workload"], ChatKnobs(**knobs) if knobs else None, settings["seed"])
    if settings.get("constrained"):
        hold_to_numbers(requests)
    return requests


def ensure_replies(settings: dict, model) -> None:
    """Compute the replies the book lacks for this crowd, and keep them."""
    if compute_replies(book(), requests_of(settings), model):
        path = user_book_path()
        if path is not None:
            book().save(path)


def run(scheduler, settings: dict, model, replay: bool = True) -> Trace | list[Trace]:
    """One step-player run, replayed: a scheduler's name or object (the student's), the sidebar's settings
    (step_player.sidebar); model: the shipped model (for missing replies and the KV shapes). A fleet ("fleet" as
    the scheduler) replays every engine of it. replay=False: the model's own forward instead (tests compare)."""
    if replay:
        ensure_replies(settings, model)
    new_runner = (lambda: ReplayRunner(model, book())) if replay else (lambda: ModelRunner(model))
    if scheduler == "fleet":
        return fleet_run.run(settings, new_runner)
    settings = dict(settings)
    workload, knobs, constrained = settings.pop("workload"), settings.pop("knobs"), settings.pop("constrained", False)
    engine = workload_engine(new_runner(), workload, scheduler,
                             knobs=ChatKnobs(**knobs) if knobs else None, **settings)  # fmt: skip
    if constrained:
        hold_to_numbers(engine.requests)
    if engine.speculation is not None and replay:
        engine.speculation.drafter = DraftBook(engine.speculation.drafter, GUESSES)
    return engine.run()


def default_crowds() -> list[dict]:
    """The crowds the app opens on, one setting away: every workload at its default knobs (seed 0), with and without
    constrained replies, and the fleet's two crowds (lesson 13's). Their replies ship with the model."""
    from viz.app.fleet_view import FLEET_CROWDS
    from viz.app.step_player import DEFAULT_KNOBS, WORKLOADS

    crowds = [{"workload": w, "knobs": None if w == "seed-story" else DEFAULT_KNOBS, "seed": 0} for w in WORKLOADS]
    crowds += [crowd | {"constrained": True} for crowd in crowds]
    return crowds + [{"workload": w, "knobs": knobs, "seed": 0} for w, knobs in FLEET_CROWDS.values()]


def every_countdown() -> list[Request]:
    """Each "count down from N" a crowd can ask, alone and after each system prompt: the long replies, so that a new
    seed or knob mostly draws prompts already answered, and the model runs only for the short ones (well under 1 s)."""
    preambles = [None, *tasks.PREAMBLES.values()]
    prompts = [encode_prompt(f"count down from {n}", p) for p in preambles
               for n in range(1, (longest_countdown_after(p) if p else tasks.MAX_COUNT) + 1)]  # fmt: skip
    return [Request(f"c{i}", ids, min(MAX_REPLY + 100, tasks.CONTEXT - len(ids) - 1)) for i, ids in enumerate(prompts)]


def write_shipped_book(model) -> ReplyBook:
    """The replies of default_crowds() and every countdown, computed anew for the shipped weights, into
    minillm/weights/replies.json."""
    shipped = ReplyBook(weights_fingerprint())
    for crowd in default_crowds():
        compute_replies(shipped, requests_of(crowd), model, progress=True)
    compute_replies(shipped, every_countdown(), model, progress=True)
    shipped.save(SHIPPED_BOOK)
    return shipped


if __name__ == "__main__":  # python -m viz.app.replays: after retraining the model
    import torch

    from minillm.model.checkpoint import load_model

    torch.set_num_threads(1)  # (as the app runs the model: its ops are too small to split)
    book_ = write_shipped_book(load_model(device="cpu"))
    print(f"{len(book_.replies)} replies -> {SHIPPED_BOOK} ({SHIPPED_BOOK.stat().st_size / 1e3:,.0f} kB)")
