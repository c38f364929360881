"""A paper's runs as traces for the step player: inside `saving_traces(folder)`, every engine a paper's experiment
builds with `paper_engine` records its steps (layers/engine.py's LayeredEngine, the same engine with the trace) and is
written to the folder as NAME.json when the block ends; the app replays any of them ("replay a saved trace"), so the
room sees a paper's figure as seats. Outside it, a paper's engine is the core Engine, recording nothing (faster).

Every step of every run is recorded, so the crowd should be a sampled slice (`--requests 40`), and a search over
rates (a capacity) writes one trace per rate it tried."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

from minillm.config import EngineConfig
from minillm.engine.engine import Engine
from minillm.layers.engine import LayeredEngine

_saving: ContextVar[list | None] = ContextVar("saving", default=None)  # (name, engine) of each run, while saving


def paper_engine(runner, policy, cfg: EngineConfig, name: str, meta: dict | None = None, layered=False) -> Engine:
    """The engine for one run of a paper's experiment: name says which (the trace's file name), meta what the trace
    records of it (the workload, the model, the card); layered: a LayeredEngine whether saving or not (a fleet's
    engines hand their KV over through its layers)."""
    saving = _saving.get()
    if saving is None and not layered:
        return Engine(runner, policy, cfg)
    engine = LayeredEngine(runner, policy, cfg, meta={"workload": name, **(meta or {})})
    if saving is not None:
        saving.append((name, engine))
    return engine


@contextmanager
def saving_traces(folder: str | Path) -> Iterator[list[Path]]:
    """Every paper_engine built inside records its steps; at the end each is written to folder (the list yielded
    fills with the paths written)."""
    folder, runs, written = Path(folder), [], []
    folder.mkdir(parents=True, exist_ok=True)
    token = _saving.set(runs)
    try:
        yield written
    finally:
        _saving.reset(token)
    taken: dict[str, int] = {}
    for name, engine in runs:
        if not engine.records:  # (built, never stepped: e.g. a fleet's engine no request reached)
            continue
        stem = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-")
        taken[stem] = taken.get(stem, 0) + 1
        path = folder / f"{stem}{'' if taken[stem] == 1 else f'-{taken[stem]}'}.json"
        path.write_text(json.dumps(engine.trace().to_dict()))
        written.append(path)
