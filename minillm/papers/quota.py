"""TGI's admission rule, as Ray Serve re-implemented it for the Anyscale post: a token quota instead of seats.

Each request counts its prompt and its max_new_tokens against max_batch_total_tokens for as long as it runs (Ray's
InferenceRequest.total_tokens: input_length + max_tokens; python/ray/serve/experimental/llm/queue.py). While a batch
runs, newcomers join only when at least waiting_served_ratio x the batch of them fit, or after max_waiting_tokens
steps without one joining (QuotaBasedRequestSelectionPolicy, python/ray/serve/experimental/llm/policy.py; the
benchmark launches it with max_waiting_tokens=7 and Ray's default ratio 1.2: launch_scripts/launch_ray_dynamic_gen).
Whole prompts run in the step a request joins. A policy on the engine's policy seam (engine/scheduler.py).
"""

from __future__ import annotations

from minillm.engine.request import Request
from minillm.engine.scheduler import KVSpace, Plan


class QuotaScheduler:
    name = "continuous"
    holds_finished_seats = False

    def __init__(self, max_batch_total_tokens: int, waiting_served_ratio: float = 1.2, max_waiting_tokens: int = 7):
        self.total, self.ratio, self.max_waiting = max_batch_total_tokens, waiting_served_ratio, max_waiting_tokens
        self.waited = 0  # steps since a request last joined

    @staticmethod
    def reserved(request: Request) -> int:
        return len(request.prompt_ids) + request.max_new_tokens

    def schedule(self, waiting: list[Request], seats: list, kv: KVSpace) -> Plan:
        running = [r for r in seats if r is not None and not r.is_finished]
        self.waited += 1
        budget = self.total - sum(self.reserved(r) for r in running)
        at_least = 0 if not running or self.waited >= self.max_waiting else int(len(running) * self.ratio)
        joining: list[Request] = []
        for request in waiting[: seats.count(None)]:
            if self.reserved(request) >= budget:
                break
            joining.append(request)
            budget -= self.reserved(request)
        if len(joining) < at_least:
            joining = []
        if joining:
            self.waited = 0
        tokens = {r.id: r.num_pending for r in running} | {r.id: r.num_tokens for r in joining}
        return Plan(admit=joining, tokens=tokens)
