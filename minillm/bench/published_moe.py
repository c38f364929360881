"""Mixtures of experts on real cards, against published measurements (issue 44): the rows published.py adds to its
table, and the line that says why each lands where it does.

Sources (each row names its own):
- TRT_LLM_V09: github.com/NVIDIA/TensorRT-LLM, docs/source/performance.md as released with v0.9.0 ("All data was
  generated using version 0.9.0"), "Peak Throughput" tables: a static batch of `batch` prompts of the input length,
  each generating the output length (gptSessionBenchmark, as the v0.6.1 rows published.py already holds; the doc's
  build commands turn paged KV off, though Mixtral's own are not listed), "Throughput (out tok/s/GPU)". Mixtral 8x7B
  at TP 2 on H200 SXM and H100 SXM (FP8 weights and KV cache, the tables' "(FP8)") and on A100 (FP16; the 80 GB
  card: 93 GB of fp16 weights need two). TensorRT-LLM splits an MoE's
  experts by tensor parallelism unless told otherwise (docs/source/advanced/expert-parallelism.md: "Tensor Parallel
  (default pattern)"), which is how tensor_parallel.py prices it.
- LLAMA_CPP_MOE: github.com/ggml-org/llama.cpp, PR #16834 "CUDA: use fastdiv in set-rows" (Oct 2025), its table's
  "t/s master" column: llama-bench on an NVIDIA GeForce RTX 4090, batch 1, tg N (N tokens generated one at a time from
  an empty context), f16 KV cache (llama-bench's default). gpt-oss 20B MXFP4 MoE: ggml-org's GGUF (MXFP4 experts, the
  rest Q8_0: the "mxfp4-q8" layout of model_bytes.py); qwen3moe 30B.A3B Q4_0 (4.5 bits a weight, lm_head Q6_K): priced
  as int4 (4.125 bits, lm_head bf16), which counts 13% more bytes a token than the file holds: a faithful price would
  predict that much faster still.

- LLAMA_CPP_SPARK: github.com/ggml-org/llama.cpp, benches/dgx-spark.md (build 2f68ce7cf (6918), Nov 2025; the data of
  discussion #16578): an NVIDIA DGX Spark, flash attention on, f16 KV cache (the default). llama-bench "tg32 @ d K":
  32 tokens generated one at a time after K tokens of context, timed without the context's fill; llama-batched-bench
  "S_TG" (PP 512, TG 32, B): B streams, each after its own 512-token prompt, generating 32 tokens together, timed
  without the prompts. ggml-org's GGUFs: gpt-oss-20b and -120b in the mxfp4-q8 layout (model_bytes.py: 11.25 and
  58.91 GiB against the listed 11.27 and 59.02), Qwen3-Coder-30B-A3B-Instruct in Q8_0 (Qwen3-30B-A3B's shapes: 30.25
  GiB listed, 30.21 here) and, as the same card's dense control, Qwen2.5-Coder-7B in Q8_0 (Qwen2.5-7B's shapes; 7.54 GiB
  both).

Not found with stated conditions and a priceable split: DeepSeek-V3/R1 (latent attention) figures, all on 8 cards
with expert parallelism, data-parallel attention or multi-token prediction (TensorRT-LLM's DeepSeek-R1 guide on H200:
--ep 8 and attention DP for throughput, MTP at batch 1), none of which the cost model prices.
"""

from __future__ import annotations

TRT_LLM_V09 = "TensorRT-LLM docs/source/performance.md (v0.9.0 static-batch throughput)"
LLAMA_CPP_MOE = "llama.cpp PR #16834 (llama-bench, RTX 4090, Oct 2025)"
LLAMA_CPP_SPARK = "llama.cpp benches/dgx-spark.md (llama-bench, llama-batched-bench, DGX Spark, Nov 2025)"
MOE_SOURCES = (TRT_LLM_V09, LLAMA_CPP_MOE, LLAMA_CPP_SPARK)
# model: its file's layout, tg32 tokens/s at each depth, S_TG tokens/s for each batch of streams (PP 512)
SPARK = {
    "gpt-oss-20b": ("mxfp4-q8", {0: 84.10, 4096: 77.36, 8192: 74.00, 16384: 68.85, 32768: 59.85},
                    {1: 81.11, 2: 95.00, 4: 151.90, 8: 254.09, 16: 400.94, 32: 614.82}),
    "gpt-oss-120b": ("mxfp4-q8", {0: 59.02, 4096: 53.95, 8192: 51.85, 16384: 48.03, 32768: 41.35},
                     {1: 57.28, 2: 60.35, 4: 95.08, 8: 146.65, 16: 220.02, 32: 312.56}),
    "qwen3-30b-a3b": ("q8_0", {0: 60.92, 4096: 53.52, 8192: 48.58, 16384: 40.81, 32768: 30.80},
                      {1: 57.63, 2: 64.11, 4: 102.01, 8: 154.91, 16: 232.98, 32: 345.01}),
    "qwen2.5-7b": ("q8_0", {0: 29.30, 4096: 28.27, 8192: 27.42, 16384: 25.93, 32768: 22.70},
                   {1: 29.24, 2: 54.46, 4: 104.33, 8: 195.67, 16: 335.01, 32: 593.27}),
}  # fmt: skip


def moe_figures(figure) -> list:
    """The published MoE rows, as `figure` (published.Figure) rows."""
    rows = []
    for gpu, dtype, table in (
        ("h200", "fp8", ((1024, 128, 128, 5444), (256, 128, 2048, 4973), (64, 2048, 128, 605), (64, 2048, 2048, 1821))),
        ("h100-sxm", "fp8", ((512, 128, 128, 5255), (128, 128, 2048, 3408), (64, 2048, 128, 588),
                             (32, 2048, 2048, 1317))),
        ("a100-80gb-sxm", "fp16", ((512, 128, 128, 2842), (128, 128, 2048, 1724), (64, 2048, 128, 319),
                                   (32, 2048, 2048, 801))),
    ):  # fmt: skip
        for batch, prompt, reply, reported in table:
            label = f"TP 2, batch {batch}, {prompt} in, {reply} out"
            rows.append(figure("tp batched", gpu, "mixtral-8x7b", dtype, dtype, batch, prompt, reply, reported,
                               "tokens/s per GPU", TRT_LLM_V09, label, 2))  # fmt: skip
    for model, dtype, speeds in (("gpt-oss-20b", "mxfp4-q8", ((128, 186.10), (256, 184.63), (512, 183.95))),
                                 ("qwen3-30b-a3b", "int4", ((128, 161.55), (256, 162.39), (512, 159.14)))):  # fmt: skip
        for n, reported in speeds:
            rows.append(figure("decode", "rtx-4090", model, dtype, "fp16", 1, 1, n, reported, "tokens/s",
                               LLAMA_CPP_MOE, f"tg {n}"))  # fmt: skip
    return rows + spark_figures(figure)


def spark_figures(figure) -> list:
    """The DGX Spark's rows: one stream at each depth, then batches of streams (33 planned: the prompt's step makes
    the first token, 32 more are timed)."""
    rows = []
    for model, (dtype, depths, batches) in SPARK.items():
        for depth, reported in depths.items():
            rows.append(figure("decode", "dgx-spark", model, dtype, "fp16", 1, max(depth, 1), 33, reported, "tokens/s",
                               LLAMA_CPP_SPARK, f"tg32 @ d{depth}", after_prompt=True))  # fmt: skip
        for batch, reported in batches.items():
            kind = "decode" if batch == 1 else "batched"
            rows.append(figure(kind, "dgx-spark", model, dtype, "fp16", batch, 512, 33, reported, "tokens/s",
                               LLAMA_CPP_SPARK, f"B {batch}, PP 512, TG 32 (S_TG)", after_prompt=True))  # fmt: skip
    return rows


def explain_moe(f, spec, predicted: float, run: dict, verdict: str) -> str:
    """One line for an MoE row: what one stream's token moves and the time the published speed leaves beyond it
    (decode); or what each card moves and computes over the whole run, as shares of its datasheet peaks at the
    published time (tensor-parallel batches)."""
    from minillm.card import roofline
    from minillm.card.enginecost import COMPUTE_EFFICIENCY, engine_step
    from minillm.card.hardware import DEVICES
    from minillm.card.model_bytes import touched_weight_bytes
    from minillm.card.tensor_parallel import link_of, rank_spec

    card = DEVICES[f.gpu]
    if f.kind == "decode":
        context = f.prompt + f.reply // 2 if f.after_prompt else f.reply // 2
        step = engine_step(spec, card, [(1, context)], f.dtype, f.kv_dtype)
        # what a step streams: the experts one token picked and the rest, less the embedding table (looked up)
        moved = touched_weight_bytes(spec, f.dtype, 1) + roofline.kv_bytes_per_token(spec, f.kv_dtype) * context
        share = moved * f.reported / card.bandwidth
        extra = 1 / f.reported - step.time_s  # seconds a token the model does not count
        launches = extra / card.launch_s
        return (f"memory-bound ({step.time_s * 1e3:.1f} ms a token: {moved / 1e9:.2f} GB, the {spec.experts_per_token} "
                f"of {spec.experts} experts its token picked in each of {spec.moe_layers} layers and the rest): the "
                f"published speed moves {share:.0%} of the datasheet bandwidth, the model assumes "
                f"{card.efficiency:.0%}; its token takes {extra * 1e3:.1f} ms more, {launches:,.0f} kernel launches' "
                f"worth at {card.launch_s * 1e6:.0f} us ({launches / spec.layers:.0f} a layer on top of the "
                f"{roofline.SERVING_ENGINE.per_layer} the model counts){verdict}")  # fmt: skip
    rank, dtype = rank_spec(spec, f.tp), roofline.compute_dtype(f.dtype, card)
    prefill = roofline.step_cost(rank, card, [(f.prompt, 0)] * f.batch, f.dtype, f.kv_dtype)
    middle = roofline.step_cost(rank, card, [(1, f.prompt + f.reply // 2)] * f.batch, f.dtype, f.kv_dtype)
    moved = sum((s.weight_bytes + s.kv_read_bytes + s.kv_write_bytes + s.activation_bytes) * n
                for s, n in ((prefill, 1), (middle, f.reply - 1)))  # fmt: skip
    flops = prefill.flops + (f.reply - 1) * middle.flops
    published_s = f.batch * f.reply / (f.reported * f.tp)
    bandwidth, compute = moved / published_s / card.bandwidth, flops / published_s / card.peak_flops(dtype)
    why = (f"TP {f.tp} over {link_of(card).name}: each card moves {moved / 1e12:.1f} TB and computes "
           f"{flops / 1e15:.1f} PFLOP in the run, in the published time {bandwidth:.0%} of its datasheet bandwidth and "
           f"{compute:.0%} of dense {dtype} peak (the model: {card.efficiency:.0%} and "
           f"{COMPUTE_EFFICIENCY[dtype]:.0%} for the kernels each bounds); {run['prefill_share']:.0%} of the predicted "
           "time is the batch's prefill")  # fmt: skip
    if bandwidth > 1:
        per_gpu = f.reported / f.tp  # the figure read as both cards' total
        why += (
            f"; more bandwidth than the card has: no run reaches the figure per GPU, as its column says; read as "
            f"both cards' total it is {per_gpu:.0f} per GPU, {per_gpu / predicted - 1:+.0%} from the prediction"
        )
    return why + verdict


def explain_streams(f, spec, predicted: float, verdict: str) -> str:
    """One line for streams decoding together after their prompts (llama-batched-bench's S_TG): what a step of them
    moves and the share of the bandwidth the published speed implies; for a mixture of experts, the experts a layer
    random routing touches against those the published step time leaves room to stream."""
    from minillm.card import roofline
    from minillm.card.experts import expected_experts, expert_slot_bytes
    from minillm.card.hardware import DEVICES
    from minillm.card.model_bytes import expert_weight_bytes

    card = DEVICES[f.gpu]
    step = roofline.step_cost(spec, card, [(1, f.prompt + f.reply // 2)] * f.batch, f.dtype, f.kv_dtype)
    moved = step.weight_bytes + step.kv_read_bytes + step.kv_write_bytes + step.activation_bytes
    published_s = f.batch / f.reported  # one step of the batch: one token for each stream
    why = (f"a step of {f.batch} streams moves {moved / 1e9:.2f} GB ({step.bound}-bound, {step.time_s * 1e3:.1f} ms): "
           f"the published speed moves it at {moved / published_s / card.bandwidth:.0%} of the datasheet bandwidth, "
           f"the model assumes {card.efficiency:.0%}")  # fmt: skip
    if not spec.experts:
        return why + verdict
    touched = expected_experts(spec.experts, spec.experts_per_token, f.batch)
    slot = expert_slot_bytes(spec, expert_weight_bytes(f.dtype), 2)  # one expert, every MoE layer
    rest = moved - touched * slot  # everything but the routed experts
    room = (published_s * card.bandwidth * card.efficiency - rest) / slot  # experts a layer the published time streams
    reading = (
        "about what random routing touches" if abs(room / touched - 1) < 0.1
        else "fewer than random routing touches: the router sends these tokens to a smaller set" if room < touched
        else "more than random routing touches: kernel time the model does not count"
    )  # fmt: skip
    return (f"{why}; random routing touches {touched:.1f} of the {spec.experts} experts a layer (E(1 - (1 - k/E)^B), "
            f"k = {spec.experts_per_token}), the published step time streams {room:.1f} at the model's share of the "
            f"bandwidth: {reading}{verdict}")  # fmt: skip
