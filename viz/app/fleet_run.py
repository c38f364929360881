"""The step player's fleet, in this process: two engines over the shipped model, as lesson 13 runs them.

    replicas  two engines, each with its own seats, KV pool and prefix cache; a router sends each arrival to one by a
              policy of serving/routing.py (round robin, least loaded, cache aware over the replicas' real block keys)
    pair      a prefill engine and a decode engine: every request goes to the first, marked for hand-over; after its
              first token its prompt's KV is copied to the second (layers.handover.hand_over), which decodes the rest

Every engine steps at every step of the fleet (an idle one records an empty step), so a step number is the same moment
in each engine's trace and the step player shows them on one time axis. A request handed over in step t joins the
decode engine's queue at step t + 1: its KV is on its way between the two steps, as between two cards. Each replica's
trace says why the router sent it each of its requests (config["routed"]: request id -> [reason, blocks matched]); a
hand-over needs no note: the prefill trace ends the request "handed-over", and its copy arrives in the decode trace.

No Streamlit here. Each engine gets a runner of its own from `new_runner` (the app's: a replay of recorded replies,
replays.py; tests: the model's own ModelRunner).
"""

from __future__ import annotations

from minillm.card.fleet import work_in_hand
from minillm.config import EngineConfig
from minillm.engine.request import Request
from minillm.engine.scheduler import ContinuousScheduler
from minillm.layers import LayeredEngine
from minillm.layers.handover import hand_over
from minillm.layers.trace import Trace
from minillm.runs.workload import ChatKnobs, make_workload
from minillm.serving.routing import ROUTES, ReplicaView, prompt_keys, shareable

REPLICAS = 2
ROLES = {"replicas": ["replica"] * REPLICAS, "pair": ["prefill", "decode"]}


def engines_for(settings: dict, new_runner) -> list[LayeredEngine]:
    """The fleet's engines: the step player's settings for each (paged KV, continuous batching); new_runner() makes
    each engine's runner."""
    roles = ROLES[settings["fleet"]]
    runners = [new_runner() for _ in roles]
    cfg = EngineConfig(slots=settings["slots"], kv="paged", block_size=settings["block_size"],
                       num_blocks=settings["num_blocks"], prefix_caching=settings["prefix_caching"],
                       max_len=runners[0].max_len)  # fmt: skip
    meta = {"workload": settings["workload"], "seed": settings["seed"], "fleet": settings["fleet"]}
    meta |= {"route": settings["route"]} if settings["fleet"] == "replicas" else {}
    engines = []
    for i, (role, runner) in enumerate(zip(roles, runners)):
        books = {"routed": {}} if role == "replica" else {}  # (filled in as the router sends it requests)
        policy = ContinuousScheduler(token_budget=settings["token_budget"])
        engines.append(LayeredEngine(runner, policy, cfg, meta=meta | {"role": role, "engine": i} | books))
    return engines


def run(settings: dict, new_runner) -> list[Trace]:
    """Serve the settings' crowd on the fleet they name (settings["fleet"]: "replicas" or "pair"); one trace per
    engine, in order (replica 0, replica 1; or prefill, decode)."""
    knobs = settings["knobs"]
    requests = make_workload(settings["workload"], ChatKnobs(**knobs) if knobs else None, settings["seed"])
    engines = engines_for(settings, new_runner)
    if settings["fleet"] == "replicas":
        serve_replicas(engines, requests, ROUTES[settings["route"]](), settings["block_size"])
    else:
        serve_pair(*engines, requests)
    return [engine.trace() for engine in engines]


def serve_replicas(engines: list[LayeredEngine], requests: list[Request], policy, block_size: int) -> None:
    """Route each arrival when it comes (the router sees each replica's load and every block key its prefix cache
    holds), then step every replica; until all are done."""
    arrivals = sorted(requests, key=lambda r: r.arrival_step)[::-1]  # (a stack: the next arrival last)
    step = 0
    while arrivals or any(e.has_work() for e in engines):
        while arrivals and arrivals[-1].arrival_step <= step:
            request = arrivals.pop()
            keys = shareable(prompt_keys(request.prompt_ids, block_size), len(request.prompt_ids), block_size)
            views = [ReplicaView(i, work_in_hand(e), set(e.cache.allocator.key_of.values()))
                     for i, e in enumerate(engines)]  # fmt: skip
            choice = policy.choose(keys, len(request.prompt_ids) + request.max_new_tokens, views)
            engines[choice.replica].meta["routed"][request.id] = [choice.reason, choice.matched_blocks]
            engines[choice.replica].submit(request)
        for engine in engines:
            engine.step()
        step += 1


def serve_pair(prefill: LayeredEngine, decode: LayeredEngine, requests: list[Request]) -> None:
    """Prompts on one engine, replies on the other: after both have stepped, every request that made its first token
    on the prefill engine goes to the decode engine with its prompt's keys and values."""
    for request in requests:
        prefill.handover.mark(request)
        prefill.submit(request)
    while prefill.has_work() or prefill.held or decode.has_work():
        prefill.step()
        decode.step()
        hand_over(prefill, decode)
