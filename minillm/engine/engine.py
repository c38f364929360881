"""The engine: one loop, whatever the scheduling policy. Every step:

  1. arrive    requests whose arrival time has come join the waiting queue
  2. schedule  the policy names whom to preempt and admit, and the tokens each seat runs now
  3. preempt   free the victims' KV, send them back to the front of the queue
  4. admit     each takes a free seat (and, with prefix caching, the cached blocks of its prompt)
  5. run       each seated request with tokens to run is one row of ONE forward (runner.py)
  6. finish    rows at the end of their sequence got a token; EOS or length ends a request
  7. observe   the observers see what the step did (the trace keeps a record of it)
  8. release   finished requests free their KV, and their seats unless the policy holds them
The forward is the real model's (runner.ModelRunner) or a simulated card's (card/simulate.py).

The seams, where a layer above the core plugs in (minillm/layers/ says which uses which):
  pick           `picker`: logits -> tokens (runner.Greedy; sampling, a pattern's mask...)
  lookahead      `propose` before the plan: decoding rows run tokens past their end too
                 (speculation's drafts); `settle` after the pick: keep the ones the model agrees
                 with, cut the rest from the cache
  each token     `token_hooks(request, token)` may end a reply with a reason; one in
                 `held_reasons` keeps its seat and KV until `release(request)` (a hand-over)
  after the step `observers(engine, step)`: the trace, the KV books' check
  admit with KV  `submit(request, kv)`: its first tokens' keys and values came from elsewhere,
                 as tensors or a layer's source that stores them (e.g. another seat's blocks)
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from minillm.config import EngineConfig
from minillm.engine.packing import Batch, pack
from minillm.engine.request import Request, State, problem
from minillm.engine.runner import Greedy, ModelRunner, Picker
from minillm.engine.scheduler import Plan, Scheduler, check_plan, check_plan_tokens
from minillm.errors import InputError
from minillm.model.tokenizer import EOS


@dataclass
class Step:
    """What one step did, for the observers."""

    number: int
    plan: Plan
    rows: list[tuple[Request, int]]  # (request, tokens it ran)
    kinds: dict[str, str]  # request id -> "prefill" or "decode"
    made: dict[str, int]  # request id -> tokens its reply gained
    finished: list[Request]
    batch: Batch
    begin: float  # the clock when the step began

    @property
    def tokens(self) -> int:
        return sum(self.made.values())


class Engine:
    def __init__(self, model, scheduler: Scheduler, cfg: EngineConfig | None = None, meta=None):
        """model: a Transformer (served by a ModelRunner), or any runner (a simulated card)."""
        self.runner = ModelRunner(model) if isinstance(model, nn.Module) else model
        self.scheduler, self.cfg, self.meta = scheduler, cfg or EngineConfig(), meta or {}
        self.max_len = min(self.cfg.max_len, self.runner.max_len)
        self.cache = self.runner.make_cache(self.cfg, self.max_len)
        self.device, self.clock = self.runner.device, self.runner.clock
        self.seats: list[Request | None] = [None] * self.cfg.slots
        self.pending: list[Request] = []  # submitted, not yet arrived (sorted by arrival)
        self.waiting: deque[Request] = deque()  # arrived, in queue order
        self.requests: list[Request] = []  # everything submitted, in order
        self.live: dict[str, Request] = {}  # id -> request queued or running (unique ids)
        self.step_no, self.admissions = 0, 0
        # the seams (see the top of this file)
        self.picker: Picker = Greedy()
        self.lookahead = None  # propose(running); settle(batch, picks, cache) -> (new, kept)
        self.token_hooks: list[Callable[[Request, int], str | None]] = []
        self.held_reasons: set[str] = set()
        self.held: list[Request] = []  # finished for a held reason: seat and KV kept
        self.observers: list[Callable[[Engine, Step], None]] = []
        self.brought: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # id -> its (k, v)

    # --- submitting ------------------------------------------------------------------------
    def submit(self, request: Request, kv: tuple[torch.Tensor, torch.Tensor] | None = None):
        """Queue a request (True), or reject it now if it can never be served (the reason in
        finish_reason). kv: its first tokens' keys and values, (L, n, Hkv, D) each, or a source of
        `tokens` whose store(cache, seat, start) stores them when admitted (returns how many)."""
        if request.id in self.live and not self.live[request.id].is_finished:
            taken = f"request id {request.id!r} is already queued or running"
            raise InputError(f"{taken}: give each request its own id")
        self.requests.append(request)
        reason = self.rejection_reason(request)
        if reason:
            request.state, request.finish_reason = State.REJECTED, f"rejected: {reason}"
            return False
        arrival = lambda r: r.arrival_s if r.arrival_s is not None else r.arrival_step
        bisect.insort(self.pending, request, key=arrival)  # same-time arrivals keep their order
        if kv is not None:  # counted as computed: the scheduler plans only the rest
            n = kv.tokens if hasattr(kv, "store") else kv[0].shape[1]
            self.brought[request.id], request.num_computed = kv, n
        self.live[request.id] = request
        return True

    def rejection_reason(self, r: Request) -> str | None:
        if (reason := problem(r, self.runner.vocab_size, self.max_len)) is not None:
            return reason
        if not self.cache.can_ever_hold(r.max_cached_tokens):
            needs = self.cache.blocks_to_admit(r.max_cached_tokens)
            return f"needs up to {needs} KV blocks but the whole pool has {self.cache.num_blocks}"
        return self.picker.on_submit(r)

    def abort(self, request_id: str, reason: str = "aborted") -> bool:
        """Stop a request wherever it is (queued, waiting, running): its seat and KV are free."""
        r = self.live.pop(request_id, None)
        if r is None or r.is_finished:
            return False
        if r in self.pending:
            self.pending.remove(r)
        elif r in self.waiting:
            self.waiting.remove(r)
        elif r.seat is not None:
            self.cache.free(r.seat)
            self.seats[r.seat], r.seat = None, None
        self.brought.pop(r.id, None)
        r.state, r.finish_reason = State.FINISHED, reason
        r.finish_step, r.finish_s = self.step_no, self.clock.now()
        return True

    # --- running ---------------------------------------------------------------------------
    def running(self) -> list[Request]:
        return [r for r in self.seats if r is not None and not r.is_finished]

    def has_work(self) -> bool:
        seated = any(r is not None and not r.is_finished for r in self.seats)
        return bool(self.pending or self.waiting) or seated

    def run(self, max_steps: int = 1_000_000, progress: bool = False) -> None:
        from tqdm import tqdm

        total = sum(r.max_new_tokens for r in self.pending + list(self.waiting))
        name = f"{self.scheduler.name}/{self.cfg.kv}"
        with tqdm(total=total, desc=name, unit="tok", disable=not progress) as bar:
            while self.has_work() and self.step_no < max_steps:
                bar.update(self.step().tokens)

    def step(self) -> Step:
        self._wait_for_arrivals()
        begin = self.clock.now()
        while self.pending and self._arrived(self.pending[0], begin):
            request = self.pending.pop(0)
            request.arrival_step = self.step_no  # (arrivals in seconds: the step it joined)
            self.waiting.append(request)
        if self.cfg.prefix_caching:  # a prompt at a block boundary: blocks cached since?
            for request in [r for r in self.running() if not r.is_decoding]:
                self._claim(request)
        if self.lookahead is not None:
            self.lookahead.propose(self.running())
        plan = self.scheduler.schedule(list(self.waiting), list(self.seats), self.cache)
        check_plan(plan, self.waiting, self.seats, self.scheduler.holds_finished_seats)
        for victim in plan.preempt:
            self._preempt(victim)
        if plan.admit and self.scheduler.holds_finished_seats:  # a new batch replaces the last
            self.seats[:] = [None if r is not None and r.is_finished else r for r in self.seats]
        for request in plan.admit:
            self._admit(request)
        running = self.running()
        tokens = plan.tokens if plan.tokens is not None else {r.id: r.num_pending for r in running}
        check_plan_tokens(tokens, running)
        rows = [(r, tokens[r.id]) for r in running if tokens.get(r.id, 0) > 0]
        kinds = {r.id: "decode" if r.is_decoding else "prefill" for r, _ in rows}
        held = sum(1 for r in self.seats if r is not None and r.is_finished)  # computed anyway
        batch = pack(rows, padding_rows=held)
        picks = self.runner.run(batch, self.cache, self.picker) if rows else []
        if self.lookahead is not None:
            replies, kept = self.lookahead.settle(batch, picks, self.cache)
        else:
            replies, kept = [[token] for token in picks], batch.counts
        finished = [r for r, new in zip(batch.sampled, replies) if self._accept(r, new)]
        for (request, _), n in zip(rows, kept):
            self._computed(request, n, kinds[request.id])
        made = {r.id: len(new) for r, new in zip(batch.sampled, replies)}
        step = Step(self.step_no, plan, rows, kinds, made, finished, batch, begin)
        for observe in self.observers:
            observe(self, step)
        for request in finished:  # after the observers: a reply's last step shows its KV
            self._release(request)
        self.step_no += 1
        return step

    def _arrived(self, r: Request, now: float) -> bool:
        return r.arrival_step <= self.step_no if r.arrival_s is None else r.arrival_s <= now

    def _wait_for_arrivals(self) -> None:  # nothing to run: the clock runs to the next arrival
        idle = not self.waiting and not self.running()
        if idle and self.pending and self.pending[0].arrival_s is not None:
            self.clock.wait_until(self.pending[0].arrival_s)

    def _preempt(self, request: Request) -> None:
        self.cache.free(request.seat)
        self.seats[request.seat], request.seat = None, None
        request.state, request.num_computed = State.WAITING, 0
        request.preemptions += 1
        self.waiting.appendleft(request)  # front of the queue: it was there first

    def _admit(self, request: Request) -> None:
        self.waiting.remove(request)
        seat = self.seats.index(None)
        self.seats[seat], request.seat, request.state = request, seat, State.RUNNING
        request.admit_order, self.admissions = self.admissions, self.admissions + 1
        if request.admit_step is None:
            request.admit_step = self.step_no
        brought, request.num_computed = request.num_computed, 0
        if self.cfg.prefix_caching:  # start on the cached blocks of the prompt's beginning
            self._claim(request)
        if request.id in self.brought:  # the brought KV past the cached blocks, stored now
            kv, start = self.brought.pop(request.id), request.num_computed
            if hasattr(kv, "store"):
                brought = start + kv.store(self.cache, seat, start)
            else:
                self.cache.write_tokens(seat, kv[0][:, start:brought], kv[1][:, start:brought])
            self._computed(request, brought - start, "brought")

    def _claim(self, request: Request) -> None:
        """Go on with cached blocks (counted once: a re-admission finds its own blocks again)."""
        before, prompt = request.num_computed, len(request.prompt_ids)
        request.num_computed += self.cache.claim_prefix(request.seat, request.tokens)
        if not request.preemptions:
            taken = min(request.num_computed, prompt) - min(before, prompt)
            request.prompt_tokens_from_cache += taken

    def _computed(self, request: Request, n: int, kind: str) -> None:  # n more are in the cache
        before, request.num_computed = request.num_computed, request.num_computed + n
        if kind == "prefill":
            request.prefill_tokens += n
        filled = request.num_computed // self.cfg.block_size > before // self.cfg.block_size
        if self.cfg.prefix_caching and filled:  # a block just filled: key it for others
            self.cache.commit(request.seat, request.tokens[: request.num_computed])

    def _accept(self, request: Request, tokens: list[int]) -> bool:
        """Append the new tokens; True if EOS, length or a hook's reason finished the request."""
        now, reason = self.clock.now(), None
        if request.first_token_step is None:
            request.first_token_step, request.first_token_s = self.step_no, now
        for token in tokens:
            if token == EOS and not request.ignore_eos:
                reason = "eos"
                break
            request.output_ids.append(token)
            said = [why for hook in self.token_hooks if (why := hook(request, token))]
            if len(request.output_ids) == request.max_new_tokens:
                reason = "length"
            elif said:
                reason = said[0]
            if reason:
                break
        if reason is None:
            return False
        request.state, request.finish_reason = State.FINISHED, reason
        request.finish_step, request.finish_s = self.step_no, now
        self.live.pop(request.id, None)
        return True

    def _release(self, request: Request) -> None:
        """Free its KV, and its seat unless the policy holds it (a held reason keeps both)."""
        if request.finish_reason in self.held_reasons:
            self.held.append(request)
            return
        self.cache.free(request.seat)
        if not self.scheduler.holds_finished_seats:
            self.seats[request.seat] = None

    def release(self, request: Request) -> None:  # a held request's KV was copied out: free it
        self.held.remove(request)
        self.cache.free(request.seat)
        self.seats[request.seat], request.seat = None, None
