"""How a run stands at each step: the figures a frame shows, precomputed as arrays once per trace.

metrics.summarize(trace, upto=step) answers the same questions by walking the trace up to the step:
fine once, too slow five times a second on a simulated run of tens of thousands of steps. Here the
trace's table (table.py) gives per-step and per-request arrays, and a frame is a few lookups and a
percentile over the requests (a vectorized one: no Python loop over steps or seats).

Two figures need care when they are read *during* a run:
- Utilization this step (busy seats / seats: what the articles quote) and utilization so far (the
  average over the steps played) tell different stories: static batching's last straggler shows
  1 busy seat of 8 now (12.5%), while the run's average still looks respectable.
- TTFT so far must not flatter a policy that keeps people waiting. Counting only the requests that
  already have a first token, static batching at step 300 of the seed story shows TTFT 1 (A to D
  started at once) while E to H have waited 300 steps. So a request still waiting for its first
  token counts with its wait so far, which is a lower bound on its TTFT.
"""

from __future__ import annotations

import numpy as np

from minillm.layers.trace import Trace
from viz.colors import STALLED
from viz.table import NEVER, TraceTable, table_of


def _median(values: np.ndarray) -> float | None:
    return float(np.percentile(values, 50)) if len(values) else None  # linear, like metrics.percentiles


class RunProgress:
    def __init__(self, source: Trace | TraceTable):
        table = table_of(source)
        seats = table.entries
        self.slots = table.num_seats
        self.busy = seats.per_step(np.ones_like(seats.step), seats.working).astype(np.int32)  # (S,) seats working
        self.busy_so_far = np.cumsum(self.busy)
        seated = seats.working | (seats.state == STALLED)  # not held: a held seat's request is done
        self.running = seats.per_step(np.ones_like(seats.step), seated).astype(np.int32)
        self.tokens = table.tokens  # (S,) output tokens made per step
        self.tokens_so_far = np.cumsum(self.tokens)
        self.end_s = table.time_s  # (S,) seconds at the end of each step
        self.start_s = table.time_s - table.wall_s
        self.num_waiting = table.num_waiting

        served = [r for r in table.requests if not (r.finish_reason or "").startswith("rejected")]
        final = table.final  # each request's figures over the whole run
        figure = lambda name: np.array([final.get(r.id, {}).get(name, np.nan) for r in served], dtype=float)
        step_or_never = lambda values: np.array([NEVER if v is None else v for v in values], dtype=np.int64)
        self.rejected = len(table.requests) - len(served)
        self.arrival_step = np.array([r.arrival_step for r in served], dtype=np.int64)
        starts = np.append(self.start_s, self.end_s[-1:])  # (a request arriving after the last step: its end)
        self.arrival_s = np.array(
            [starts[min(r.arrival_step, table.num_steps)] if r.arrival_s is None else r.arrival_s for r in served]
        )
        self.first_step = step_or_never(r.first_token_step for r in served)
        self.finish_step = step_or_never(r.finish_step for r in served)
        self.ttft_steps, self.ttft_s = figure("ttft_steps"), figure("ttft_s")
        self.tpot_steps, self.tpot_s = figure("tpot_steps"), figure("tpot_s")
        # a TPOT is known once the request has finished (and made more than one token)
        self.tpot_known_from = np.where(np.isnan(self.tpot_steps), NEVER, self.finish_step)

    def at(self, step: int) -> dict:
        """The figures as they stand at the end of `step` (clipped to the run)."""
        step = int(np.clip(step, 0, len(self.busy) - 1))
        arrived = self.arrival_step <= step
        started = self.first_step <= step
        still_waiting = arrived & ~started  # arrived, no first token yet: count their wait so far
        ttft_steps = np.where(started, self.ttft_steps, step - self.arrival_step + 1)[arrived]
        ttft_s = np.where(started, self.ttft_s, self.end_s[step] - self.arrival_s)[arrived]
        tpot = self.tpot_known_from <= step
        elapsed = self.end_s[step]
        return {
            "step": step,
            "time_s": float(elapsed),
            "tokens": int(self.tokens[step]),
            "tokens_so_far": int(self.tokens_so_far[step]),
            "tokens_per_s_so_far": float(self.tokens_so_far[step] / elapsed) if elapsed > 0 else None,
            "busy_seats": int(self.busy[step]),
            "utilization_now": float(self.busy[step] / self.slots),
            "utilization_so_far": float(self.busy_so_far[step] / ((step + 1) * self.slots)),
            "queue_length": int(self.num_waiting[step]),
            "arrived": int(arrived.sum()),
            "running": int(self.running[step]),
            "finished": int((self.finish_step <= step).sum()),
            "waiting_for_first_token": int(still_waiting.sum()),
            "ttft_p50_steps": _median(ttft_steps),
            "ttft_p50_s": _median(ttft_s),
            "ttft_p50_steps_started_only": _median(self.ttft_steps[started]),
            "tpot_p50_steps": _median(self.tpot_steps[tpot]),
            "tpot_p50_s": _median(self.tpot_s[tpot]),
        }
