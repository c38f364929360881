"""A request's service: its class, its priority, the latency it was promised, and whether it got it.

Seam: policy (with policies.py). The core knows nothing of this. The LayeredEngine keeps a Service per request
id (`engine.services`); the priority and deadline policies read it to order the queue; the trace writes it with
the request; the metrics judge each request against it.

  priority    lower goes first, as vLLM's per-request `priority` (default 0)
  ttft_s      the first token within this many seconds of arrival (a user watching the screen)
  tpot_s      the later tokens at most this many seconds apart on average (reading speed)
  deadline_s  the whole reply within this many seconds of arrival (a batch job nobody watches)

Goodput (DistServe, Zhong et al., OSDI 2024): requests per second that finished meeting all their targets. A
request with no target meets them by finishing; an aborted or rejected one meets none.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from minillm.errors import InputError

TARGETS = ("ttft_s", "tpot_s", "deadline_s")


@dataclass(frozen=True)
class Service:
    cls: str = "default"
    priority: int = 0
    ttft_s: float | None = None
    tpot_s: float | None = None
    deadline_s: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.cls, str) or not self.cls:
            raise InputError(f"a request's class must be a non-empty name, got {self.cls!r}")
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            fix = "a whole number, lower first (vLLM's rule), e.g. 0 for interactive users and 1 for batch jobs"
            raise InputError(f"priority must be {fix}; got {self.priority!r}")
        for name in TARGETS:
            value = getattr(self, name)
            ok = isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < math.inf
            if value is not None and not ok:
                raise InputError(f"{name} must be a positive number of seconds (or left out: no target), got {value!r}")

    @property
    def targets(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in TARGETS if getattr(self, name) is not None}

    def to_dict(self) -> dict:
        """As the trace writes it: the class and priority, and only the targets it has."""
        return {k: v for k, v in asdict(self).items() if k not in TARGETS or v is not None}

    @classmethod
    def from_dict(cls, data: dict) -> Service:
        unknown = set(data) - {"cls", "priority", *TARGETS}
        if unknown:
            fields = ", ".join(("cls", "priority", *TARGETS))
            raise InputError(f"a service has no field {sorted(unknown)[0]!r}; it has {fields}")
        return cls(**data)


DEFAULT = Service()


def judge(service: Service, measured: dict[str, float], finished: bool) -> dict[str, bool]:
    """Each of the service's targets -> met or not, from the request's figures (metrics.per_request: ttft_s,
    tpot_s, latency_s). A request that did not finish met none; a one-token reply has no TPOT to miss."""
    out = {}
    for name, limit in service.targets.items():
        value = measured.get("latency_s" if name == "deadline_s" else name)
        out[name] = finished and (value is None and name == "tpot_s" or value is not None and value <= limit)
    return out
