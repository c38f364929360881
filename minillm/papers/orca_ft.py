"""FasterTransformer's batch as Orca's paper describes it (section 6.2), one cost beyond request-level scheduling:
"for the first iteration of the batch, FasterTransformer processes requests as if they all had the same input length
as the shortest one". The rest of each longer prompt then runs one token an iteration, as generation steps do
(FasterTransformer's GPT decoder feeds the remaining input tokens through its generation loop), so a batch of inputs
32 and 512 spends 480 iterations before the longer one's first token.

Otherwise minillm's static scheduler: the batch runs until its longest member is done, finished rows keep their seats
and are computed on, nobody joins.
"""

from __future__ import annotations

from minillm.engine.scheduler import Plan, StaticScheduler, keep_running


class ShortestFirstScheduler(StaticScheduler):
    name = "ft-shortest-first"

    def __init__(self):
        super().__init__(token_budget=None)

    def schedule(self, waiting, seats, kv) -> Plan:
        running = [r for r in seats if r is not None and not r.is_finished]
        if running:  # one token a row an iteration: the prompts' rest, then generation
            victims, tokens, _ = keep_running(running, kv, None)
            return Plan(preempt=victims, tokens={rid: min(n, 1) for rid, n in tokens.items()})
        plan = super().schedule(waiting, seats, kv)
        if plan.admit:
            shortest = min(plan.tokens[r.id] for r in plan.admit)
            plan.tokens = {r.id: min(plan.tokens[r.id], shortest) for r in plan.admit}
        return plan
