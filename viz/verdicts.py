"""Whether each request met its targets, as known at each step of a run: what the step player marks.

A request may carry a service (its class, priority and targets: minillm/layers/service.py). The metrics judge it
when it is done (metrics.judged: TPOT is an average over the whole reply, so a target is met only by finishing).
A miss is often known sooner: a chat user still waiting for its first token when its TTFT target passes has missed
it, whatever happens next, and so has a batch job still running at its deadline. So at each step a request is

  pending   nothing known yet (it may still meet every target)
  met       finished within every target (metrics.met_all)
  missed    finished outside a target, turned away or stopped, or past a target it can no longer meet

and a request's verdict changes at most once: from pending to met or missed. The table keeps that step and that
verdict per request, so a frame at any step is a comparison (what metrics.judged(trace, step) says for the
requests done by then; tests/test_viz_classes.py checks it step by step).

Classes are drawn by pattern, not colour (colours already say a seat's state and a request's identity): the first
class by priority plain, the next striped, and so on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minillm.layers.trace import Trace
from minillm.runs.metrics import judged, met_all, per_request
from viz.table import NEVER, table_of

PENDING, MET, MISSED = 0, 1, 2
PATTERNS = ("plain", "striped", "back-striped", "crossed")  # a class's pattern, by its place (cycled)
TARGET_WORDS = {"ttft_s": "TTFT", "tpot_s": "TPOT", "deadline_s": "deadline"}


def has_services(trace: Trace) -> bool:
    """Any request with a service (a class, a priority, targets): the step player marks them."""
    return any(r.service for r in trace.requests)


def has_targets(trace: Trace) -> bool:
    """Any request with a target (TTFT, TPOT or a deadline): the headline is goodput."""
    return any(name in r.service for r in trace.requests for name in TARGET_WORDS)


def class_order(trace: Trace) -> list[str]:
    """The classes of the requests' services, the most urgent first (lowest priority number, then by name)."""
    urgency: dict[str, int] = {}
    for r in trace.requests:
        if r.service:
            name = r.service.get("cls", "default")
            urgency[name] = min(urgency.get(name, 2**31), r.service.get("priority", 0))
    return sorted(urgency, key=lambda name: (urgency[name], name))


def targets_words(service: dict) -> str:
    """A service's targets in words: "TTFT ≤ 1 s, TPOT ≤ 0.1 s" ("no target" without any)."""
    words = [f"{TARGET_WORDS[name]} ≤ {service[name]:g} s" for name in TARGET_WORDS if name in service]
    return ", ".join(words) or "no target"


@dataclass(frozen=True)
class Verdicts:
    """Each request's class and verdict over a run (module docstring). Arrays by request, in the trace's order."""

    classes: list[str]  # class names, the most urgent first (class_order)
    cls: np.ndarray  # (requests,) index into classes; -1: no service
    arrival: np.ndarray  # (requests,) arrival step
    known: np.ndarray  # (requests,) the step from which its verdict is known (NEVER: not in this run)
    final: np.ndarray  # (requests,) MET or MISSED: the verdict from `known` on
    finish: np.ndarray  # (requests,) its finish step (NEVER: it did not finish)
    early: list[str]  # per request: the target known missed before it finished ("" if none)
    missed: list[str]  # per request: the targets it missed in the end, in words ("" if met or not finished)

    def at(self, step: int) -> np.ndarray:
        """(requests,) PENDING, MET or MISSED as known at the end of `step`."""
        return np.where(step >= self.known, self.final, PENDING)

    def counts(self, step: int) -> dict[str, dict[str, int]]:
        """Per class ("" for all), the arrived requests with a service that met, missed or are pending at `step`."""
        now, arrived = self.at(step), (self.arrival <= step) & (self.cls >= 0)
        out = {}
        for name, where in [("", arrived)] + [(c, arrived & (self.cls == k)) for k, c in enumerate(self.classes)]:
            out[name] = {word: int((now[where] == code).sum()) for word, code in VERDICT_CODES.items()}
        return out

    def why(self, i: int, step: int) -> str:
        """What request i missed, as known at `step`: its targets missed once done, before that the one it passed."""
        return self.missed[i] if step >= self.finish[i] else self.early[i]


VERDICT_CODES = {"met": MET, "missed": MISSED, "pending": PENDING}


def verdicts_of(trace: Trace) -> Verdicts:
    """Every request's verdict over the run: the metrics' judgement at its finish (metrics.judged), and before
    that the first step whose end is past a TTFT target with no first token yet, or past a deadline unfinished."""
    table, classes = table_of(trace), class_order(trace)
    n, last = len(trace.requests), table.num_steps - 1
    cls, known = np.full(n, -1, dtype=np.int32), np.full(n, NEVER, dtype=np.int64)
    final, finish = np.full(n, MISSED, dtype=np.int8), np.full(n, NEVER, dtype=np.int64)
    early, missed = [""] * n, [""] * n
    verdicts, figures = judged(trace), per_request(trace)
    starts, ends = np.append(table.time_s - table.wall_s, table.time_s[-1:]), table.time_s
    for i, r in enumerate(trace.requests):
        if not r.service or r.id not in verdicts:
            continue
        cls[i] = classes.index(r.service.get("cls", "default"))
        if r.finish_step is not None and r.finish_step <= last:
            finish[i] = known[i] = r.finish_step
            final[i] = MET if met_all(r, verdicts[r.id], last) else MISSED
            missed[i] = ", ".join(TARGET_WORDS[t] for t, ok in verdicts[r.id].items() if not ok) or "not finished"
            missed[i] = "" if final[i] == MET else missed[i]
        arrived = starts[min(r.arrival_step, table.num_steps)] if r.arrival_s is None else r.arrival_s
        for name, done_step in (("ttft_s", r.first_token_step), ("deadline_s", r.finish_step)):
            if name not in r.service:
                continue
            passed = int(np.searchsorted(ends, arrived + r.service[name], side="right"))  # first step ending past it
            measured = figures[r.id].get("ttft_s" if name == "ttft_s" else "latency_s")
            late = done_step is None or done_step > passed or measured is not None and measured > r.service[name]
            if late and passed < known[i] and passed <= last:
                known[i], final[i], early[i] = passed, MISSED, TARGET_WORDS[name]
    return Verdicts(classes, cls, np.array([r.arrival_step for r in trace.requests], dtype=np.int64), known, final,
                    finish, early, missed)  # fmt: skip
