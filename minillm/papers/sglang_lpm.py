"""SGLang's cache-aware scheduling: the waiting queue in longest-prefix-match order, not first come, first served.

SGLang's paper (section 3, Alg. 1) sorts the waiting requests by how much of their prompt the cache holds and admits
the longest match first; its server's default policy (server_args.py schedule_heuristic "lpm"). Theorem 3.1: this
is a depth-first visit of the requests' radix tree, the order that maximizes hits. Everything else is minillm's
continuous scheduler: the running requests go first, then the newcomers in this order while seats, blocks and the
step's tokens last. Ties keep the queue's order (a stable sort), so a workload with no sharing is served FCFS.
"""

from __future__ import annotations

from minillm.engine.scheduler import ContinuousScheduler, Plan


class LongestPrefixScheduler(ContinuousScheduler):
    name = "lpm"

    def schedule(self, waiting, seats, kv) -> Plan:
        matched = {r.id: kv.cached_prefix(r.tokens) for r in waiting}
        return super().schedule(sorted(waiting, key=lambda r: -matched[r.id]), seats, kv)
