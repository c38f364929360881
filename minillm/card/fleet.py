"""A fleet on real cards: several simulated engines on one time line, side by side or split into prefill and decode.

    replicas         N engines, each prefilling and decoding its own requests; a router sends each arrival to one:
                     round robin, or least loaded (the tokens its requests still have to run, counted as
                     serving/routing.py counts them). Cache aware needs prompts that share real prefixes; the azure
                     crowds are lengths only (their ids are placeholders, and any prefix two of them share is an
                     accident of how they are made), so the fleet runs without prefix caching and does not offer it.
    prefill:decode   P engines prefill, D decode (layers/handover.py): an arrival goes to the prefill engine with the
                     fewest prompt tokens to run, marked for hand-over; after its first token its KV crosses the
                     link (kv_transfer.py) to the least loaded decode engine, which decodes the rest. A card sends one
                     transfer at a time and takes in one at a time (transfers queue at both ends), and the prefill
                     engine keeps the request's seat and blocks (engine.held) until its transfer has landed
                     (engine.release).

Each engine is the real engine, scheduler and block books over a SimulatedRunner with a virtual clock of its own
(simulate.py). The fleet keeps the clocks on one time line by always doing the earliest thing next: an arrival, a
transfer landing, or a step of the engine whose clock is earliest (a step's effects reach the others as it ends, as a
server's would). Nothing in the engine knows it is in a fleet: each engine's trace is an ordinary trace, and
fleet_figures.py joins a handed-over request's two lives into the crowd's TTFT, ITL and goodput.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field, replace

from minillm.card.hardware import Device, Link
from minillm.card.kv_transfer import kv_transfer
from minillm.card.modelspec import ModelSpec
from minillm.card.simulate import SimulatedRunner, default_slots, default_token_budget
from minillm.card.tensor_parallel import link_of
from minillm.config import EngineConfig
from minillm.engine.engine import Engine
from minillm.engine.request import Request
from minillm.engine.scheduler import ContinuousScheduler
from minillm.errors import ConfigError
from minillm.layers import LayeredEngine
from minillm.layers.handover import export, handed_copy
from minillm.layers.trace import Trace

ROUTES = ("least-loaded", "round-robin")


@dataclass(frozen=True, slots=True)
class Transfer:
    """One prompt's KV on its way from a prefill card to a decode card."""

    request_id: str
    prefill: int  # engine indices
    decode: int
    tokens: int
    bytes: float
    ready_s: float  # its first token made: the KV may go
    start_s: float  # both ends free
    done_s: float


@dataclass
class FleetRun:
    """A fleet's run: every engine as it ended, and what crossed the link."""

    model: str
    gpu: str
    prefill: int  # 0: every engine is a replica
    roles: list[str]  # per engine: "replica", "prefill" or "decode"
    route: str
    link: Link | None  # the KV's link (None: replicas send none)
    engines: list[Engine]
    requests: list[Request]  # the crowd as submitted: each one's first (or only) life
    copies: dict[str, Request] = field(default_factory=dict)  # id -> its life on a decode engine
    transfers: list[Transfer] = field(default_factory=list)
    wall_s: float = 0.0  # this machine's seconds for the whole simulation

    @property
    def split(self) -> str:
        return f"{self.prefill}:{len(self.engines) - self.prefill}" if self.prefill else f"{len(self.engines)} replicas"

    def traces(self) -> list[Trace]:
        return [engine.trace() for engine in self.engines]


def left_to_run(r: Request) -> int:
    """A request's work in hand: its prompt until its first token, and the output it may still make."""
    return (len(r.prompt_ids) if not r.output_ids else 0) + r.max_new_tokens - len(r.output_ids)


def work_in_hand(engine: Engine) -> int:
    """An engine's load as a router counts it: what its live requests still have to run (left_to_run)."""
    return sum(map(left_to_run, engine.live.values()))


def simulated_engine(spec, device, typical_tokens: float, dtype="bf16", kv_dtype="bf16", block_size=16,
                     token_budget=None, slots=None, meta=None) -> Engine:  # fmt: skip
    """One card's engine as `run --simulate` builds it: seats for the KV pool at a typical request's length, vLLM's
    token budget for the card, continuous batching."""
    runner = SimulatedRunner(spec, device, dtype, kv_dtype)
    budget = default_token_budget(runner) if token_budget is None else token_budget
    cfg = EngineConfig(slots=slots or default_slots(runner, block_size, typical_tokens), kv="paged",
                       block_size=block_size, max_len=runner.max_len, record_blocks=False)  # fmt: skip
    policy = ContinuousScheduler(token_budget=budget)
    policy = KeepsHandedSeats(policy) if (meta or {}).get("role") == "prefill" else policy
    return LayeredEngine(runner, policy, cfg, meta=meta)


class KeepsHandedSeats:
    """Continuous batching for a prefill engine whose handed-over requests keep their seats while their KV is on its
    way: the policy is shown the other seats only (ContinuousScheduler.schedule takes every occupied seat for a
    running request, and would plan a step for one that is finished)."""

    def __init__(self, policy: ContinuousScheduler):
        self.policy, self.name, self.token_budget = policy, policy.name, policy.token_budget
        self.holds_finished_seats = policy.holds_finished_seats

    def schedule(self, waiting, seats, kv):
        return self.policy.schedule(waiting, [r for r in seats if r is None or not r.is_finished], kv)


class Fleet:
    def __init__(self, spec: ModelSpec, device: Device, requests: list[Request], cards: int, prefill: int = 0,
                 route: str = "least-loaded", link: str | Link | None = None, dtype="bf16", kv_dtype="bf16",
                 block_size: int = 16, token_budget: int | None = None, slots: int | None = None):  # fmt: skip
        if cards < 1 or not 0 <= prefill < cards or (prefill and cards < 2):
            raise ConfigError(f"a fleet of {cards} card(s) cannot split {prefill} prefill : {cards - prefill} decode; "
                              "give at least 1 card of each, or prefill 0 for replicas")  # fmt: skip
        if route not in ROUTES:
            raise ConfigError(f"unknown route {route!r}; choose one of {', '.join(ROUTES)}")
        if not requests or any(r.arrival_s is None for r in requests):
            raise ConfigError("a fleet's crowd arrives in seconds: give every request an arrival_s (--rate-per-s)")
        self.spec, self.kv_dtype, self.route = spec, kv_dtype, route
        self.link = link_of(device, link) if prefill else None
        self.crowd = sorted((fresh(r) for r in requests), key=lambda r: r.arrival_s)  # (stable: ties keep order)
        typical = sum(len(r.prompt_ids) + (r.planned_reply or r.max_new_tokens) for r in self.crowd) / len(self.crowd)
        roles = ["prefill"] * prefill + ["decode"] * (cards - prefill) if prefill else ["replica"] * cards
        self.engines = [simulated_engine(spec, device, typical, dtype, kv_dtype, block_size, token_budget, slots,
                                         meta={"role": role, "engine": i}) for i, role in enumerate(roles)]  # fmt: skip
        self.start(roles, device.name)

    def start(self, roles: list[str], gpu: str) -> None:
        """The time line's state over self.engines, one role each (built above, or handed over ready-made:
        papers/distserve_fleet.py)."""
        cards = len(self.engines)
        self.run = FleetRun(self.spec.name, gpu, roles.count("prefill"), roles, self.route, self.link, self.engines,
                            self.crowd)  # fmt: skip
        self.entry = [i for i, role in enumerate(roles) if role != "decode"]  # where arrivals go
        self.decoders = [i for i, role in enumerate(roles) if role == "decode"]
        self.ready = [math.inf] * cards  # when each engine can step next (inf: nothing to do, or blocked)
        self.free_at = [0.0] * cards  # when each card's link is free (sending, or taking in)
        self.incoming = [0] * cards  # tokens of work on their way to each decode engine
        self.landings: list[tuple[float, int, Transfer, Request]] = []  # a heap, by landing time
        self.turn = -1  # round robin's last choice

    # --- the time line ---------------------------------------------------------------------------------------
    def simulate(self) -> FleetRun:
        started, arrivals = time.perf_counter(), iter(self.crowd)
        arrival = next(arrivals, None)
        while True:
            t_arrival = arrival.arrival_s if arrival is not None else math.inf
            t_landing = self.landings[0][0] if self.landings else math.inf
            t_step = min(self.ready)
            if min(t_arrival, t_landing, t_step) == math.inf:
                break
            if t_arrival <= t_landing and t_arrival <= t_step:  # (ties: arrivals first, as an engine admits them)
                i = self.choose(arrival)
                if self.run.prefill:  # a prefill engine hands it over after its first token
                    self.engines[i].handover.mark(arrival)
                self.submit(i, arrival, t_arrival)
                arrival = next(arrivals, None)
            elif t_landing <= t_step:
                self.land(*heapq.heappop(self.landings)[2:])
            else:
                self.step(self.ready.index(t_step))
        stuck = [e.meta["engine"] for e in self.engines if e.live or e.held]
        assert not stuck, f"engines {stuck} still hold requests when the fleet has nothing left to do"
        self.run.wall_s = time.perf_counter() - started
        return self.run

    def submit(self, i: int, request: Request, now: float, kv=None) -> None:
        request.arrival_s = now
        self.engines[i].submit(request, kv=kv)
        if self.ready[i] == math.inf:
            self.ready[i] = max(self.engines[i].clock.now(), now)

    def step(self, i: int) -> None:
        engine = self.engines[i]
        record = engine.step()
        for request in engine.held:  # (handed-over this step: its first token is made, its KV may go)
            if request.finish_step == record.step:
                self.send(i, request)
        stalled = record.computed_tokens == 0  # (its seats or blocks held by KV on its way out: a landing frees them)
        self.ready[i] = engine.clock.now() if engine.live and not stalled else math.inf

    # --- routing -----------------------------------------------------------------------------------------------
    def choose(self, request: Request) -> int:
        """The engine an arrival goes to."""
        if self.route == "round-robin":
            self.turn = (self.turn + 1) % len(self.entry)
            return self.entry[self.turn]
        if self.run.prefill:  # a prefill engine's work: the prompt tokens it has still to run
            load = lambda i: sum(len(r.prompt_ids) - min(r.num_computed, len(r.prompt_ids))
                                 for r in self.engines[i].live.values())  # fmt: skip
        else:
            load = lambda i: work_in_hand(self.engines[i])
        return min(self.entry, key=lambda i: (load(i), i))

    def least_loaded_decoder(self) -> int:
        return min(self.decoders, key=lambda i: (work_in_hand(self.engines[i]) + self.incoming[i], i))

    # --- the hand-over ---------------------------------------------------------------------------------------
    def send(self, p: int, request: Request) -> None:
        """A prompt's KV leaves prefill engine p once both ends' links are free."""
        d = self.least_loaded_decoder()
        cost = kv_transfer(self.spec, request.num_computed, self.link, self.kv_dtype)
        start = max(request.finish_s, self.free_at[p], self.free_at[d])
        move = Transfer(request.id, p, d, cost.tokens, cost.bytes, request.finish_s, start, start + cost.seconds)
        self.free_at[p] = self.free_at[d] = move.done_s
        self.incoming[d] += left_to_run(request)
        heapq.heappush(self.landings, (move.done_s, len(self.run.transfers), move, request))
        self.run.transfers.append(move)

    def land(self, move: Transfer, request: Request) -> None:
        """The KV is in the decode card's memory: the prefill side frees it, the decode engine takes the request."""
        prefill = self.engines[move.prefill]
        copy, kv = handed_copy(request), export(prefill, request)
        prefill.release(request)
        if prefill.live and self.ready[move.prefill] == math.inf:  # (it may have waited for these blocks)
            self.ready[move.prefill] = max(prefill.clock.now(), move.done_s)
        self.incoming[move.decode] -= left_to_run(request)
        self.run.copies[copy.id] = copy
        self.submit(move.decode, copy, move.done_s, kv=kv)


def fresh(r: Request) -> Request:
    """A copy to serve, so the caller's crowd can be served again (by another fleet)."""
    return replace(r, output_ids=[], lookahead=[])


def simulate_fleet(spec: ModelSpec, device: Device, requests: list[Request], cards: int, prefill: int = 0,
                   **options) -> FleetRun:  # fmt: skip
    """Serve `requests` (arrivals in seconds; left unchanged) on `cards` cards of `device`: replicas (prefill 0) or
    prefill : cards - prefill. options: Fleet's (route, link, dtype, kv_dtype, block_size, token_budget, slots)."""
    return Fleet(spec, device, requests, cards, prefill, **options).simulate()
