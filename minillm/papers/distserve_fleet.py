"""DistServe's instances on one time line: card/fleet.py's prefill:decode fleet, over engines built here.

card/fleet.py keeps the clocks of several simulated engines on one time line, routes each arrival to the prefill
engine with the fewest prompt tokens to run (DistServe's "shortest queue", section 4.3), sends its KV after the first
token to the least loaded decoding engine over the link (kv_transfer.py; the prefill engine holds the seat and blocks
until it has landed, as DistServe's "pull" keeps the KV in the prefill instance's memory until the decoding instance
takes it), and lands it there. It builds every engine alike; DistServe's are not: the prefill instance is tensor
parallel over more cards than the decoding one and batches whole prompts, the decoding one batches every decode. So
the engines are built here (distserve_systems.py) and handed to the same time line.
"""

from __future__ import annotations

from minillm.card.fleet import Fleet, fresh
from minillm.card.hardware import Link
from minillm.card.modelspec import ModelSpec
from minillm.engine.engine import Engine
from minillm.engine.request import Request


class PlacedFleet(Fleet):
    """Fleet's time line (simulate, routing, hand-over) over prefill and decode engines given ready-made: each a
    LayeredEngine (it has the hand-over layer) on a simulated card of its own, with the same block size."""

    def __init__(self, spec: ModelSpec, link: Link, requests: list[Request], prefill: list[Engine],
                 decode: list[Engine], kv_dtype: str = "fp16"):  # fmt: skip
        # (Fleet.__init__ builds its engines alike; these are given: the rest of its state is Fleet.start's)
        self.spec, self.kv_dtype, self.route, self.link = spec, kv_dtype, "least-loaded", link
        self.crowd = sorted((fresh(r) for r in requests), key=lambda r: r.arrival_s)
        self.engines = [*prefill, *decode]
        roles = ["prefill"] * len(prefill) + ["decode"] * len(decode)
        for i, (engine, role) in enumerate(zip(self.engines, roles)):
            engine.meta.update(role=role, engine=i)
        self.start(roles, prefill[0].runner.card.name)
