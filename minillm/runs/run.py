"""Serve a named workload through the engine in one call: what the CLI, app, notebooks and bench share."""

from __future__ import annotations

from dataclasses import replace

from minillm.card.simulate import SimulatedRunner, default_slots, default_token_budget
from minillm.config import EngineConfig, Sampling
from minillm.engine.scheduler import DEFAULT_TOKEN_BUDGET, Scheduler
from minillm.layers import LayeredEngine
from minillm.layers.policies import make_policy
from minillm.layers.trace import Trace
from minillm.model.transformer import Transformer
from minillm.runs.classes import ClassTargets, services
from minillm.runs.conversations import ConversationKnobs, conversation_engine
from minillm.runs.workload import MULTI_TURN, SEED_STORY_SLOTS, ChatKnobs, make_workload


def run_workload(model: Transformer | SimulatedRunner, workload: str = "seed-story", *args, progress: bool = False,
                 **kwargs) -> Trace:  # fmt: skip
    """Build the workload, submit it all, run the engine until every request is done; return the trace.
    The arguments are workload_engine's (tp > 1: the model split across that many processes, stopped after)."""
    engine = workload_engine(model, workload, *args, **kwargs)
    try:
        return engine.run(progress=progress)
    finally:
        if hasattr(engine.runner, "close"):  # (a tensor-parallel runner: its worker processes end here)
            engine.runner.close()


def workload_engine(
    model: Transformer | SimulatedRunner,
    workload: str = "seed-story",
    scheduler: str | Scheduler = "continuous",
    kv: str = "paged",
    slots: int | None = None,
    num_blocks: int | None = None,
    block_size: int = 16,
    knobs: ChatKnobs | None = None,
    seed: int = 0,
    token_budget: int | None = None,
    prefix_caching: bool = False,
    sampling: Sampling | None = None,
    speculate: int = 0,
    drafter: str = "model",
    draft: Transformer | None = None,
    tp: int = 1,
    victim: str | None = None,
    targets: ClassTargets | None = None,
    n: int = 1,
    host_blocks: int = 0,
    swap_above: int = 0,
    conversations: ConversationKnobs | None = None,
) -> LayeredEngine:
    """The engine with the workload submitted, ready to run (run_workload runs it; the app's what-if view steps it
    itself, to stop a long simulation early).

    `model` is the tiny model, or a SimulatedRunner (a real model on a simulated card).
    `scheduler` is a name ("static", "continuous", "priority", "deadline": layers/policies.py, where `victim`
    names whom it preempts) or any object with the Scheduler protocol, such as a student's own (then
    `token_budget` is its own business). The mixed workload's requests carry their class's service (priority,
    targets: runs/classes.py, `targets` to change them). slots defaults to 4 for the
    seed story, 8 otherwise, and on a simulated card to as many users as its KV memory holds.
    token_budget: tokens per step (0: none, whole prompts in the step they are admitted; None: the default,
    scheduler.DEFAULT_TOKEN_BUDGET for the tiny model, vLLM's server default on a simulated card).
    sampling: how every user's tokens are picked (None: greedy); each user draws with its own seed, taken from
    `seed`, so the same run gives the same replies.
    speculate: draft tokens a decoding request guesses per step (0: off), by `drafter` ("model": `draft`, by
    default the shipped draft model; "ngram": prompt lookup), see layers/speculate.py.
    tp: tensor-parallel ranks the model is split across (parallel/: worker processes; the caller closes
    engine.runner when done, as run_workload does).
    n: replies to each request (OpenAI's n: LayeredEngine.submit_replies, the prompt's KV computed once and shared;
    reply i of a user `r7` is `r7#i`, drawing from the user's seed + i).
    host_blocks, swap_above: a second KV tier in host memory under the prefix cache (layers/tier.py).
    The multi-turn workload (runs/conversations.py: `conversations`, default: knobs' users and rate) makes each
    user's next turn as their last reply ends; sampling, tp and n are not for it.
    """
    config = {"kv": kv, "block_size": block_size, "prefix_caching": prefix_caching, "speculate": speculate,
              "drafter": drafter, "host_blocks": host_blocks, "swap_above": swap_above}  # fmt: skip
    if workload == MULTI_TURN:
        users = {"users": knobs.requests, "rate_per_s": knobs.rate_per_s or 2.0} if knobs else {}
        turns = conversations or ConversationKnobs(**users, seed=seed)
        sized = {"slots": slots} if slots else {}
        sized |= {"num_blocks": num_blocks} if num_blocks else {}
        return conversation_engine(model, turns, scheduler, token_budget, **config, **sized)[0]
    if token_budget is None:
        simulated = isinstance(model, SimulatedRunner)
        token_budget = default_token_budget(model) if simulated else DEFAULT_TOKEN_BUDGET
    policy = make_policy(scheduler, token_budget, victim) if isinstance(scheduler, str) else scheduler
    requests = make_workload(workload, knobs, seed)
    for i, request in enumerate(requests if sampling else []):
        request.sampling = replace(sampling, seed=hash((seed, i)) % 2**63)
    meta = {"workload": workload, "seed": seed}
    extra = {}
    if isinstance(model, SimulatedRunner):  # a big model: its context, a pool sized by the card, lean records
        typical = sum(len(r.prompt_ids) + (r.planned_reply or r.max_new_tokens) for r in requests) / len(requests)
        slots = slots or default_slots(model, block_size, typical)
        extra = {"max_len": model.max_len, "record_blocks": False}
        meta |= {"model": model.spec.name, "gpu": model.card.name, "dtype": model.dtype, "kv_dtype": model.kv_dtype}
    slots = slots or (SEED_STORY_SLOTS if workload == "seed-story" else 8)
    cfg = EngineConfig(slots=slots, num_blocks=num_blocks, **config, **extra)
    if tp > 1:
        from minillm.parallel.runner import ShardedRunner

        model, meta = ShardedRunner(model, tp), meta | {"tp": tp}
    engine = LayeredEngine(model, policy, cfg, meta=meta, draft=draft)
    promised = services(requests, targets) if workload == "mixed" else {}
    for request in requests:
        engine.submit_replies(request, n, service=promised.get(request.id))  # (n = 1: as submit)
    return engine
