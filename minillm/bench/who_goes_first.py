"""Who goes first: first come first served, priority and deadline on the mixed crowd, judged by goodput.

The mixed crowd (runs/workload.py `mixed`, classes in runs/classes.py): chat users with a TTFT target of 1 s and a
TPOT target of 0.1 s, and batch jobs (a long document, a long reply) with only a deadline of 60 s, arriving together
past the seats. Measured twice: the tiny model on this machine (seconds of its wall clock), and Llama-3.1-8B on a
simulated H100 (the cost model's seconds: the same engine, policies and books). Then the victim rules side by side
on a pool too small for everyone: what each preemption costs in recomputed tokens.
"""

from __future__ import annotations

from minillm.model.transformer import Transformer
from minillm.runs.workload import ChatKnobs

POLICIES = ("continuous", "priority", "deadline")  # continuous: first come, first served
KEYS = ("goodput_per_s", "targets_met_share", "chat_targets_met_share", "batch_targets_met", "batch_requests_judged",
        "chat_ttft_p99_s", "longest_wait_s", "preemptions", "prefill_tokens", "tokens_per_s",
        "wall_s", "steps")  # fmt: skip
GOAL_GOODPUT, GOAL_TTFT = 1.5, 3.0  # deadline / FCFS goodput; FCFS / priority chat TTFT p99
CARD_SEATS = (8, 16, 32)  # the simulated card's crowd on fewer and more seats: how the gain depends on the overload


def one_crowd(model_for_a_run, slots: int, requests: int) -> dict:
    """The three policies on the same crowd: their figures, ratios, goals, and whether every reply agreed.
    model_for_a_run(): the model, or a fresh simulated card (its clock starts at 0)."""
    from minillm.bench.common import serve

    knobs = ChatKnobs(requests=requests, rate=1000)  # (as many per step as there are: all queued at step 0)
    runs = {p: serve(model_for_a_run(), "mixed", p, "paged", slots, knobs) for p in POLICIES}
    rows = [{"policy": p} | {k: runs[p][0].get(k) for k in KEYS} for p in POLICIES]
    fcfs, priority, deadline = (runs[p][0] for p in POLICIES)
    replies = [{r.id: r.output_ids for r in runs[p][1].requests} for p in POLICIES]
    goodput_ratio = deadline["goodput_per_s"] / fcfs["goodput_per_s"]
    ttft_ratio = fcfs["chat_ttft_p99_s"] / priority["chat_ttft_p99_s"]
    batch_done = all(x["batch_targets_met"] == x["batch_requests_judged"] for x in (priority, deadline))
    identical = sum(replies[0][rid] == replies[1][rid] == replies[2][rid] for rid in replies[0])
    return {"slots": slots, "requests": requests, "rows": rows, "goodput_ratio": goodput_ratio,
            "ttft_ratio": ttft_ratio, "batch_all_finished": batch_done, "identical_replies": identical,
            "met": goodput_ratio >= GOAL_GOODPUT and ttft_ratio >= GOAL_TTFT and batch_done}  # fmt: skip


def victims(model, s) -> list[dict]:
    """The priority policy on a pool that holds a few users: each victim rule's preemptions and recomputation."""
    from minillm.bench.common import serve
    from minillm.layers.policies import VICTIMS

    knobs = ChatKnobs(requests=24 if s.quick else 48, rate=1000)
    rows = []
    for rule in VICTIMS:
        summary, trace = serve(model, "mixed", "priority", "paged", 8, knobs, num_blocks=96, victim=rule)
        prompt = sum(len(r.prompt_ids) for r in trace.requests)
        rows.append({"victim": rule, "preemptions": summary["preemptions"], "goodput_per_s": summary["goodput_per_s"],
                     "recomputed_tokens": summary["prefill_tokens"] - prompt,
                     "chat_ttft_p99_s": summary["chat_ttft_p99_s"]})  # fmt: skip
    return rows


def bench_who_goes_first(model: Transformer, s) -> dict:
    from minillm.card.hardware import get_device
    from minillm.card.modelspec import load_spec
    from minillm.card.simulate import SimulatedRunner

    tiny = one_crowd(lambda: model, 8, 48 if s.quick else 96)
    h100 = lambda: SimulatedRunner(load_spec("llama-3.1-8b"), get_device("h100-sxm"))  # (a fresh clock each run)
    cards = [one_crowd(h100, slots, 96) for slots in CARD_SEATS]
    return {"tiny": tiny, "cards": cards, "victims": victims(model, s), "goal_goodput": GOAL_GOODPUT,
            "goal_ttft": GOAL_TTFT, "met": tiny["met"]}  # fmt: skip


def markdown(r: dict, img) -> list[str]:
    from minillm.bench.report_scheduling import verdict
    from minillm.runs.classes import ClassTargets

    t = ClassTargets()
    lines = ["## 20. Who goes first: priorities and deadlines, judged by goodput", "",
             f"The mixed crowd: chat users (TTFT within {t.chat_ttft_s:g} s, TPOT within {t.chat_tpot_s:g} s) and "
             f"batch jobs (a long document, a long reply; done within {t.batch_deadline_s:g} s), one in four a batch "
             "job, all queued at once in a random order. Goodput: requests per second that finished meeting all "
             "their targets (DistServe, OSDI 2024). First come first served is `continuous`.", ""]  # fmt: skip
    x = r["tiny"]
    lines += [f"**The tiny model on this machine** (its wall clock), {x['requests']} users on {x['slots']} seats:", "",
              "| policy | goodput (req/s) | met all targets | chat met | batch finished in time | chat TTFT p99 "
              "| longest wait | preemptions | seconds |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for y in x["rows"]:
        lines.append(f"| {y['policy']} | {y['goodput_per_s']:.2f} | {y['targets_met_share']:.0%} | "
                     f"{y['chat_targets_met_share']:.0%} | {y['batch_targets_met']}/{y['batch_requests_judged']} "
                     f"| {y['chat_ttft_p99_s']:.2f} s | {y['longest_wait_s']:.2f} s | {y['preemptions']} | "
                     f"{y['wall_s']:.2f} |")  # fmt: skip
    lines += ["", f"Deadline / FCFS goodput {x['goodput_ratio']:.2f}x (goal {r['goal_goodput']}x); FCFS / "
              f"priority chat TTFT p99 {x['ttft_ratio']:.2f}x (goal {r['goal_ttft']}x); every batch job finished "
              f"in time: {'yes' if x['batch_all_finished'] else 'no'}; {x['identical_replies']} of "
              f"{x['requests']} replies identical under all three policies: {verdict(x['met'])}.", ""]  # fmt: skip
    lines += ["**Llama-3.1-8B on a simulated H100** (the cost model's seconds), the same kind of crowd, 96 users, "
              "on more or fewer seats:", "",
              "| seats | goodput FCFS / priority / deadline (req/s) | deadline / FCFS | chat TTFT p99 FCFS / priority "
              "| FCFS / priority | batch in time | longest wait (deadline) |",
              "|---:|---|---:|---|---:|---|---:|"]  # fmt: skip
    for x in r["cards"]:
        goodput = " / ".join(f"{y['goodput_per_s']:.2f}" for y in x["rows"])
        fcfs, prio, dl = x["rows"]
        lines.append(f"| {x['slots']} | {goodput} | {x['goodput_ratio']:.2f}x | {fcfs['chat_ttft_p99_s']:.2f} / "
                     f"{prio['chat_ttft_p99_s']:.2f} s | {x['ttft_ratio']:.2f}x | "
                     f"{'all' if x['batch_all_finished'] else 'not all'} | {dl['longest_wait_s']:.2f} s |")  # fmt: skip
    lines += ["", "The gain is largest where the crowd is past the seats but the chat users alone are not: with few "
              "seats the chat users queue behind each other whatever the policy, with many the batch jobs no longer "
              "stand in their way.", ""]  # fmt: skip
    lines += img("who_goes_first")
    lines += [
        "**Whom to preempt** (the priority policy, 8 seats, a pool of 96 blocks of 16 tokens):",
        "",
        "| victim rule | preemptions | tokens recomputed | chat TTFT p99 | goodput |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += [f"| {y['victim']} | {y['preemptions']} | {y['recomputed_tokens']} | {y['chat_ttft_p99_s']:.2f} s | "
              f"{y['goodput_per_s']:.2f} |" for y in r["victims"]]  # fmt: skip
    lines += ["", "First come first served seats whoever queued first, so a chat user behind a batch job waits for "
              "all of it. Priority and deadline seat the chat users first (their TTFT is due in a second, a batch "
              "job's deadline in a minute) and the batch jobs still finish within theirs; a batch job is never "
              "starved, since as the clock passes its due time every newcomer is due later.", ""]  # fmt: skip
    return lines


def plot(results: dict, out, save) -> list:
    """Goodput and the chat users' TTFT p99 under each policy: the tiny model, and the simulated card's seats."""
    import matplotlib.pyplot as plt

    if "who_goes_first" not in results:
        return []
    r = results["who_goes_first"]
    crowds = [("tiny model", r["tiny"])] + [(f"H100, {x['slots']} seats", x) for x in r["cards"]]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    width, colors = 0.27, dict(zip(POLICIES, ("tab:grey", "tab:blue", "tab:green")))
    for i, policy in enumerate(POLICIES):
        xs = [j + (i - 1) * width for j in range(len(crowds))]
        label = "first come, first served" if policy == "continuous" else policy
        axes[0].bar(xs, [x["rows"][i]["goodput_per_s"] for _, x in crowds], width, color=colors[policy], label=label)
        axes[1].bar(xs, [x["rows"][i]["chat_ttft_p99_s"] for _, x in crowds], width, color=colors[policy])
    from minillm.runs.classes import ClassTargets

    axes[1].axhline(ClassTargets().chat_ttft_s, color="tab:red", ls="--", label="a chat user's TTFT target")
    for ax, title in zip(axes, ("goodput: requests/s that met all their targets", "chat users' TTFT p99 (s)")):
        ax.set_xticks(range(len(crowds)), [name for name, _ in crowds])
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.suptitle("Who goes first: the mixed crowd (chat users and batch jobs, all at once)")
    return [save(fig, out / "who_goes_first.png")]
