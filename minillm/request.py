"""A request's life: waiting -> running -> finished, with preemption sending it back to the queue.

    submit ──> WAITING ──(admitted to a seat, prefilled)──> RUNNING ──(EOS or length)──> FINISHED
       │          ▲                                            │
       │          └───────────(preempted: KV freed)────────────┘
       └──> REJECTED (can never be served: the reason says why)

A preempted request keeps the tokens it already produced; when it is admitted again the
engine recomputes the KV for prompt + output in one prefill, then carries on decoding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class State(StrEnum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    REJECTED = "rejected"


@dataclass
class Request:
    id: str
    prompt_ids: list[int]
    max_new_tokens: int
    arrival_step: int = 0
    ignore_eos: bool = False  # run to exactly max_new_tokens (the seed story fixes reply lengths)
    prompt: str = ""  # the text, for display

    state: State = State.WAITING
    output_ids: list[int] = field(default_factory=list)
    seat: int | None = None
    admit_step: int | None = None  # the first admission
    admit_order: int = -1  # engine-wide admission counter (latest admission): preemption picks the newest
    first_token_step: int | None = None
    finish_step: int | None = None
    finish_reason: str | None = None  # "eos" | "length" | the rejection reason
    preemptions: int = 0
    # wall-clock seconds since the engine started
    first_token_s: float | None = None
    finish_s: float | None = None

    @property
    def is_finished(self) -> bool:
        return self.state in (State.FINISHED, State.REJECTED)

    @property
    def tokens_in_cache_after_prefill(self) -> int:
        """Tokens an admission must prefill: the prompt, plus any output from before a preemption."""
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def max_cached_tokens(self) -> int:
        """The most tokens this request can ever keep in the KV cache (its last token is never fed back)."""
        return len(self.prompt_ids) + self.max_new_tokens - 1
