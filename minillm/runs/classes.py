"""The mixed crowd's classes (runs/workload.py builds the crowd): chat users with a TTFT target, and batch jobs
that only need to finish by a deadline.

Every request carries a Service (layers/service.py): the chat class waits on its first token and reads as it comes;
the batch class summarises a long document nobody watches. The crowd arrives together, past the seats' capacity,
in a random order: first come first served then seats whoever came first, and the chat users behind a batch job
wait for all of it. The priority and deadline policies (layers/policies.py) seat them by what they were promised.

The targets are seconds on the engine's clock. The defaults suit the tiny model on a laptop's CPU (a step of 8
seats takes 5-15 ms) and a 8B model on one data-centre card alike (10-30 ms): give your own with `ClassTargets`.
"""

from __future__ import annotations

from dataclasses import dataclass

from minillm.engine.request import Request
from minillm.layers.service import Service


@dataclass(frozen=True)
class ClassTargets:
    chat_ttft_s: float = 1.0  # a chat user wants the first token within a second
    chat_tpot_s: float = 0.1  # and reads about 10 tokens a second after that
    batch_deadline_s: float = 60.0  # a batch job's whole reply within a minute
    chat_priority: int = 0  # lower first (vLLM's rule)
    batch_priority: int = 1

    def service(self, cls: str) -> Service:
        if cls == "chat":
            return Service("chat", self.chat_priority, ttft_s=self.chat_ttft_s, tpot_s=self.chat_tpot_s)
        return Service("batch", self.batch_priority, deadline_s=self.batch_deadline_s)


def class_of(request_id: str) -> str:
    """The mixed crowd names its requests by class: chat0, chat1, ..., batch0, ..."""
    return "batch" if request_id.startswith("batch") else "chat"


def services(requests: list[Request], targets: ClassTargets | None = None) -> dict[str, Service]:
    """Each request of a mixed crowd -> its class's service."""
    targets = targets or ClassTargets()
    return {r.id: targets.service(class_of(r.id)) for r in requests}
