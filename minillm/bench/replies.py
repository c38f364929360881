"""n replies to one prompt (OpenAI's n): the prompt's KV computed once and its blocks shared, against n requests.

One long prompt (the `rules` system prompt of the training tasks and a countdown: 582 tokens of the shipped model's
1024) answered n times, sampled, each reply of a fixed length: by `submit_replies` (layers/replies.py: the first
reply runs the prompt, the others fork its blocks and run only its last token), and as n separate requests of the
same prompt, request i seeded as reply i is (seed + i). Prefix caching is off on both sides, so the separate
requests compute and store the prompt n times. One run each: the figures are counts (prompt tokens computed, the
most KV blocks held at once), and every reply of both runs is checked token for token against the one-user loop
(`generate`) with its seed.
"""

from __future__ import annotations

import time

from minillm.model.transformer import Transformer

N, SWEEP = 8, (1, 2, 4, 8, 16)
REPLY, TEMPERATURE, SEED = 48, 1.0, 11  # tokens per reply (EOS ignored), sampled, reply i seeded SEED + i
GOAL = 0.25  # shared / separate, for prompt tokens computed and blocks held (issue 43)


def the_prompt() -> list[int]:
    from minillm.model.tokenizer import encode_prompt
    from minillm.training.tasks import PREAMBLES

    return encode_prompt("count down from 40", PREAMBLES["rules"])


def serve(model: Transformer, prompt: list[int], n: int, shared: bool) -> tuple[dict, list[list[int]]]:
    """n replies to `prompt`, shared (submit_replies) or as n requests: the run's figures and the replies."""
    from minillm.config import EngineConfig, Sampling
    from minillm.engine.request import Request
    from minillm.engine.scheduler import ContinuousScheduler
    from minillm.layers import LayeredEngine

    engine = LayeredEngine(model, ContinuousScheduler(), EngineConfig(slots=max(SWEEP), prefix_caching=False))
    ask = lambda i: Request(f"a{i}", prompt, REPLY, ignore_eos=True, sampling=Sampling(TEMPERATURE, seed=SEED + i))
    if shared:
        replies = engine.submit_replies(ask(0), n)
    else:
        replies = [ask(i) for i in range(n)]
        for r in replies:
            engine.submit(r)
    start = time.perf_counter()
    trace = engine.run()
    wall = time.perf_counter() - start
    began = trace.steps[0].time_s - trace.steps[0].wall_s  # (everyone asked as the run began)
    figures = {
        "n": n,
        "prompt_tokens_computed": sum(r.prefill_tokens for r in replies),
        "peak_blocks": max(s.kv_blocks_used for s in trace.steps),
        "output_tokens": sum(len(r.output_ids) for r in replies),
        "wall_s": wall,
        "tokens_per_s": sum(len(r.output_ids) for r in replies) / wall,
        "last_ttft_steps": max(r.first_token_step for r in replies) + 1,
        "last_ttft_s": max(r.first_token_s for r in replies) - began,
        "steps": len(trace.steps),
        "preemptions": sum(r.preemptions for r in replies),
    }
    return figures, [r.output_ids for r in replies]


def bench_replies(model: Transformer, s) -> dict:
    from minillm.engine.scheduler import DEFAULT_TOKEN_BUDGET
    from minillm.layers import generate

    prompt = the_prompt()
    twins = [generate(model, prompt, REPLY, temperature=TEMPERATURE, seed=SEED + i, ignore_eos=True).tokens
             for i in range(N)]  # fmt: skip
    # the sweep in order of n: the runs before n = N warm the engine up for its timed figures
    runs = {n: [serve(model, prompt, n, way) for way in (True, False)] for n in SWEEP}
    (shared, shared_replies), (apart, apart_replies) = runs[N]
    exact = sum(a == t for a, t in zip(shared_replies, twins)) + sum(a == t for a, t in zip(apart_replies, twins))
    sweep = [{"n": n} | {f"{way}_{key}": x[key] for way, (x, _) in zip(("shared", "separate"), runs[n])
                         for key in ("prompt_tokens_computed", "peak_blocks")} for n in SWEEP]  # fmt: skip
    prompt_ratio = shared["prompt_tokens_computed"] / apart["prompt_tokens_computed"]
    blocks_ratio = shared["peak_blocks"] / apart["peak_blocks"]
    return {"prompt_len": len(prompt), "reply_len": REPLY, "n": N, "temperature": TEMPERATURE, "seed": SEED,
            "slots": max(SWEEP), "token_budget": DEFAULT_TOKEN_BUDGET,
            "shared": shared, "separate": apart, "prompt_ratio": prompt_ratio, "blocks_ratio": blocks_ratio,
            "twins_exact": exact, "twins_checked": 2 * N, "sweep": sweep, "goal": GOAL,
            "met": prompt_ratio <= GOAL and blocks_ratio <= GOAL and exact == 2 * N}  # fmt: skip


def markdown(r: dict, img) -> list[str]:
    from minillm.bench.report_scheduling import verdict

    a, b = r["shared"], r["separate"]
    lines = ["## 21. n replies to one prompt: the prompt's KV computed once", "",
             f"One prompt of {r['prompt_len']} tokens (the `rules` system prompt and a countdown), {r['n']} replies "
             f"of {r['reply_len']} tokens each (EOS ignored), sampled at temperature {r['temperature']:g}: OpenAI's "
             "`n` (`submit_replies`, layers/replies.py: the first reply runs the prompt, the others share its KV "
             "blocks by reference count and run only its last token) against as many separate requests of the "
             f"same prompt, request i seeded as reply i is. The tiny model, {r['slots']} seats, paged KV in blocks "
             f"of 16 tokens, a token budget of {r['token_budget']} a step, prefix caching off on both sides; one run "
             "each.", "",
             f"| {r['n']} replies | prompt tokens computed | peak KV blocks held | output tokens/s | TTFT of the "
             "last reply | steps |", "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for name, x in (("`n`: one prompt, shared", a), ("separate requests", b)):
        lines.append(f"| {name} | {x['prompt_tokens_computed']:,} | {x['peak_blocks']} | {x['tokens_per_s']:.0f} | "
                     f"{x['last_ttft_steps']} steps, {x['last_ttft_s'] * 1e3:.0f} ms | {x['steps']} |")  # fmt: skip
    lines += ["", f"Shared / separate: prompt tokens computed {r['prompt_ratio']:.3f}, peak blocks held "
              f"{r['blocks_ratio']:.3f} (goal: at most {r['goal']:g} each), output tokens/s "
              f"{a['tokens_per_s'] / b['tokens_per_s']:.2f}x (this machine's wall clock); {r['twins_exact']} of "
              f"{r['twins_checked']} replies (both runs) token-exact with the one-user loop under the reply's "
              f"seed: {verdict(r['met'])}.", "",
              "| n | prompt tokens computed, shared / separate | peak blocks held, shared / separate |",
              "|---:|---:|---:|"]  # fmt: skip
    for x in r["sweep"]:
        lines.append(f"| {x['n']} | {x['shared_prompt_tokens_computed']:,} / {x['separate_prompt_tokens_computed']:,} "
                     f"| {x['shared_peak_blocks']} / {x['separate_peak_blocks']} |")  # fmt: skip
    lines += ["", "Each further reply costs one prompt token (its own pick needs its own logits) and the blocks of "
              "its own reply, with a copy of the prompt's partly filled last block: the blocks held grow by a "
              "reply's worth per reply instead of a prompt's and a reply's. The separate requests compute and hold "
              "the prompt once each (prefix caching, section 7, would let them share its full blocks once one of "
              "them has computed them).", ""]  # fmt: skip
    return lines + img("replies")


def plot(results: dict, out, save) -> list:
    """Peak KV blocks held against n: the replies sharing one prompt, and as many separate requests."""
    import matplotlib.pyplot as plt

    if "replies" not in results:
        return []
    r = results["replies"]
    ns = [x["n"] for x in r["sweep"]]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot(ns, [x["separate_peak_blocks"] for x in r["sweep"]], "s--", color="tab:grey", label="separate requests")
    ax.plot(ns, [x["shared_peak_blocks"] for x in r["sweep"]], "o-", color="tab:green", label="n replies, shared")
    ax.set(xlabel="replies to one prompt (n)", ylabel="peak KV blocks held", xticks=ns, ylim=(0, None))
    ax.set_title(f"n replies to one {r['prompt_len']}-token prompt, {r['reply_len']} tokens each", fontsize=11)
    ax.legend()
    return [save(fig, out / "replies.png")]
