"""minillm against Hugging Face transformers' `generate`, on the same exported weights and the same requests.

The shipped model is exported (serving/export.py: the standard Llama layout) and loaded twice: by transformers'
LlamaForCausalLM and back by minillm. Both serve the same chat crowd (everyone queued at once, reply lengths
drawn, EOS ignored) in the same process and torch threads:

  transformers  `generate` on batches of SEATS prompts in arrival order (left-padded): static batching, each
                batch runs until its longest reply, as a plain `generate` loop serves a crowd
  minillm       the engine, continuous and static, SEATS seats, paged KV
  one user      one prompt, FIXED_REPLY tokens: `generate` against minillm's generate (python -m minillm generate)

transformers is not a minillm dependency: without it the entry says so and measures nothing.
"""

from __future__ import annotations

import statistics
import tempfile
import time

import torch

from minillm.model.tokenizer import PAD
from minillm.model.transformer import Transformer
from minillm.runs.workload import ChatKnobs, make_workload

SEATS, REQUESTS, FIXED_REPLY = 16, 64, 100
SKIPPED = "skipped: pip install transformers (not a minillm dependency) to compare with its generate"


def hf_static(hf, requests, seats: int) -> dict:
    """transformers' generate on batches of `seats` requests: output tokens each request asked for, over the time."""
    spent, tokens, outputs = 0.0, 0, []
    for start in range(0, len(requests), seats):
        batch = requests[start : start + seats]
        width, longest = max(len(r.prompt_ids) for r in batch), max(r.max_new_tokens for r in batch)
        ids = torch.tensor([[PAD] * (width - len(r.prompt_ids)) + r.prompt_ids for r in batch])  # (B, T) left-padded
        mask = (torch.arange(width) >= torch.tensor([width - len(r.prompt_ids) for r in batch])[:, None]).long()
        began = time.perf_counter()
        out = hf.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=longest,
            min_new_tokens=longest,
            do_sample=False,
            pad_token_id=PAD,
        )  # fmt: skip (min_new_tokens: EOS ignored, as minillm's)
        spent += time.perf_counter() - began
        tokens += sum(r.max_new_tokens for r in batch)  # what the users asked for; the rest is static's padding
        outputs += [row[width : width + r.max_new_tokens].tolist() for row, r in zip(out, batch)]
    return {"tokens_per_s": tokens / spent, "outputs": outputs}


def single_user(hf, model: Transformer, prompt_ids: list[int], repeats: int) -> dict:
    """One prompt, FIXED_REPLY new tokens: tokens/s of each, the median of `repeats` runs."""
    from minillm.engine.generate import generate

    ids = torch.tensor([prompt_ids])

    def run_hf():
        hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=FIXED_REPLY,
                    min_new_tokens=FIXED_REPLY, do_sample=False, pad_token_id=PAD)  # fmt: skip

    runs = {"transformers": run_hf, "minillm": lambda: generate(model, prompt_ids, FIXED_REPLY, ignore_eos=True)}
    times = {name: [] for name in runs}
    for repeat in range(repeats + 1):  # in turns, so that a burst of other work falls on both; the first: warm-up
        for name, fn in runs.items():
            began = time.perf_counter()
            fn()
            times[name] += [time.perf_counter() - began] if repeat else []
    return {name: FIXED_REPLY / statistics.median(t) for name, t in times.items()}


def bench_vs_transformers(model: Transformer, s) -> dict:
    try:
        from transformers import LlamaForCausalLM
    except ImportError:
        return {"skipped": SKIPPED}
    import transformers

    from minillm.bench.common import serve
    from minillm.serving.export import export_llama, import_llama

    knobs = ChatKnobs(requests=REQUESTS, rate=1000, mean_reply=60, spread=1.0, force_lengths=True)
    with tempfile.TemporaryDirectory() as folder:
        export_llama(model, folder)
        hf = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        ours = import_llama(folder)
    requests = make_workload("chat", knobs, seed=0)
    tokens_per_s, replies = {"hf": [], "continuous": [], "static": []}, {}
    for _ in range(2):  # in turns, twice, so that a burst of other work on a shared machine falls on all three
        with torch.no_grad():
            theirs = hf_static(hf, requests, SEATS)
        tokens_per_s["hf"].append(theirs["tokens_per_s"])
        for policy in ("continuous", "static"):
            summary, trace = serve(ours, "chat", policy, "paged", SEATS, knobs)
            tokens_per_s[policy].append(summary["tokens_per_s"])
            replies[policy] = [r.output_ids for r in trace.requests]
    with torch.no_grad():
        single = single_user(hf, ours, requests[0].prompt_ids, 3 if s.quick else 5)
    same = sum(a == b for a, b in zip(theirs["outputs"], replies["continuous"]))
    hf_tps, cont, stat = (statistics.mean(tokens_per_s[k]) for k in ("hf", "continuous", "static"))
    return {"transformers": transformers.__version__, "seats": SEATS, "requests": REQUESTS,
            "hf_static_tokens_per_s": hf_tps, "continuous_tokens_per_s": cont, "static_tokens_per_s": stat,
            "continuous_vs_hf": cont / hf_tps, "static_vs_hf": stat / hf_tps, "identical_outputs": same,
            "single_user": single, "single_vs_hf": single["minillm"] / single["transformers"],
            "goal_continuous_vs_hf": 3.0, "goal_single_vs_hf": 1.0,
            "met": cont / hf_tps >= 3.0 and single["minillm"] >= single["transformers"]}  # fmt: skip


def markdown(r: dict) -> list[str]:
    from minillm.bench.report_scheduling import verdict

    lines = ["## 13. minillm against transformers' generate", ""]
    if "skipped" in r:
        return lines + [r["skipped"], ""]
    one = r["single_user"]
    return lines + [
        f"The shipped model exported in the Llama layout and loaded by transformers {r['transformers']} "
        f"(LlamaForCausalLM) and by minillm; the same `chat` crowd of {r['requests']} requests queued at once "
        f"(reply lengths drawn, EOS ignored), {r['seats']} seats, the same process and threads; each tokens/s the mean "
        "of two runs taken in turns.",
        "",
        "| server | tokens/s | / transformers |",
        "|---|---:|---:|",
        f"| transformers `generate`, batches of {r['seats']} (static) | {r['hf_static_tokens_per_s']:.0f} | 1.00 |",
        f"| minillm, static | {r['static_tokens_per_s']:.0f} | {r['static_vs_hf']:.2f} |",
        f"| minillm, continuous | {r['continuous_tokens_per_s']:.0f} | {r['continuous_vs_hf']:.2f} |",
        "",
        f"One user, one prompt, {FIXED_REPLY} tokens: transformers {one['transformers']:.0f} tokens/s, minillm "
        f"{one['minillm']:.0f} ({r['single_vs_hf']:.2f}x). Replies identical token for token: "
        f"{r['identical_outputs']} of {r['requests']}. Goals: continuous at least {r['goal_continuous_vs_hf']:.0f}x "
        f"transformers, one user at least as fast: {verdict(r['met'])}.",
        "",
    ]
