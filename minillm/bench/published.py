"""The cost model on real cards, against published measurements it never saw.

Each row is a figure someone measured and published, at a stated card, model, dtype, batch and
lengths; beside it, what `run --simulate` (the same engine and schedulers on a simulated clock,
priced by enginecost.py) predicts for the same run. These rows are the model's test, not its
training data: no constant in hardware.py, roofline.py or enginecost.py was chosen to fit them.

Sources (the same names are in BENCHMARKS.md, written from this table):
- LLAMA_CPP: github.com/XiongjieDai/GPU-Benchmarks-on-LLM-Inference, README, "LLaMA 3" NVIDIA table
  (llama.cpp llama-bench, RunPod, snapshots May 2024), Llama-3-8B F16 (Llama-3.1-8B's shapes). tg N: N tokens
  generated one at a time from an empty context; pp N: a prompt of N tokens in one batch. Tokens/s.
- TRT_LLM: github.com/NVIDIA/TensorRT-LLM, docs/source/performance.md: "Peak Throughput" tables (v0.6.1,
  gptSessionBenchmark: a static batch of `batch` prompts of the input length, each generating the output
  length; output tokens/s; TP 1) and "Low Latency" tables (v0.5: first-token latency at batch 1).
  "LLaMA 7B" there is Llama-2-7b (the doc's methodology section). H100 rows: FP8 weights and FP8 KV cache
  (--enable_fp8 --fp8_kv_cache) on an H100-HBM3-80GB (SXM); A100 rows: FP16 (the doc does not name the A100
  variant; a batch of 384 x 256 tokens of fp16 KV needs the 80 GB card, priced as the 80GB SXM).
"""

from __future__ import annotations

from dataclasses import dataclass

LLAMA_CPP = "llama.cpp (XiongjieDai/GPU-Benchmarks-on-LLM-Inference, LLaMA 3 table, May 2024)"
TRT_LLM = "TensorRT-LLM docs/source/performance.md (v0.6.1 throughput, v0.5 first-token latency)"
GOALS = {"decode": 0.20, "batched": 0.25, "prefill": 0.35}


@dataclass(frozen=True)
class Figure:
    kind: str  # "decode" (one stream, tokens/s), "batched" (output tokens/s), "prefill" (prompt tokens/s or TTFT)
    gpu: str
    model: str
    dtype: str
    kv_dtype: str
    batch: int
    prompt: int  # tokens per prompt
    reply: int  # tokens generated per request
    reported: float
    unit: str  # "tokens/s" or "ms"
    source: str
    label: str


def _figures() -> list[Figure]:
    rows = []
    for gpu, figures in (("rtx-4090", (54.84, 52.63, 9382.00)), ("rtx-3090", (47.40, 44.79, 4444.65))):
        tg512, tg4096, pp512 = figures
        rows += [
            Figure("decode", gpu, "llama-3.1-8b", "fp16", "fp16", 1, 1, 512, tg512, "tokens/s", LLAMA_CPP, "tg 512"),
            Figure("decode", gpu, "llama-3.1-8b", "fp16", "fp16", 1, 1, 4096, tg4096, "tokens/s", LLAMA_CPP, "tg 4096"),
            Figure("prefill", gpu, "llama-3.1-8b", "fp16", "fp16", 1, 512, 1, pp512, "tokens/s", LLAMA_CPP, "pp 512"),
        ]  # fmt: skip
    for gpu, dtype, table in (
        ("h100-sxm", "fp8", ((768, 128, 128, 19694), (112, 128, 2048, 6818), (80, 2048, 128, 2244),
                             (48, 2048, 2048, 2740))),
        ("a100-80gb-sxm", "fp16", ((384, 128, 128, 5586), (60, 128, 2048, 1928), (52, 2048, 128, 591))),
    ):  # fmt: skip
        for batch, prompt, reply, reported in table:
            rows.append(Figure("batched", gpu, "llama-2-7b", dtype, dtype, batch, prompt, reply, reported, "tokens/s",
                               TRT_LLM, f"batch {batch}, {prompt} in, {reply} out"))  # fmt: skip
    for gpu, dtype, latencies in (("h100-sxm", "fp8", ((128, 7), (2048, 36))),
                                  ("a100-80gb-sxm", "fp16", ((128, 16), (2048, 133)))):  # fmt: skip
        for prompt, ms in latencies:
            rows.append(Figure("prefill", gpu, "llama-2-7b", dtype, dtype, 1, prompt, 1, ms, "ms", TRT_LLM,
                               f"first token, {prompt} in"))  # fmt: skip
    return rows


FIGURES = _figures()
# One stream, 512 tokens from an empty context (about 256 cached on average): tests/test_roofline.py holds the bound
# against these, the lesson draws them.
PUBLISHED_SINGLE_STREAM = {f.gpu: f.reported for f in FIGURES if f.label == "tg 512"}


def simulate(f: Figure) -> dict:
    """The figure's run on the simulated card: `batch` requests all at once, fixed lengths, whole prompts in one
    step (token budget 0: a static batch's context phase), static batching as the benchmarks ran them."""
    from minillm.card.hardware import get_device
    from minillm.card.modelspec import load_spec
    from minillm.card.simulate import SimulatedRunner
    from minillm.runs.metrics import summarize
    from minillm.runs.run import run_workload
    from minillm.runs.workload import ChatKnobs

    runner = SimulatedRunner(load_spec(f.model), get_device(f.gpu), f.dtype, f.kv_dtype)
    # a request's reply is its planned tokens then EOS: `reply - 1` planned makes `reply` generated
    knobs = ChatKnobs(requests=f.batch, rate=1e9, prompt_len=f.prompt, reply_len=max(1, f.reply - 1))
    trace = run_workload(runner, "azure-conv", "static", slots=f.batch, knobs=knobs, token_budget=0)
    s = summarize(trace)
    prefill_s = sum(st.wall_s for st in trace.steps if st.prefill_tokens)
    return {"summary": s, "prefill_share": prefill_s / s["wall_s"], "preemptions": s["preemptions"]}


def predict(f: Figure) -> tuple[float, dict]:
    """The prediction in the figure's own unit, and what the simulation saw."""
    run = simulate(f)
    s = run["summary"]
    if f.kind == "prefill":
        value = 1e3 * s["ttft_p50_s"] if f.unit == "ms" else f.prompt / s["ttft_p50_s"]
    else:
        value = s["output_tokens"] / s["wall_s"]
    return value, run


def explain(f: Figure, predicted: float, run: dict) -> str:
    """One line: what bounds this run in the model, and what share of the card the published figure implies."""
    from minillm.card import roofline
    from minillm.card.enginecost import COMPUTE_EFFICIENCY, engine_step
    from minillm.card.hardware import DEVICES
    from minillm.card.modelspec import load_spec

    spec, card = load_spec(f.model), DEVICES[f.gpu]
    faster = predicted > f.reported if f.unit == "tokens/s" else predicted < f.reported
    ratio = predicted / f.reported if f.unit == "tokens/s" else f.reported / predicted
    if f.kind == "decode":
        step = engine_step(spec, card, [(1, f.reply // 2)], f.dtype, f.kv_dtype)
        moved = roofline.weight_bytes(spec, f.dtype) + roofline.kv_bytes_per_token(spec, f.kv_dtype) * f.reply // 2
        share = moved * f.reported / card.bandwidth
        return (f"memory-bound ({step.time_s * 1e3:.1f} ms a token): the published speed moves {share:.0%} of the "
                f"datasheet bandwidth, the model assumes {card.efficiency:.0%}")  # fmt: skip
    if f.kind == "prefill":
        step = engine_step(spec, card, [(f.prompt, 0)], f.dtype, f.kv_dtype)
        seconds = f.reported / 1e3 if f.unit == "ms" else f.prompt / f.reported
        if step.matmul_bound == "memory":
            passes = seconds / (roofline.weight_bytes(spec, f.dtype) / (card.bandwidth * card.efficiency))
            return (f"memory-bound: one pass over the weights; the published time is {passes:.1f} passes' worth "
                    "(a generation step, or fixed costs, that the model does not count)")  # fmt: skip
        flops = roofline.step_cost(spec, card, [(f.prompt, 0)], f.dtype, f.kv_dtype).flops
        dtype = roofline.compute_dtype(f.dtype, card)
        return (f"compute-bound: the published time runs at {flops / seconds / card.peak_flops(dtype):.0%} of dense "
                f"{dtype} peak, the model assumes {COMPUTE_EFFICIENCY[dtype]:.0%}")  # fmt: skip
    middle = engine_step(spec, card, [(1, f.prompt + f.reply // 2)] * f.batch, f.dtype, f.kv_dtype)
    return (
        f"{run['prefill_share']:.0%} of the predicted time is the batch's prefill; decode steps: matmuls "
        f"{middle.matmul_bound}-bound, attention {middle.attention_bound}-bound"
        + (f"; {run['preemptions']} preemptions (KV full)" if run["preemptions"] else "")
        + ("" if abs(ratio - 1) < GOALS[f.kind] else f"; predicted {'faster' if faster else 'slower'}")
    )


def bench_published(model, s) -> dict:
    rows = []
    for f in FIGURES:
        predicted, run = predict(f)
        error = predicted / f.reported - 1
        rows.append({"kind": f.kind, "gpu": f.gpu, "model": f.model, "dtype": f.dtype, "kv_dtype": f.kv_dtype,
                     "batch": f.batch, "prompt": f.prompt, "reply": f.reply, "label": f.label, "unit": f.unit,
                     "reported": f.reported, "predicted": predicted, "error": error, "source": f.source,
                     "goal": GOALS[f.kind], "met": abs(error) <= GOALS[f.kind],
                     "why": explain(f, predicted, run)})  # fmt: skip
    return {"rows": rows, "goals": GOALS, "met": all(r["met"] for r in rows)}
