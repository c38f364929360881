"""Prefill apart from decode, at equal processes: two engines each doing both (colocated: `serve --replicas 2`)
against one prefilling and one decoding (`serve --disaggregate`), on a crowd with long prompts.

The claim to see (vLLM's docs on disaggregated prefilling): splitting prefill from decode does not raise throughput;
it trades time to first token against inter-token latency. Colocated, a long prompt's chunks share steps with every
decoding user of its engine, so their tokens come late while it runs (the stall of lesson 08: a token budget cuts it
into chunks, and the decode rows still wait for each chunk's step); disaggregated, the decode engine runs decode rows
only, so the gaps between tokens stay short, but every prompt queues on one engine (half the prefill capacity) and
its KV must cross. Both servers get the same users at the same times (the load generator, one seed); the figures are
the client's: TTFT p50/p99, ITL p99, TPOT p50, output tokens/s. Reported whichever way they come out.
"""

from __future__ import annotations

import asyncio

from minillm.runs.workload import ChatKnobs

SLOTS = 8  # seats per engine
REQUESTS, QUICK_REQUESTS, RATE_PER_S = 48, 24, 3.0  # the long-prompts crowd, at a rate two engines hold here


def measure(loop, jobs) -> dict:
    """The client's view of `jobs` sent to a server over `loop` (started and stopped here)."""
    from minillm.serving.loadgen import run_jobs, summarize_load
    from minillm.serving.server import ServerThread

    with ServerThread(loop) as server:
        outcomes = asyncio.run(run_jobs(server.url, jobs, model="minillm"))
    s = summarize_load(outcomes)
    keys = ("ttft_p50_s", "ttft_p99_s", "itl_p99_s", "tpot_p50_s", "tokens_per_s", "errors", "finished")
    return {k: s.get(k) for k in keys}


def bench_disaggregation(model, settings) -> dict:
    from minillm.serving.loadgen import jobs_from_workload
    from minillm.serving.server import build_fleet, build_loop

    requests = QUICK_REQUESTS if settings.quick else REQUESTS
    jobs = lambda: jobs_from_workload("long-prompts", requests, rate_per_s=RATE_PER_S, seed=0)
    colocated = measure(build_fleet(model, 2, "least-loaded", slots=SLOTS), jobs())
    split = measure(build_loop(model, slots=SLOTS, disaggregate=True), jobs())
    return {"requests": requests, "rate_per_s": RATE_PER_S, "slots": SLOTS, "workload": "long-prompts",
            "colocated": colocated, "disaggregated": split, "knobs": vars(ChatKnobs(requests=requests))}  # fmt: skip


def markdown(r: dict) -> list[str]:
    ms = lambda v: "–" if v is None else f"{v * 1e3:,.0f} ms"
    rows = [("TTFT p50", "ttft_p50_s", ms), ("TTFT p99", "ttft_p99_s", ms), ("ITL p99", "itl_p99_s", ms),
            ("TPOT p50", "tpot_p50_s", ms), ("output tokens/s", "tokens_per_s", lambda v: f"{v:,.0f}")]  # fmt: skip
    c, d = r["colocated"], r["disaggregated"]
    lines = [f"Colocated (two engines, each prefilling and decoding, behind a least-loaded router) against "
             f"disaggregated (one engine prefills, the other decodes): {r['requests']} users of the "
             f"`{r['workload']}` crowd arriving at {r['rate_per_s']:g} a second, {r['slots']} seats an engine.", "",
             "| | colocated | disaggregated |", "|---|---:|---:|"]  # fmt: skip
    lines += [f"| {label} | {fmt(c[key])} | {fmt(d[key])} |" for label, key, fmt in rows]
    return lines + ["", why(c, d), ""]


def why(c: dict, d: dict) -> str:
    """Which way it came out, and the reasons, from the two columns."""
    change = lambda key: d[key] / c[key] - 1  # noqa: E731
    itl, ttft, rate = change("itl_p99_s"), change("ttft_p99_s"), d["tokens_per_s"] / c["tokens_per_s"]
    said = f"Disaggregated against colocated: ITL p99 {itl:+.0%}, TTFT p99 {ttft:+.0%}, output tokens/s {rate:.2f}x. "
    if itl < 0:
        return said + ("The decode engine's steps carry no prompt, so its gaps between tokens stay short; each prompt "
                       "queues on the one prefill engine instead (half the prefill capacity) and its KV crosses: the "
                       "trade vLLM's docs describe, not more throughput.")  # fmt: skip
    return said + ("Here splitting did not shorten the gaps between tokens. Colocated, a long prompt's chunk costs "
                   "the decode rows sharing its step a few milliseconds (section 6 shows that stall); disaggregated, "
                   "the decode engine's steps carry no prompt, but it receives each arriving prompt's KV between its "
                   "steps, tensor by tensor over gloo (each message costs about what a small all-reduce does: section "
                   "17), it carries every user's decode rows (the colocated engines split them), and the prefill "
                   "engine computes on the two cores the decode engine needs (with the HTTP server: three processes "
                   "on two cores). On GPUs, each engine on cards of its own and the KV over NVLink or InfiniBand, a "
                   "big model's prompt chunk costs a decode step far more than a transfer does, and the split wins "
                   "ITL: lesson 13 and `whatif --fleet` price it on real cards.")  # fmt: skip
