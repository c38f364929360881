"""A request's life: waiting -> running -> finished, with preemption sending it back to the queue.

    submit ──> WAITING ──(admitted to a seat)──> RUNNING ──(EOS, length or abort)──> FINISHED
       │          ▲                                 │
       │          └────────(preempted: KV freed)────┘
       └──> REJECTED (can never be served: the reason says why)

While it runs, a request has tokens whose keys and values are not in the KV cache yet: its
whole prompt when it is admitted, then the one token it produced last step. `num_computed`
counts the tokens that are in the cache; each step the scheduler decides how many of the
rest the request runs (all of them, or a chunk of a long prompt under a token budget).
With speculative decoding (speculate.py) a decoding request also carries draft tokens guessed past
its last one: they are pending too, so its row runs 1 + len(draft) tokens and the big model checks them.
A preempted request keeps the tokens it produced but loses its cache (`num_computed` = 0):
when it is admitted again it recomputes prompt + output, then carries on decoding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

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
    ignore_eos: bool = False  # run to exactly max_new_tokens (the seed story fixes reply lengths)
    prompt: str = ""  # the text, for display
    arrival_s: float | None = None  # arrival in seconds on the engine's clock; when set, it rules over arrival_step
    planned_reply: int | None = None  # the reply length a workload drew: a simulated model replies this long, then EOS
    sampling: Sampling = Sampling()  # how its tokens are picked (sampler.py): greedy unless it asks otherwise
    constraint: Any = None  # a pattern the reply must match: an automaton over bytes (constrain.py), or None
    handoff: bool = False  # prefill here, decode on another engine: hand over after the first token (handover.py)
    kv_import: Any = None  # a handed-over request's prompt keys and values (L, n, Hkv, D) each, until admitted

    state: State = State.WAITING
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[tuple] = field(default_factory=list)  # when sampling.logprobs is set: one per token made
    seat: int | None = None
    num_computed: int = 0  # tokens (prompt, then output) whose keys and values are in the KV cache
    admit_step: int | None = None  # the first admission
    admit_order: int = -1  # engine-wide admission counter (latest admission): preemption picks the newest
    first_token_step: int | None = None
    finish_step: int | None = None
    finish_reason: str | None = None  # "eos" | "length" | "aborted" | the rejection reason
    preemptions: int = 0
    prefill_tokens: int = 0  # prompt (and recomputed) tokens this request ran through the model
    prompt_tokens_from_cache: int = 0  # prompt tokens its first admission took from the prefix cache (not computed)
    draft: list[int] = field(default_factory=list)  # this step's guesses past the last token (speculate.py)
    draft_q: list = field(default_factory=list)  # a sampled request's: the drafter's distribution for each guess
    constraint_state: int = 0  # where the constraint's automaton stands after the reply so far
    rng_seed: int | None = None  # a sampled request's own seed when it gave none (the engine draws it: sampler.py)
    drafts_verified: int = 0  # draft tokens the big model checked, over the request's life
    drafts_accepted: int = 0  # ... and found right (kept in the reply)
    # seconds on the engine's clock since it started
    first_token_s: float | None = None
    finish_s: float | None = None

    @property
    def is_finished(self) -> bool:
        return self.state is State.FINISHED or self.state is State.REJECTED  # (asked millions of times a run)

    @property
    def num_tokens(self) -> int:
        """Prompt plus output so far."""
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def tokens(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def tokens_in_cache_after_prefill(self) -> int:
        """Tokens an admission must prefill: the prompt, plus any output from before a preemption."""
        return self.num_tokens

    @property
    def num_pending(self) -> int:
        """Tokens not yet in the KV cache: what the request still has to run (its draft's guesses included)."""
        return self.num_tokens + len(self.draft) - self.num_computed

    @property
    def is_decoding(self) -> bool:
        """Its prompt is in the cache: it runs the one token it produced last (and any draft tokens after it)."""
        return self.num_computed >= len(self.prompt_ids) and self.num_tokens - self.num_computed == 1

    def pending_slice(self, count: int) -> list[int]:
        """The next `count` tokens to run, without copying the whole sequence (decode: one token, then the draft)."""
        start, n_prompt = self.num_computed, len(self.prompt_ids)
        if start >= n_prompt:
            return (self.output_ids[start - n_prompt : start - n_prompt + count] + self.draft)[:count]
        head = self.prompt_ids[start : start + count]
        return head + self.output_ids[: count - len(head)]

    @property
    def max_cached_tokens(self) -> int:
        """The most tokens this request can ever keep in the KV cache (its last token is never fed back)."""
        return len(self.prompt_ids) + self.max_new_tokens - 1
