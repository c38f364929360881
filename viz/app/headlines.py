"""The headline of a view that replays runs: one line of big numbers about the whole run, why one click away.

Which numbers depends on the runs:

  seats busy   the default: the share of seat-steps that did work, each run side by side (static beside continuous)
  goodput      when the runs' requests carry targets (a service: minillm/layers/service.py, e.g. the mixed crowd's):
               requests per second that finished meeting all their targets, and the share that met them; the
               per-class shares, the targets and the longest wait behind its why?
"""

from __future__ import annotations

import streamlit as st

from viz.html import headline_html
from viz.player import TracePlayer
from viz.verdicts import class_order, has_targets, targets_words

WHY_LABEL = "why these numbers"


def seats_busy_headline(players: list[tuple[str, TracePlayer]], note: str = "", row=None) -> None:
    """The one big number of a side-by-side view: seats busy over the whole run, each policy; `note` and how long
    each run took to serve everyone behind its why? (headline_with_why, which says what `row` is)."""
    if len(players) != 2:
        return
    parts = [(title.removesuffix(" batching"), f"{p.summary['slot_utilization']:.0%}") for title, p in players]
    ends = [p.end_s if p.simulated else p.summary["last_finish_step"] for _, p in players]
    if None not in ends:  # a count of steps, as the lessons say it ("519 steps"): the last step is 518, from 0
        unit = (lambda v: f"{v:,.1f} s") if players[0][1].simulated else (lambda v: f"{v + 1:,} steps")
        done = ", ".join(f"{part[0]} {unit(end)}" for part, end in zip(parts, ends))
        note = f"{note} All requests done in: {done}.".strip()
    same = "Same requests and seats: only the scheduler differs."
    headline_with_why("Seats busy, whole run:", parts, f"{same} {note}", row)


def headline_with_why(label: str, parts: list[tuple[str, str]], note: str, row=None) -> None:
    """A view's big numbers on one line (headline_html), and why they say so one click away in a popover (row: two
    columns for them, e.g. beside the settings; default: a row of its own)."""
    line, why = row or st.columns([8, 1.6], vertical_alignment="center")
    line.markdown(headline_html(label, parts, one_line=True), unsafe_allow_html=True)
    with why.popover("why?", icon=":material/info:", help=WHY_LABEL, width="stretch"):
        st.markdown(note, unsafe_allow_html=True)


def short(title: str) -> str:
    """A panel's title as the headline names it: "continuous batching" -> "continuous"."""
    return title.removesuffix(" batching").removesuffix(" policy")


def run_headline(players: list[tuple[str, TracePlayer]], note: str = "", row=None) -> None:
    """Goodput when every run shown has targets, else seats busy (a side-by-side view's)."""
    if players and all(has_targets(p.trace) for _, p in players):
        goodput_headline(players, note, row)
    else:
        seats_busy_headline(players, note, row)


GOODPUT = ("<b>Goodput</b>: requests per second that finished meeting all their targets (DistServe, OSDI 2024), "
           "beside the share of the crowd that met them. Seconds on the run's clock.")  # fmt: skip
MARKS = ("On the seat charts a striped seat is a less urgent class; a green tick where a request finishes: it met "
         "its targets; a red cross: it missed one; a red band along a seat: from the step a miss was known (a "
         "TTFT target passed while it waited, a deadline passed). Nothing yet: still pending.")  # fmt: skip


def goodput_headline(players: list[tuple[str, TracePlayer]], note: str = "", row=None) -> None:
    """Goodput and the share that met their targets, each run; behind why?: the targets, each class's share, the
    longest wait, seats busy, and `note`."""
    parts = [(short(title), f"{p.summary['goodput_per_s']:.1f}/s", f"{p.summary['targets_met_share']:.0%} met")
             for title, p in players]  # fmt: skip
    trace = players[0][1].trace
    services = {r.service.get("cls", "default"): r.service for r in trace.requests if r.service}
    classes = class_order(trace)
    targets = "; ".join(f"{c}: {targets_words(services[c])}, priority {services[c].get('priority', 0)}"
                        for c in classes)  # fmt: skip
    head = "| | goodput | met targets | " + " | ".join(f"{c} met" for c in classes) + " | longest wait | seats busy |"
    lines = [head, "|---" * (len(classes) + 5) + "|"]
    for title, p in players:
        s, wait = p.summary, p.summary["longest_wait_s"]
        shares = " | ".join(f"{s.get(f'{c}_targets_met_share', 0):.0%}" for c in classes)
        lines.append(f"| **{short(title)}** | {s['goodput_per_s']:.2f}/s | {s['targets_met']} of "
                     f"{s['requests_judged']} | {shares} | {'–' if wait is None else f'{wait:.2f} s'} | "
                     f"{s['slot_utilization']:.0%} |")  # fmt: skip
    same = "Same requests and seats: only who goes first differs." if len(players) > 1 else ""
    why = f"{GOODPUT} The targets: {targets}. {same}\n\n" + "\n".join(lines) + f"\n\n{MARKS} {note}".rstrip()
    headline_with_why("Goodput, whole run:", parts, why, row)
