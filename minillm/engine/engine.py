"""The engine: one loop, whatever the scheduling policy.

Every step:
  1. arrive    - requests whose arrival time has come join the waiting queue
  2. schedule  - the policy names requests to preempt and to admit, and how many tokens each
                 seated request runs this step (scheduler.py); with speculation on, each decoding
                 request first guesses a few tokens ahead, which its row runs too (speculate.py)
  3. preempt   - free the victims' KV, send them back to the front of the queue
  4. admit     - each admitted request takes a free seat (and, with prefix caching, the KV
                 blocks of its prompt's start that are already cached)
  5. run       - every seated request with tokens to run is one row of ONE forward: decode rows
                 run 1 token, prompts a chunk or the whole prompt (packing.py, runner.py)
  6. finish    - rows that reached the end of their sequence got a token (a row that checked guesses: the
                 ones the model agrees with, and its own next one); EOS or length ends a request
  7. record    - a StepRecord for the trace (the KV memory as this step's forward used it)
  8. release   - finished requests free their KV and their seats (held idle under a policy that holds them)

The engine never knows what runs the forward: the real model (runner.ModelRunner) or a
simulated card on a virtual clock (simulate.py). Both give it next tokens and a clock.
"""

from __future__ import annotations

import bisect
from collections import deque

from torch import nn

from minillm.config import EngineConfig
from minillm.engine.constrain import advance
from minillm.engine.handover import adopt
from minillm.engine.packing import pack
from minillm.engine.request import Request, State
from minillm.engine.runner import ModelRunner
from minillm.engine.sampler import give_own_seed
from minillm.engine.scheduler import Scheduler, check_plan, check_plan_tokens
from minillm.engine.speculate import speculator_for
from minillm.engine.trace import StepRecord, Trace, run_trace, step_record
from minillm.errors import InputError
from minillm.model.tokenizer import EOS


class Engine:
    def __init__(self, model, scheduler: Scheduler, cfg: EngineConfig | None = None, meta: dict | None = None,
                 draft=None):  # fmt: skip
        """model: a Transformer (served by a ModelRunner), or any runner (e.g. a simulated card).
        draft: the draft model speculation guesses with (cfg.speculate; default: the shipped draft)."""
        self.runner = ModelRunner(model) if isinstance(model, nn.Module) else model
        self.model = getattr(self.runner, "model", None)
        self.scheduler, self.cfg = scheduler, cfg or EngineConfig()
        self.max_len = min(self.cfg.max_len, self.runner.max_len)
        self.cache = self.runner.make_cache(self.cfg, self.max_len)
        self.speculator = speculator_for(self.cfg, self.runner, self.max_len, draft)
        self.device, self.clock = self.runner.device, self.runner.clock
        self.seats: list[Request | None] = [None] * self.cfg.slots
        self.pending: list[Request] = []  # submitted, not yet arrived (sorted by arrival)
        self.waiting: deque[Request] = deque()  # arrived, in queue order
        self.requests: list[Request] = []  # everything submitted, in order
        self.live: dict[str, Request] = {}  # id -> request queued or running (ids are unique among them)
        self.records: list[StepRecord] = []
        self.handed: list[Request] = []  # handed over, their KV not yet copied out (handover.py)
        self.step_no, self.admissions = 0, 0
        self.meta = meta or {}

    # --- submitting ------------------------------------------------------------------------------
    def submit(self, request: Request) -> bool:
        """Queue a request, or reject it now (with the reason in finish_reason) if it can never be served."""
        if request.id in self.live and not self.live[request.id].is_finished:  # (or finished by an outside abort)
            raise InputError(f"request id {request.id!r} is already queued or running: give each request its own id")
        self.requests.append(request)
        reason = self.rejection_reason(request)
        if reason:
            request.state, request.finish_reason = State.REJECTED, f"rejected: {reason}"
            return False
        arrival = lambda r: r.arrival_s if r.arrival_s is not None else r.arrival_step  # (seconds, or steps)
        bisect.insort(self.pending, request, key=arrival)  # same-time arrivals keep submit order
        give_own_seed(request)  # a sampled request draws from streams of its own (sampler.py)
        self.live[request.id] = request
        return True

    def rejection_reason(self, r: Request) -> str | None:
        if not r.prompt_ids:
            return "empty prompt"
        if min(r.prompt_ids) < 0 or max(r.prompt_ids) >= self.runner.vocab_size:
            return f"prompt ids must lie in [0, {self.runner.vocab_size})"
        if r.max_new_tokens < 1:
            return f"max_new_tokens must be at least 1, got {r.max_new_tokens}"
        if r.max_cached_tokens >= self.max_len:
            return (
                f"prompt ({len(r.prompt_ids)}) + max_new_tokens ({r.max_new_tokens}) exceeds the context of "
                f"{self.max_len} tokens"
            )
        if r.constraint is not None and r.ignore_eos:
            return "a constrained reply ends where its pattern does: it cannot ignore EOS"
        if not self.cache.can_ever_hold(r.max_cached_tokens):
            return (
                f"needs up to {self.cache.blocks_to_admit(r.max_cached_tokens)} KV blocks but the whole pool "
                f"has {self.cache.num_blocks}"
            )
        return None

    def abort(self, request_id: str, reason: str = "aborted") -> bool:
        """Stop a request wherever it is (queued, waiting, running): its seat and KV blocks are free at once."""
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
        r.state, r.finish_reason, r.finish_step, r.finish_s = State.FINISHED, reason, self.step_no, self.clock.now()
        return True

    # --- running ---------------------------------------------------------------------------------
    def running(self) -> list[Request]:
        return [r for r in self.seats if r is not None and not r.is_finished]

    def has_work(self) -> bool:
        return bool(self.pending or self.waiting) or any(r is not None and not r.is_finished for r in self.seats)

    def run(self, max_steps: int = 1_000_000, progress: bool = False) -> Trace:
        from tqdm import tqdm

        total = sum(r.max_new_tokens for r in self.pending + list(self.waiting))
        with tqdm(total=total, desc=f"{self.scheduler.name}/{self.cfg.kv}", unit="tok", disable=not progress) as bar:
            while self.has_work() and self.step_no < max_steps:
                bar.update(self.step().tokens)
        return self.trace()

    def step(self) -> StepRecord:
        self._wait_for_arrivals()
        begin = self.clock.now()
        while self.pending and self._arrived(self.pending[0], begin):
            request = self.pending.pop(0)
            request.arrival_step = self.step_no  # (for arrivals in seconds: the step it joined the queue)
            self.waiting.append(request)
        if self.cfg.prefix_caching:  # a prompt at a block boundary goes on with blocks cached since its last chunk
            for request in [r for r in self.running() if not r.is_decoding]:
                self._claim(request)
        if self.speculator.k:  # (speculation on) decoding requests guess ahead: longer rows
            self.speculator.propose(self.running())
        plan = self.scheduler.schedule(list(self.waiting), list(self.seats), self.cache)
        check_plan(plan, self.waiting, self.seats, self.scheduler.holds_finished_seats)
        for victim in plan.preempt:
            self._preempt(victim)
        if plan.admit and self.scheduler.holds_finished_seats:  # a new batch replaces the finished one
            self.seats[:] = [None if r is not None and r.is_finished else r for r in self.seats]
        for request in plan.admit:
            self._admit(request)
        running = self.running()
        tokens = plan.tokens if plan.tokens is not None else {r.id: r.num_pending for r in running}
        check_plan_tokens(tokens, running)
        rows = [(r, tokens[r.id]) for r in running if tokens.get(r.id, 0) > 0]
        kinds = {r.id: "decode" if r.is_decoding else "prefill" for r, _ in rows}
        held = sum(1 for r in self.seats if r is not None and r.is_finished)  # computed anyway: a fixed-shape batch
        batch = pack(rows, padding_rows=held)
        picks = self.runner.run(batch, self.cache) if rows else []
        replies, kept = self.speculator.settle(batch, picks, self.cache)  # guesses checked; the wrong ones' KV cut
        finished = [r for r, new in zip(batch.sampled, replies) if self._accept(r, new)]
        for (request, _), n in zip(rows, kept):
            self._computed(request, n, kinds[request.id])
        made = {r.id: len(new) for r, new in zip(batch.sampled, replies)}
        record = self._record(plan, rows, kinds, made, finished, batch, begin)
        for request in finished:  # after the record: a reply's last step still shows the KV it ran on
            self._release(request)
        if self.cfg.debug and hasattr(getattr(self.cache, "allocator", None), "check"):  # the KV books, every step
            self.cache.allocator.check()
        self.step_no += 1
        return record

    def _arrived(self, r: Request, now: float) -> bool:
        return r.arrival_s <= now if r.arrival_s is not None else r.arrival_step <= self.step_no

    def _wait_for_arrivals(self) -> None:
        """Nothing to run and the next arrival is a time in the future: let the clock run to it."""
        if not self.waiting and not self.running() and self.pending and self.pending[0].arrival_s is not None:
            self.clock.wait_until(self.pending[0].arrival_s)

    def _preempt(self, request: Request) -> None:
        self.cache.free(request.seat)
        self.seats[request.seat], request.seat = None, None
        request.state, request.preemptions, request.num_computed = State.WAITING, request.preemptions + 1, 0
        self.waiting.appendleft(request)  # front of the queue: it was there first

    def _admit(self, request: Request) -> None:
        self.waiting.remove(request)
        seat = self.seats.index(None)
        self.seats[seat], request.seat, request.state = request, seat, State.RUNNING
        request.admit_order, self.admissions = self.admissions, self.admissions + 1
        if request.admit_step is None:
            request.admit_step = self.step_no
        self._claim(request)  # (prefix caching) start on the cached blocks of the prompt's beginning, if any
        if request.kv_import is not None:  # handed over by a prefill engine: its prompt's KV is computed already
            adopt(self.cache, request)

    def _claim(self, request: Request) -> None:
        """Go on with cached blocks of the request's tokens; count the prompt tokens its first admission took."""
        before, prompt = request.num_computed, len(request.prompt_ids)
        request.num_computed += self.cache.claim_prefix(request.seat, request.tokens)
        if not request.preemptions:  # (a re-admission mostly finds its own blocks again: not a shared prefix)
            request.prompt_tokens_from_cache += min(request.num_computed, prompt) - min(before, prompt)

    def _computed(self, request: Request, n: int, kind: str) -> None:
        """`n` more of the request's tokens have their keys and values in the cache."""
        before, request.num_computed = request.num_computed, request.num_computed + n
        if kind == "prefill":
            request.prefill_tokens += n
        block = self.cfg.block_size
        if self.cfg.prefix_caching and request.num_computed // block > before // block:  # a block just filled
            self.cache.commit(request.seat, request.tokens[: request.num_computed])

    def _accept(self, request: Request, tokens: list[int]) -> bool:
        """Append the new tokens (one, or a run of checked guesses); finish the request on EOS or length (step()
        frees its KV). True if it finished."""
        now = self.clock.now()
        if request.first_token_step is None:
            request.first_token_step, request.first_token_s = self.step_no, now
        for token in tokens:
            if token == EOS and not request.ignore_eos:
                reason = "eos"
                break
            request.output_ids.append(token)
            advance(request, token)  # (a constrained reply: its automaton moves on)
            if len(request.output_ids) == request.max_new_tokens:
                reason = "length"
                break
            if request.handoff:  # prefill here, decode elsewhere: its KV waits for engine.release (handover.py)
                reason = "handed-over"
                break
        else:
            return False
        request.state, request.finish_reason = State.FINISHED, reason
        request.finish_step, request.finish_s = self.step_no, now
        self.live.pop(request.id, None)
        return True

    def _release(self, request: Request) -> None:
        """A finished request gives back its KV memory, and its seat unless the policy holds it (a handed-over one
        keeps both until the caller has copied its KV out: release)."""
        if request.finish_reason == "handed-over":
            self.handed.append(request)
            return
        self.cache.free(request.seat)
        if not self.scheduler.holds_finished_seats:
            self.seats[request.seat] = None

    def release(self, request: Request) -> None:
        """A handed-over request's KV has been copied out: its blocks and seat are free."""
        self.handed.remove(request)
        self.cache.free(request.seat)
        self.seats[request.seat], request.seat = None, None

    # --- recording (trace.py) -----------------------------------------------------------------------
    def _record(self, plan, rows, kinds, made: dict[str, int], finished, batch, begin: float) -> StepRecord:
        record = step_record(self, plan, rows, kinds, made, finished, batch, begin)
        self.records.append(record)
        return record

    def trace(self) -> Trace:
        return run_trace(self)
