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
  Its "LLaMA 70B" rows are Llama-2-70b at TP 2 and 4 (tensor parallelism over NVLink), in output tokens/s PER GPU
  (the column's heading; the A100 table's says so from the commit after v0.6.1's).
- GPT_FAST: github.com/pytorch-labs/gpt-fast, README, "Tensor Parallelism" table (Nov 2023): Llama-2-7B and
  Llama-2-70B in bf16 on 1-8 of an 8xA100-80GB, "power limited to 330W", batch 1, a 5-token prompt, 200 tokens
  generated (generate.py's default --max_new_tokens); torch.compile with CUDA graphs, NCCL through torchrun.
- VLLM_CUSTOM_AR: github.com/vllm-project/vllm, PR #2192 "Custom all reduce kernels" (Dec 2023), latency table
  (benchmarks/benchmark_latency.py --input-len 256 --output-len 256 --batch-size 64 -tp 4): Llama 70B (Llama-2-70b,
  fp16) on A100-80G, seconds for the whole batch, with the PR's all-reduce.
- Mixtures of experts (Mixtral 8x7B at TP 2, TensorRT-LLM v0.9.0; gpt-oss-20b and -120b and Qwen3-30B-A3B in
  llama.cpp on an RTX 4090 and a DGX Spark, one stream at depths to 32k and batches of 1-32 streams, with a dense
  control on the Spark): published_moe.py, with their sources (`python -m minillm.bench.published --moe` prints those
  sources' rows alone).
"""

from __future__ import annotations

from dataclasses import dataclass

from minillm.bench.published_moe import MOE_SOURCES, explain_moe, explain_streams, moe_figures
from minillm.card.modelspec import load_spec, spec_from_config

LLAMA_CPP = "llama.cpp (XiongjieDai/GPU-Benchmarks-on-LLM-Inference, LLaMA 3 table, May 2024)"
TRT_LLM = "TensorRT-LLM docs/source/performance.md (v0.6.1 throughput, v0.5 first-token latency)"
GPT_FAST = "gpt-fast (pytorch-labs/gpt-fast README, Tensor Parallelism table, 8xA100-80GB at 330 W, Nov 2023)"
VLLM_CUSTOM_AR = "vLLM PR #2192 (custom all-reduce, benchmark_latency.py, Dec 2023)"
GOALS = {"decode": 0.20, "batched": 0.25, "prefill": 0.35, "tp decode": 0.35, "tp batched": 0.35}
RATES = ("tokens/s", "tokens/s per GPU")  # units where more is faster (the others are times: "ms", "s")
# Models the published rows ran that minillm/card/models/ does not ship: their config.json's fields.
# huggingface.co/meta-llama/Llama-2-70b-hf/blob/main/config.json: 68,976,648,192 parameters (its safetensors total).
CONFIGS = {"llama-2-70b": {"hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
                           "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 32000,
                           "max_position_embeddings": 4096, "model_type": "llama"}}  # fmt: skip


def spec_of(model: str):
    return spec_from_config(CONFIGS[model], model) if model in CONFIGS else load_spec(model)


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
    unit: str  # "tokens/s", "tokens/s per GPU" (a tensor-parallel run's total / tp), "ms" or "s"
    source: str
    label: str
    tp: int = 1  # cards the model is split over (tensor parallelism), joined by the card's own link
    # True: the figure times only the tokens generated after the prompt (llama-bench's "tg N @ d K" after K tokens of
    # context, llama-batched-bench's S_TG after its batch's prompts), not the prompt's own step
    after_prompt: bool = False


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
    rows += _tp_figures()
    return rows + moe_figures(Figure)


def _tp_figures() -> list[Figure]:
    """Published runs of one model split over several cards."""
    rows = []
    for gpu, dtype, table in (
        ("h100-sxm", "fp8", ((1024, 2, 128, 128, 2657), (480, 4, 128, 2048, 1486), (96, 2, 2048, 128, 306),
                             (64, 2, 2048, 2048, 547))),
        ("a100-80gb-sxm", "fp16", ((1280, 4, 128, 128, 670), (240, 4, 128, 2048, 525), (120, 4, 2048, 128, 79))),
    ):  # fmt: skip
        for batch, tp, prompt, reply, reported in table:
            label = f"TP {tp}, batch {batch}, {prompt} in, {reply} out"
            rows.append(Figure("tp batched", gpu, "llama-2-70b", dtype, dtype, batch, prompt, reply, reported,
                               "tokens/s per GPU", TRT_LLM, label, tp))  # fmt: skip
    rows.append(Figure("tp batched", "a100-80gb-sxm", "llama-2-70b", "fp16", "fp16", 64, 256, 256, 14.57, "s",
                       VLLM_CUSTOM_AR, "TP 4, batch 64, 256 in, 256 out: the batch's latency", 4))  # fmt: skip
    for model, speeds in (("llama-2-7b", ((2, 168.84), (4, 254.02), (8, 328.43))),
                          ("llama-2-70b", ((2, 21.32), (4, 38.01), (8, 62.50)))):  # fmt: skip
        for tp, reported in speeds:
            rows.append(Figure("tp decode", "a100-80gb-sxm", model, "bf16", "bf16", 1, 5, 200, reported, "tokens/s",
                               GPT_FAST, f"TP {tp}, batch 1, 5 in, 200 out", tp))  # fmt: skip
    return rows


FIGURES = _figures()
# One stream, 512 tokens from an empty context (about 256 cached on average): tests/test_roofline.py holds the bound
# against these, the lesson draws them.
PUBLISHED_SINGLE_STREAM = {f.gpu: f.reported for f in FIGURES if f.label == "tg 512" and f.model == "llama-3.1-8b"}


def simulate(f: Figure) -> dict:
    """The figure's run on the simulated card: `batch` requests all at once, fixed lengths, whole prompts in one
    step (token budget 0: a static batch's context phase), static batching as the benchmarks ran them."""
    from minillm.card.hardware import get_device
    from minillm.card.simulate import SimulatedRunner
    from minillm.runs.metrics import summarize
    from minillm.runs.run import run_workload
    from minillm.runs.workload import ChatKnobs

    runner = SimulatedRunner(spec_of(f.model), get_device(f.gpu), f.dtype, f.kv_dtype, tp=f.tp)
    # a request's reply is its planned tokens then EOS: `reply - 1` planned makes `reply` generated
    knobs = ChatKnobs(requests=f.batch, rate=1e9, prompt_len=f.prompt, reply_len=max(1, f.reply - 1))
    trace = run_workload(runner, "azure-conv", "static", slots=f.batch, knobs=knobs, token_budget=0)
    s = summarize(trace)
    prefill_s = sum(st.wall_s for st in trace.steps if st.prefill_tokens)
    return {
        "summary": s,
        "prefill_share": prefill_s / s["wall_s"],
        "preemptions": s["preemptions"],
        "decode_s": s["wall_s"] - prefill_s,
    }


def predict(f: Figure) -> tuple[float, dict]:
    """The prediction in the figure's own unit, and what the simulation saw."""
    run = simulate(f)
    s = run["summary"]
    if f.kind == "prefill":
        value = 1e3 * s["ttft_p50_s"] if f.unit == "ms" else f.prompt / s["ttft_p50_s"]
    elif f.unit == "s":
        value = s["wall_s"]
    elif f.after_prompt:  # each prompt's step made its first token: the rest came from the decode steps
        value = (s["output_tokens"] - f.batch) / run["decode_s"]
    else:
        value = s["output_tokens"] / s["wall_s"] / (f.tp if f.unit == "tokens/s per GPU" else 1)
    return value, run


def explain(f: Figure, predicted: float, run: dict) -> str:
    """One line: what bounds this run in the model, and what share of the card the published figure implies."""
    from minillm.card import roofline
    from minillm.card.enginecost import COMPUTE_EFFICIENCY, engine_step
    from minillm.card.hardware import DEVICES
    from minillm.card.tensor_parallel import link_of, rank_spec, tp_step

    spec, card = spec_of(f.model), DEVICES[f.gpu]
    faster = predicted > f.reported if f.unit in RATES else predicted < f.reported
    ratio = predicted / f.reported if f.unit in RATES else f.reported / predicted
    verdict = "" if abs(ratio - 1) < GOALS[f.kind] else f"; predicted {'faster' if faster else 'slower'}"
    if f.after_prompt and f.kind == "batched":
        return explain_streams(f, spec, predicted, verdict)
    if spec.experts:
        return explain_moe(f, spec, predicted, run, verdict)
    if f.kind.startswith("tp"):
        rank, link = rank_spec(spec, f.tp), link_of(card).name
        rows = [(1, f.prompt + f.reply // 2)] * f.batch  # a decode step half way through the replies
        step = tp_step(spec, card, rows, f.dtype, f.kv_dtype, f.tp)
        head = (f"TP {f.tp} over {link}: a decode step half way is {step.rank.time_s * 1e3:.1f} ms of one card's "
                f"share + {step.comm_s * 1e3:.2f} ms of {step.allreduces} all-reduces and a gather "
                f"({step.comm_share:.0%})")  # fmt: skip
        if f.kind == "tp decode":
            moved = roofline.weight_bytes(rank, f.dtype) + roofline.kv_bytes_per_token(rank, f.kv_dtype) * rows[0][1]
            share = moved * f.reported / card.bandwidth
            extra = 1 / f.reported - 1 / predicted  # seconds a token the model does not count
            more = f", and {extra * 1e3:.1f} ms a token more than the model counts" if faster and verdict else ""
            return (f"{head}; the published speed moves {share:.0%} of each card's datasheet bandwidth (the model "
                    f"assumes {card.efficiency:.0%} for its share of the step){more}{verdict}")  # fmt: skip
        full = f"; {run['preemptions']} preemptions (KV full)" if run["preemptions"] else ""
        why = f"{head}; {run['prefill_share']:.0%} of the predicted time is the batch's prefill{full}{verdict}"
        if faster and verdict:  # how many times the KV reads the model counts would fill the published time
            published_s = f.reported if f.unit == "s" else f.batch * f.reply / (f.reported * f.tp)
            passes = 1 + (published_s - run["summary"]["wall_s"]) / (f.reply * step.rank.attention_s)
            group = spec.heads // spec.kv_heads
            why += (f": the published time leaves room for {passes:.1f}x the KV reads the model counts ({f.model} "
                    f"shares each kv head among {group} query heads: a decode kernel that reads it once per query head "
                    f"reads {group}x)")  # fmt: skip
        return why
    if f.kind == "decode":
        context = f.prompt + f.reply // 2 if f.after_prompt else f.reply // 2
        step = engine_step(spec, card, [(1, context)], f.dtype, f.kv_dtype)
        moved = _one_token_weights(spec, f.dtype) + roofline.kv_bytes_per_token(spec, f.kv_dtype) * context
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
        + verdict
    )


def _one_token_weights(spec, dtype: str) -> float:
    """The weights one stream's step moves, as `explain` counts them: all of a dense model's; a mixture of experts'
    less the routed experts its token did not pick (model_bytes.touched_weight_bytes)."""
    from minillm.card import roofline
    from minillm.card.model_bytes import touched_weight_bytes

    untouched = roofline.streamed_weight_bytes(spec, dtype) - touched_weight_bytes(spec, dtype, 1)
    return roofline.weight_bytes(spec, dtype) - untouched


def bench_published(model, s) -> dict:
    rows = []
    for f in FIGURES:
        predicted, run = predict(f)
        error = predicted / f.reported - 1
        rows.append({"kind": f.kind, "gpu": f.gpu, "tp": f.tp, "model": f.model, "dtype": f.dtype,
                     "kv_dtype": f.kv_dtype, "batch": f.batch, "prompt": f.prompt, "reply": f.reply, "label": f.label,
                     "unit": f.unit,
                     "reported": f.reported, "predicted": predicted, "error": error, "source": f.source,
                     "goal": GOALS[f.kind], "met": abs(error) <= GOALS[f.kind],
                     "why": explain(f, predicted, run)})  # fmt: skip
    return {"rows": rows, "goals": GOALS, "met": all(r["met"] for r in rows)}


def main(argv: list[str] | None = None) -> None:
    """Print the published figures beside their predictions, as a markdown table (`--moe`: the mixtures of experts'
    rows alone, with the dense control measured beside them): bench --only roofline's table, without the rest."""
    import argparse

    parser = argparse.ArgumentParser(description="published figures against run --simulate's predictions")
    parser.add_argument("--moe", action="store_true", help="only the mixtures of experts' sources' rows")
    moe = parser.parse_args(argv).moe
    rows = [f for f in FIGURES if f.source in MOE_SOURCES or not moe]
    print("| kind | card | model | dtype (KV) | run | published | predicted | error | goal | why |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    met = 0
    for f in rows:
        predicted, run = predict(f)
        error = predicted / f.reported - 1
        within = abs(error) <= GOALS[f.kind]
        met += within
        print(f"| {f.kind} | {f.gpu} | {f.model} | {f.dtype} ({f.kv_dtype}) | {f.label} | {f.reported:,.1f} {f.unit} | "
              f"{predicted:,.1f} | {error:+.0%} | {GOALS[f.kind]:.0%}{'' if within else ' (missed)'} | "
              f"{explain(f, predicted, run)} |")  # fmt: skip
    print(f"\n{met} of {len(rows)} within their goals.")


if __name__ == "__main__":
    main()
