"""The engine everything above the core serves with: the core's loop, each layer on its seam.

    pick           Sampler (sampling.py): temperature, top-k/p, seeds, logprobs, a pattern's mask
                   (constrain.py), the rejection rule
    lookahead      Speculation (speculate.py, drafters.py), when cfg.speculate asks for it
    each token     HandOver (handover.py): a marked request leaves after its first token
    admit with KV  Replies (replies.py): n replies to one prompt, the prompt's blocks shared; Tier (tier.py): a
                   second KV tier in host memory, blocks written through and loaded back on a hit or after preemption
    policy         each request's Service (service.py): its class, priority and targets, which the
                   priority and deadline policies (policies.py) read and the trace keeps
    after the step Recorder (trace.py): a StepRecord per step, the run's Trace; the Sampler's
                   clean-up; the KV books checked (books.py) when cfg.debug

Its step() returns the step's record and run() the trace, as the rest of minillm expects.
"""

from __future__ import annotations

from minillm.config import EngineConfig
from minillm.engine.engine import Engine
from minillm.engine.scheduler import Scheduler
from minillm.errors import InputError
from minillm.layers.books import check_books
from minillm.layers.drafters import drafter_for
from minillm.layers.handover import HandOver
from minillm.layers.replies import Replies
from minillm.layers.sampling import Sampler
from minillm.layers.service import Service
from minillm.layers.speculate import Speculation
from minillm.layers.tier import Tier
from minillm.layers.trace import Recorder, StepRecord, Trace, run_trace


class LayeredEngine(Engine):
    def __init__(self, model, scheduler: Scheduler, cfg: EngineConfig | None = None, meta=None, draft=None):
        """model: a Transformer, or any runner (a simulated card). draft: the draft model speculation guesses with
        (cfg.speculate; default: the shipped one)."""
        super().__init__(model, scheduler, cfg, meta)
        self.services: dict[str, Service] = {}  # request id -> its class, priority and targets (default: none)
        if hasattr(scheduler, "attach"):  # a policy that ranks by them (policies.py)
            scheduler.attach(self)
        self.sampler = self.picker = Sampler()
        self.speculation: Speculation | None = None
        if self.cfg.speculate:
            drafter = drafter_for(self.cfg, self.runner, self.max_len, draft)
            self.speculation = self.lookahead = Speculation(self.cfg.speculate, drafter, self.sampler)
            self.meta.setdefault("drafter", drafter.name)
        self.handover = HandOver(self)
        self.replies = Replies(self)
        self.tier = Tier(self, self.cfg.host_blocks, self.cfg.swap_above) if self.cfg.host_blocks else None
        self.recorder = Recorder(self, self.sampler, self.speculation)
        self.observers.append(self.sampler.after_step)  # (after the Recorder: it reads this step's `allowed`)
        if self.cfg.debug:
            self.observers.append(check_books)

    def submit(self, request, kv=None, service: Service | None = None, follows: tuple[str, int] | None = None) -> bool:
        """The core's submit, with the request's service (class, priority, targets) kept for it (after the core
        has refused a second live request of the same id, which must not overwrite the first one's). follows:
        (the first reply's id, i) for reply i to the same prompt (OpenAI's n), to share the first's prompt blocks
        (replies.py); a first reply that has ended: this one runs alone."""
        if follows is not None and follows[0] in self.live:
            return self.replies.follow(self.live[follows[0]], request, follows[1], service)
        if self.replies.holds(request.id):  # (the core knows only the ids it has queued)
            raise InputError(f"request id {request.id!r} is already queued: give each request its own id")
        queued = super().submit(request, kv)
        if service is not None:
            self.services[request.id] = service
        else:
            self.services.pop(request.id, None)
        return queued

    def submit_replies(self, request, n: int, service: Service | None = None) -> list:
        """Queue `request` for n replies (OpenAI's n), its prompt's KV computed once: the n requests, `request` first
        (replies.py)."""
        return self.replies.submit(request, n, service)

    def abort(self, request_id: str, reason: str = "aborted") -> bool:
        return super().abort(request_id, reason) or self.replies.abort(request_id, reason)

    @property
    def records(self) -> list[StepRecord]:
        return self.recorder.records

    def step(self) -> StepRecord:
        if self.tier is not None:  # (arrivals and the queue: their prefixes in host memory)
            self.tier.before_step()
        super().step()
        return self.records[-1]

    def run(self, max_steps: int = 1_000_000, progress: bool = False) -> Trace:
        super().run(max_steps, progress)
        return self.trace()

    def trace(self) -> Trace:
        return run_trace(self, self.records)
