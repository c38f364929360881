"""What `python -m minillm run` prints: a run's settings and figures, one line each."""

from __future__ import annotations

import argparse


def policy_words(name: str) -> str:
    return f"{name} batching" if name in ("static", "continuous") else f"continuous batching, {name} first"


def run_summary_text(args: argparse.Namespace, cfg: dict, summary: dict) -> str:
    where = f"{cfg['model']} on a simulated {cfg['gpu']}" if args.simulate else "the tiny model"
    where += f" split across {cfg['tp']} processes: tensor parallel" if cfg.get("tp", 1) > 1 else ""
    budget = cfg["token_budget"] or "no"
    ms = lambda key: "–" if summary[key] is None else f"{1000 * summary[key]:.0f} ms"
    lines = [
        f"{args.workload}: {policy_words(args.scheduler)}, {args.kv} KV, {cfg['slots']} seats, {cfg['num_blocks']} "
        f"blocks, {budget} token budget, prefix caching {'on' if cfg['prefix_caching'] else 'off'} ({where})",
        f"  requests     {summary['finished']} finished, {summary['rejected']} rejected of {summary['requests']}",
        f"  steps        {summary['steps']}  ({summary['output_tokens']} tokens, "
        f"{summary['tokens_per_step']:.2f}/step)",
        f"  throughput   {summary['tokens_per_s']:.0f} tokens/s over "
        + (f"{summary['simulated_s']:.2f} simulated s" if args.simulate else f"{summary['wall_s']:.2f} s of steps"),
        f"  utilization  {summary['slot_utilization']:.1%} of seat-steps did useful work",
        f"  TTFT         p50 {ms('ttft_p50_s')}, p99 {ms('ttft_p99_s')}   ({summary['ttft_p50_steps']} steps at p50)",
        f"  TPOT         p50 {ms('tpot_p50_s')}, p99 {ms('tpot_p99_s')}",
        f"  prefill      {summary['prefill_tokens']} tokens computed; {summary['prompt_tokens_from_cache']} of "
        f"{summary['prompt_tokens']} prompt tokens from the prefix cache (hit rate {summary['prefix_hit_rate']:.0%})",
        f"  KV waste     {summary['kv_waste']:.1%}   preemptions {summary['preemptions']}",
    ]
    if summary.get("n", 1) > 1:  # (n replies to each prompt: its KV computed once, shared)
        lines.insert(2, f"  replies      {summary['n']} to each of {summary['requests'] // summary['n']} prompts: "
                     f"{summary['finished']} made; {summary['prefill_tokens']} prompt tokens computed for the "
                     f"{summary['prompt_tokens']} in their prompts")  # fmt: skip
    classes = sorted(key.removesuffix("_requests_judged") for key in summary if key.endswith("_requests_judged"))
    if classes != ["default"] and classes:  # (targets given: who got the service they were promised)
        each = ", ".join(f"{c} {summary[f'{c}_targets_met']}/{summary[f'{c}_requests_judged']}" for c in classes)
        lines.append(f"  goodput      {summary['goodput_per_s']:.2f} requests/s met all their targets ({each}); "
                     f"longest wait {summary['longest_wait_s']:.2f} s")  # fmt: skip
    if cfg.get("speculate"):
        kept = f"{summary['draft_acceptance']:.0%} of {summary['drafts_verified']} checked were kept"
        lines.append(f"  speculation  {cfg['speculate']} draft tokens a step ({cfg['drafter']}): {kept}")
    tier = cfg.get("tier_events")
    if tier:  # (a second KV tier in host memory: layers/tier.py)
        lines.append(f"  host tier    {tier['written']} blocks written to host memory, {tier['loaded']} loaded back; "
                     f"preempted: {tier['swapped']} came back by copy, {tier['recomputed']} recomputed")  # fmt: skip
    if args.simulate:
        lines.append(f"  simulated in {summary['run_wall_s']:.1f} s of this machine's time")
    if args.trace:
        lines.append(f"  trace        {args.trace}")
    return "\n".join(lines)
