"""The engine: one loop, whatever the scheduling policy.

Every step:
  1. schedule  - the policy names requests to preempt and to admit (scheduler.py)
  2. preempt   - free the victims' KV, send them back to the front of the queue
  3. prefill   - each admitted request reads its prompt (plus any earlier output) and
                 produces its first token; it takes its seat
  4. decode    - every request that was already seated produces one token, all in ONE
                 batched forward: this is where batching pays
  5. finish    - EOS or length: free its KV at once; the seat is free for the next step
                 (or held idle, under a policy that holds seats)
  6. record    - a StepRecord for the trace

Prefill and decode share a step but not a forward: each admitted prompt is prefilled on
its own (no padding), then the seated requests decode together. So every request in the
batch produces exactly one token per step, and a newcomer's first token comes in the
step it is admitted.
"""

from __future__ import annotations

import time
from collections import deque

import torch

from minillm.config import EngineConfig
from minillm.kv_cache import ContiguousKVCache, PagedKVCache
from minillm.model import Transformer
from minillm.request import Request, State
from minillm.scheduler import Plan, Scheduler
from minillm.tokenizer import EOS, VOCAB_SIZE
from minillm.trace import RequestRecord, StepRecord, Trace


class EngineError(RuntimeError):
    """A scheduler returned a plan the engine cannot carry out (a bug in the policy)."""


def make_cache(model: Transformer, cfg: EngineConfig) -> ContiguousKVCache | PagedKVCache:
    device, max_len = next(model.parameters()).device, min(cfg.max_len, model.cfg.max_seq_len)
    if cfg.kv == "contiguous":
        return ContiguousKVCache(model.cfg, cfg.slots, max_len, device=device, block_size=cfg.block_size)
    num_blocks = cfg.num_blocks or cfg.slots * -(-max_len // cfg.block_size)
    return PagedKVCache(model.cfg, num_blocks, cfg.block_size, device=device)


class Engine:
    def __init__(
        self, model: Transformer, scheduler: Scheduler, cfg: EngineConfig | None = None, meta: dict | None = None
    ):
        self.model, self.scheduler, self.cfg = model.eval(), scheduler, cfg or EngineConfig()
        self.max_len = min(self.cfg.max_len, model.cfg.max_seq_len)
        self.cache = make_cache(model, self.cfg)
        self.device = next(model.parameters()).device
        self.seats: list[Request | None] = [None] * self.cfg.slots
        self.pending: list[Request] = []  # submitted, not yet arrived (sorted by arrival step)
        self.waiting: deque[Request] = deque()  # arrived, in queue order
        self.requests: list[Request] = []  # everything submitted, in order
        self.records: list[StepRecord] = []
        self.step_no, self.admissions = 0, 0
        self.meta = meta or {}
        self.start = time.perf_counter()

    # --- submitting ------------------------------------------------------------------------------
    def submit(self, request: Request) -> bool:
        """Queue a request, or reject it now (with the reason in finish_reason) if it can never be served."""
        self.requests.append(request)
        reason = self.rejection_reason(request)
        if reason:
            request.state, request.finish_reason = State.REJECTED, f"rejected: {reason}"
            return False
        self.pending.append(request)
        self.pending.sort(key=lambda r: r.arrival_step)  # stable: same-step arrivals keep submit order
        return True

    def rejection_reason(self, r: Request) -> str | None:
        if not r.prompt_ids:
            return "empty prompt"
        if any(not 0 <= t < VOCAB_SIZE for t in r.prompt_ids):
            return f"prompt ids must lie in [0, {VOCAB_SIZE})"
        if r.max_new_tokens < 1:
            return f"max_new_tokens must be at least 1, got {r.max_new_tokens}"
        if r.max_cached_tokens >= self.max_len:
            return (
                f"prompt ({len(r.prompt_ids)}) + max_new_tokens ({r.max_new_tokens}) exceeds the context of "
                f"{self.max_len} tokens"
            )
        if not self.cache.can_ever_hold(r.max_cached_tokens):
            return (
                f"needs up to {self.cache.blocks_to_admit(r.max_cached_tokens)} KV blocks but the whole pool "
                f"has {self.cache.num_blocks}"
            )
        return None

    # --- running ---------------------------------------------------------------------------------
    def has_work(self) -> bool:
        return bool(self.pending or self.waiting or any(r and not r.is_finished for r in self.seats))

    def run(self, max_steps: int = 100_000, progress: bool = False) -> Trace:
        from tqdm import tqdm

        total = sum(r.max_new_tokens for r in self.pending + list(self.waiting))
        with tqdm(total=total, desc=f"{self.scheduler.name}/{self.cfg.kv}", unit="tok", disable=not progress) as bar:
            while self.has_work() and self.step_no < max_steps:
                bar.update(self.step().tokens)
        return self.trace()

    @torch.no_grad()
    def step(self) -> StepRecord:
        begin = time.perf_counter()
        while self.pending and self.pending[0].arrival_step <= self.step_no:
            self.waiting.append(self.pending.pop(0))
        plan = self.scheduler.schedule(list(self.waiting), list(self.seats), self.cache)
        self._check(plan)
        for victim in plan.preempt:
            self._preempt(victim)
        decoding = [r for r in self.seats if r is not None and not r.is_finished]
        held = [r for r in self.seats if r is not None and r.is_finished]
        if plan.admit and self.scheduler.holds_finished_seats:
            for r in held:  # a new batch replaces the finished one
                self.seats[r.seat] = None
            held = []
        produced: dict[str, int] = {}
        for request in plan.admit:
            produced[request.id] = self._prefill(request)
        if decoding:
            for request, token in zip(decoding, self._decode(decoding, pad_to=len(decoding) + len(held))):
                produced[request.id] = token
        finished = [r for r in plan.admit + decoding if self._accept(r, produced[r.id])]
        record = self._record(plan, decoding, finished, len(produced), begin)
        self.step_no += 1
        return record

    def _check(self, plan: Plan) -> None:
        waiting_ids, running = {r.id for r in self.waiting}, [r for r in self.seats if r and not r.is_finished]
        if any(r.id not in waiting_ids for r in plan.admit):
            raise EngineError("the scheduler admitted a request that is not waiting")
        if len({r.id for r in plan.admit}) < len(plan.admit):
            raise EngineError("the scheduler admitted the same request twice")
        if any(r not in running for r in plan.preempt):
            raise EngineError("the scheduler preempted a request that is not running")
        free = sum(s is None or (s.is_finished and self.scheduler.holds_finished_seats) for s in self.seats)
        if len(plan.admit) > free + len(plan.preempt):
            raise EngineError(f"the scheduler admitted {len(plan.admit)} requests into {free} free seats")

    def _preempt(self, request: Request) -> None:
        self.cache.free(request.seat)
        self.seats[request.seat], request.seat = None, None
        request.state, request.preemptions = State.WAITING, request.preemptions + 1
        self.waiting.appendleft(request)  # front of the queue: it was there first

    def _prefill(self, request: Request) -> int:
        self.waiting.remove(request)
        seat = self.seats.index(None)
        self.seats[seat], request.seat, request.state = request, seat, State.RUNNING
        request.admit_order, self.admissions = self.admissions, self.admissions + 1
        if request.admit_step is None:
            request.admit_step = self.step_no
        tokens = request.prompt_ids + request.output_ids  # recompute after a preemption
        positions = self.cache.prepare([seat], len(tokens))
        logits = self.model(torch.tensor([tokens], device=self.device), positions, self.cache, last_only=True)
        return self._sample(logits[:, -1], [request])[0]

    def _decode(self, requests: list[Request], pad_to: int) -> list[int]:
        last = torch.tensor([[r.output_ids[-1]] for r in requests], device=self.device)  # (B, 1)
        positions = self.cache.prepare([r.seat for r in requests], 1)  # (B, 1)
        if pad_to > len(requests):  # held seats: a fixed-shape batch still computes their rows
            positions = self.cache.pad_rows(pad_to)
            last = torch.cat([last, last[:1].expand(pad_to - len(requests), 1)])
        logits = self.model(last, positions, self.cache)  # (B, 1, V)
        return self._sample(logits[: len(requests), -1], requests)

    def _sample(self, logits: torch.Tensor, requests: list[Request]) -> list[int]:
        """Greedy. logits (B, V). A request that ignores EOS (fixed length) never picks it."""
        if any(r.ignore_eos for r in requests):
            logits = logits.clone()
            logits[[i for i, r in enumerate(requests) if r.ignore_eos], EOS] = float("-inf")
        return logits.argmax(dim=-1).tolist()

    def _accept(self, request: Request, token: int) -> bool:
        """Append the new token; finish the request (freeing its KV) on EOS or length. True if it finished."""
        now = time.perf_counter() - self.start
        if request.first_token_step is None:
            request.first_token_step, request.first_token_s = self.step_no, now
        if token == EOS and not request.ignore_eos:
            reason = "eos"
        else:
            request.output_ids.append(token)
            if len(request.output_ids) < request.max_new_tokens:
                return False
            reason = "length"
        request.state, request.finish_reason = State.FINISHED, reason
        request.finish_step, request.finish_s = self.step_no, now
        self.cache.free(request.seat)
        if not self.scheduler.holds_finished_seats:
            self.seats[request.seat] = None
        return True

    # --- recording -------------------------------------------------------------------------------
    def _record(self, plan: Plan, decoding: list[Request], finished: list[Request], tokens: int, begin: float):
        admitted, decoded = {r.id for r in plan.admit}, {r.id for r in decoding}
        slots: list[dict | None] = []
        for seat in range(self.cfg.slots):
            r = self.seats[seat] or next((f for f in finished if f.seat == seat), None)
            if r is None:
                slots.append(None)
            else:
                state = "prefill" if r.id in admitted else "decode" if r.id in decoded else "held"
                slots.append({"id": r.id, "state": state})
        live = {r.seat: r for r in self.seats if r is not None and not r.is_finished}
        tables = self.cache.block_map(sorted(live))
        now = time.perf_counter()
        record = StepRecord(
            step=self.step_no,
            slots=slots,
            waiting=[r.id for r in self.waiting],
            admitted=[r.id for r in plan.admit],
            finished=[r.id for r in finished],
            preempted=[r.id for r in plan.preempt],
            tokens=tokens,
            kv_blocks_used=sum(len(t) for t in tables.values()),
            kv_blocks_total=self.cache.num_blocks,
            wall_s=now - begin,
            kv_tables={live[s].id: t for s, t in tables.items()},
            kv_tokens={r.id: self.cache.lengths[s] for s, r in live.items()},
            time_s=now - self.start,
        )
        self.records.append(record)
        return record

    def trace(self) -> Trace:
        config = {
            "scheduler": self.scheduler.name,
            "kv": self.cfg.kv,
            "slots": self.cfg.slots,
            "block_size": self.cfg.block_size,
            "num_blocks": self.cache.num_blocks,
            "max_len": self.max_len,
            "device": str(self.device),
            "model": self.meta.get("model", "minillm"),
            "workload": self.meta.get("workload", "custom"),
            "seed": self.meta.get("seed"),
        }
        requests = [
            RequestRecord(
                id=r.id,
                prompt_ids=list(r.prompt_ids),
                output_ids=list(r.output_ids),
                arrival_step=r.arrival_step,
                admit_step=r.admit_step,
                first_token_step=r.first_token_step,
                finish_step=r.finish_step,
                finish_reason=r.finish_reason,
                preemptions=r.preemptions,
                prompt=r.prompt,
                max_new_tokens=r.max_new_tokens,
                first_token_s=r.first_token_s,
                finish_s=r.finish_s,
            )
            for r in self.requests
        ]
        return Trace(config=config, requests=requests, steps=list(self.records))
