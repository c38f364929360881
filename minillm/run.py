"""Serve a named workload through the engine in one call: what the CLI, app, notebooks and bench share."""

from __future__ import annotations

from minillm.config import EngineConfig
from minillm.engine import Engine
from minillm.model import Transformer
from minillm.scheduler import SCHEDULERS, Scheduler
from minillm.trace import Trace
from minillm.workload import SEED_STORY_SLOTS, ChatKnobs, make_workload


def run_workload(
    model: Transformer,
    workload: str = "seed-story",
    scheduler: str | Scheduler = "continuous",
    kv: str = "paged",
    slots: int | None = None,
    num_blocks: int | None = None,
    block_size: int = 16,
    knobs: ChatKnobs | None = None,
    seed: int = 0,
    progress: bool = False,
) -> Trace:
    """Build the workload, submit it all, run the engine until every request is done; return the trace.

    `scheduler` is a name ("static", "continuous") or any object with the Scheduler protocol,
    such as a student's own. slots defaults to 4 for the seed story, 8 otherwise.
    """
    policy = SCHEDULERS[scheduler]() if isinstance(scheduler, str) else scheduler
    slots = slots or (SEED_STORY_SLOTS if workload == "seed-story" else 8)
    cfg = EngineConfig(slots=slots, kv=kv, block_size=block_size, num_blocks=num_blocks)
    engine = Engine(model, policy, cfg, meta={"workload": workload, "seed": seed})
    for request in make_workload(workload, knobs, seed):
        engine.submit(request)
    return engine.run(progress=progress)
