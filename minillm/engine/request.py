"""A request's life: waiting -> running -> finished, with preemption sending it back to the queue.

    submit ──> WAITING ──(admitted to a seat)──> RUNNING ──(EOS, length or abort)──> FINISHED
       │          ▲                                 │
       │          └────────(preempted: KV freed)────┘
       └──> REJECTED (can never be served: the reason says why)

While it runs, a request has tokens whose keys and values are not in the KV cache yet: its whole
prompt when it is admitted, then the token it produced last step. `num_computed` counts those in
the cache; each step the scheduler decides how many of the rest it runs (all, or a chunk of a long
prompt under a token budget). A preempted request keeps its output but loses its cache: admitted
again, it recomputes prompt + output, then decodes on. A layer may lengthen a decoding row for one
step with `lookahead` tokens past its end (engine.py's seams): they count as pending too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from minillm.config import Sampling


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
    ignore_eos: bool = False  # run to exactly max_new_tokens (fixed reply lengths)
    prompt: str = ""  # the text, for display
    arrival_s: float | None = None  # arrival on the engine's clock, in seconds: rules over steps
    planned_reply: int | None = None  # a simulated model replies this long (card/simulate.py)
    sampling: Sampling = Sampling()  # how its tokens are picked: greedy unless it asks otherwise

    state: State = State.WAITING
    output_ids: list[int] = field(default_factory=list)
    seat: int | None = None
    num_computed: int = 0  # tokens with keys and values in the cache (waiting: those it brought)
    lookahead: list[int] = field(default_factory=list)  # this step only: tokens past its end
    admit_step: int | None = None  # the first admission
    admit_order: int = -1  # engine-wide admission counter (latest): preemption picks the newest
    first_token_step: int | None = None
    finish_step: int | None = None
    finish_reason: str | None = None  # "eos", "length", "aborted", why rejected, or a layer's
    preemptions: int = 0
    prefill_tokens: int = 0  # prompt (and recomputed) tokens it ran through the model
    prompt_tokens_from_cache: int = 0  # prompt tokens its first admission found in the cache
    first_token_s: float | None = None  # seconds on the engine's clock since it started
    finish_s: float | None = None

    @property
    def is_finished(self) -> bool:
        return self.state is State.FINISHED or self.state is State.REJECTED

    @property
    def num_tokens(self) -> int:  # prompt plus output so far
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def tokens(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def tokens_in_cache_after_prefill(self) -> int:  # the prompt, and output before a preemption
        return self.num_tokens

    @property
    def num_pending(self) -> int:  # not yet in the KV cache: what it still runs (lookahead too)
        return self.num_tokens + len(self.lookahead) - self.num_computed

    @property
    def is_decoding(self) -> bool:  # it runs the token it produced last (and any lookahead)
        prompt_done = self.num_computed >= len(self.prompt_ids)
        return prompt_done and self.num_tokens - self.num_computed == 1

    def pending_slice(self, count: int) -> list[int]:
        """The next `count` tokens to run, without copying the whole sequence."""
        start, n_prompt = self.num_computed, len(self.prompt_ids)
        if start >= n_prompt:  # decode: one token, then the lookahead
            done = start - n_prompt
            return (self.output_ids[done : done + count] + self.lookahead)[:count]
        head = self.prompt_ids[start : start + count]
        return head + self.output_ids[: count - len(head)]

    @property
    def max_cached_tokens(self) -> int:  # the most it ever keeps in the cache (not its last)
        return len(self.prompt_ids) + self.max_new_tokens - 1


def problem(r: Request, vocab: int, context: int) -> str | None:
    """Why a request can never be served by a model of `vocab` tokens and `context` positions,
    with the fix; None if it can."""
    n, ids, most = len(r.prompt_ids), r.prompt_ids, r.max_new_tokens
    if n == 0:
        return "empty prompt: give at least one token (e.g. --prompt 'count down from 12')"
    if min(ids) < 0 or max(ids) >= vocab:
        return f"prompt ids must lie in [0, {vocab}); got {min(ids)}..{max(ids)}"
    if most < 1:
        return f"max_new_tokens must be at least 1, got {most}"
    if n >= context:
        fix = f"shorten the prompt to at most {context - 1} tokens"
        return f"the prompt is {n} tokens but the model's context is {context}: {fix}"
    if r.max_cached_tokens >= context:
        fix = f"use max_new_tokens <= {context - n}"
        return f"prompt ({n}) + max_new_tokens ({most}) exceeds the context of {context}; {fix}"
    return None
