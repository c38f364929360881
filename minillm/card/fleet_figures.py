"""A fleet's crowd in figures, and the table of prefill:decode splits that `whatif --fleet` prints.

A request handed over lives twice: on a prefill engine until its first token, then on a decode engine (fleet.py).
Its TTFT is the first life's (arrival at the fleet -> first token); its TPOT spans both (first token -> last, so the
transfer and the decode engine's queue count: the user waits through them); its inter-token gaps join the two
traces' steps, so the gap across the hand-over is one of them. Figures are runs/metrics.py's, over the whole fleet
(percentiles the same way: numpy's, linear between samples).

Goodput, as DistServe measures it (Zhong et al., OSDI 2024): a request counts when its TTFT and its TPOT both meet
their targets (a one-token reply has no TPOT: its TTFT decides); `goodput` is the share of the crowd that does,
`goodput_per_s` those requests per second of the run. The default targets are DistServe's for a chatbot on a model of
this size (Table 1: OPT-13B on ShareGPT, TTFT 0.25 s and TPOT 0.1 s; its 66B and 175B chatbots get 2.5/0.15 and
4/0.2). DistServe reports the highest rate at which 90% of requests meet them; the table gives the share at one rate.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from minillm.card.fleet import FleetRun, simulate_fleet

TTFT_TARGET_S, TPOT_TARGET_S = 0.25, 0.1  # DistServe, Table 1: the OPT-13B chatbot's SLOs


def pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def token_times(run: FleetRun) -> dict[str, list[float]]:
    """Request id -> the end of every step that gave it a token (an EOS included), over all its engines, in order."""
    times: dict[str, list[float]] = defaultdict(list)
    for engine in run.engines:  # (prefill engines first: a request's first life comes before its second)
        for record in engine.records:
            for _, rid, _, _, made in record.seats:
                if made:
                    times[rid].append(record.time_s)
    return times


def fleet_figures(run: FleetRun, ttft_target_s: float = TTFT_TARGET_S, tpot_target_s: float = TPOT_TARGET_S) -> dict:
    """The crowd's figures: TTFT, TPOT and ITL p50 and p99, goodput, tokens/s, and what the KV transfers took."""
    ttfts, tpots, good, produced = [], [], 0, 0
    for first in run.requests:
        last = run.copies.get(first.id, first)
        if last.finish_reason not in ("eos", "length"):
            continue
        made = len(last.output_ids) + (last.finish_reason == "eos")  # (an EOS took a step, as in metrics.py)
        ttft = first.first_token_s - first.arrival_s
        tpot = (last.finish_s - first.first_token_s) / (made - 1) if made > 1 else None
        ttfts.append(ttft)
        tpots += [tpot] if tpot is not None else []
        good += ttft <= ttft_target_s and (tpot is None or tpot <= tpot_target_s)
        produced += made
    gaps = [b - a for times in token_times(run).values() for a, b in zip(times, times[1:])]
    start = min(r.arrival_s for r in run.requests)
    end = max(r.finish_s for r in [*run.requests, *run.copies.values()] if r.finish_s is not None)
    span = end - start
    waits = [t.done_s - t.ready_s for t in run.transfers]  # queued behind other transfers, then sent
    cards = len(run.engines)
    return {
        "split": run.split,
        "cards": cards,
        "prefill": run.prefill,
        "decode": cards - run.prefill if run.prefill else 0,
        "route": run.route,
        "link": run.link.name if run.link else None,
        "requests": len(run.requests),
        "finished": len(ttfts),
        "ttft_p50_s": pct(ttfts, 50),
        "ttft_p99_s": pct(ttfts, 99),
        "tpot_p50_s": pct(tpots, 50),
        "tpot_p99_s": pct(tpots, 99),
        "itl_p50_s": pct(gaps, 50),
        "itl_p99_s": pct(gaps, 99),
        "ttft_target_s": ttft_target_s,
        "tpot_target_s": tpot_target_s,
        "goodput": good / len(run.requests),
        "goodput_per_s": good / span if span > 0 else 0.0,
        "output_tokens": produced,
        "simulated_s": span,
        "tokens_per_s": produced / span if span > 0 else 0.0,
        "tokens_per_s_per_card": produced / span / cards if span > 0 else 0.0,
        "transfers": len(run.transfers),
        "kv_bytes": sum(t.bytes for t in run.transfers),
        "kv_transfer_p50_s": pct(waits, 50),
        "kv_transfer_p99_s": pct(waits, 99),
        "preemptions": sum(len(s.preempted) for e in run.engines for s in e.records),
        "steps": sum(len(e.records) for e in run.engines),
        "wall_s": run.wall_s,
    }


def compare_splits(spec, device, requests, cards: int, splits=None, ttft_target_s=TTFT_TARGET_S,
                   tpot_target_s=TPOT_TARGET_S, **options) -> list[dict]:  # fmt: skip
    """One row of figures per split of `cards`: prefill engines 0 (all replicas), then each P of `splits` (default:
    1 to cards - 1), the same crowd served each time."""
    splits = range(1, cards) if splits is None else splits
    return [fleet_figures(simulate_fleet(spec, device, requests, cards, p, **options), ttft_target_s, tpot_target_s)
            for p in [0, *(p for p in splits if p)]]  # fmt: skip


TIMES = (("TTFT p50", "ttft_p50_s"), ("TTFT p99", "ttft_p99_s"), ("ITL p50", "itl_p50_s"), ("ITL p99", "itl_p99_s"),
         ("TPOT p99", "tpot_p99_s"), ("KV move p50", "kv_transfer_p50_s"))  # fmt: skip


def ms(seconds: float | None) -> str:
    """Milliseconds, to a tenth below 100."""
    return "-" if seconds is None else f"{seconds * 1e3:.0f}" if seconds >= 0.1 else f"{seconds * 1e3:.1f}"


def splits_text(rows: list[dict], title: str) -> str:
    """The table `whatif --fleet` prints: one line per split."""
    first = rows[0]
    lines = [
        title,
        f"  goodput: the share of requests with TTFT <= {first['ttft_target_s']:g} s and TPOT <= "
        f"{first['tpot_target_s']:g} s (DistServe's chatbot targets, unless given); ms",
        f"  {'split':<12}" + "".join(f"{name:>12}" for name, _ in TIMES) + f"{'goodput':>9}{'tokens/s':>10}",
    ]
    for r in rows:
        times = "".join(f"{ms(r[key]):>12}" for _, key in TIMES)
        lines.append(f"  {r['split']:<12}{times}{r['goodput']:9.0%}{r['tokens_per_s']:10,.0f}")
    best = max(rows, key=lambda r: (r["goodput"], r["tokens_per_s"]))
    wall = sum(r["wall_s"] for r in rows)
    lines.append(f"  most goodput: {best['split']} ({best['goodput']:.0%}); simulated in {wall:.1f} s of this "
                 f"machine's time ({wall / len(rows):.1f} s a split)")  # fmt: skip
    return "\n".join(lines)
