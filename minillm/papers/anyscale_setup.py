"""The Anyscale post's experiment as its sources give it: what was published, how the benchmark ran, and how each
system it measured maps onto minillm's knobs.

The post: Cade Daniel, Chen Shen, Eric Liang, Richard Liaw, "How continuous batching enables 23x throughput in LLM
inference while reducing p50 latency", Anyscale blog, 22 June 2023 (POST below). Its benchmark code: the repository
anyscale/llm-continuous-batching-benchmarks (CODE below: benchmark_throughput.py, benchmark_configs/,
launch_scripts/, read at commit ce08a14), whose README says it "was used to produce" the post.

Read in the post's text:
- "a single NVIDIA A100 GPU ... Our A100 has 40GB of GPU RAM" (it links NVIDIA's A100 datasheet; SXM or PCIe is not
  said: the configs pin CUDA_VISIBLE_DEVICES up to 7, an 8-card server; both forms print the same 1,555 GB/s and
  312 dense TFLOPS, so the cost model's answer is the same); "Meta's OPT-13B"; no tensor parallelism.
- throughput: "1000 sequences each with 512 input tokens"; generation lengths "sampled from an exponential
  distribution with mean=128 tokens", keeping "only samples ... less than or equal to 32, 128, 512, and 1536"; the
  end-of-sequence token ignored; all requests submitted "in burst fashion".
- memory: "~14k tokens" of KV fit beside the 26 GB of weights, so "at most ~28 sequences" of 512 tokens and "7" of
  2048 (an upper bound, it says: no room left for activations).
- results: a table and a chart of multiples, both images (no values in the text). The text: naive static batching
  "plummets to 81 token/s" as the variance grows; FasterTransformer "nearly keeping up with the naive continuous
  batchers until generation length limit of 1536"; Ray Serve and TGI "about the same"; vLLM "more than doubles
  performance compared to naive continuous batching" for each dataset. The summary: "Up to 23x" (vLLM), "8x" (continuous
  batching, Ray Serve and TGI), "4x" (FasterTransformer) "throughput over naive batching".
  Which max length each multiple is at is not said; they are read here at 1536, where the text puts naive static at
  its lowest (81 token/s) and FasterTransformer falling behind continuous batching (4x against 8x).
- latency: 100 requests, prompts of 1-512 tokens, outputs capped exponential (mean 128, max 1536), Poisson arrivals at
  1 and 4 QPS; the medians are in an image; "vLLM becomes saturated around QPS=8 with a throughput near 1900 token/s".
  Not reproduced in this step (no latency figure is in the text).
Read in the code (CODE):
- `variable_response_lens_distribution capped_exponential`: draw round(Exp(mean 128)) until one is <= the cap (a
  truncated exponential, not a clipped one). Throughput = (prompt + generated tokens) / time to serve the crowd.
- naive (NaiveHfPipeline): batch sizes 16, 12, 8, 4 for max 32, 128, 512, 1536 (benchmark_configs/
  naive_hf_variable_size); launch_vanilla_hf runs `pipe(..., min_length=max_length, max_length=max_length)` with
  max_length the longest prompt + reply of the WHOLE crowd: every reply runs to the crowd's longest, and is credited
  with its own length.
- FasterTransformer: the same batch sizes (ft_variable_size); each batch runs to its own longest reply (output_len =
  max of the batch), its finished rows computed on; the model thread sleeps 1 s before each batch.
- TGI / Ray Serve: max_batch_total_tokens 8700, 7500, 8100, 8100; a request counts its prompt + max_new_tokens
  against it (Ray's QuotaBasedRequestSelectionPolicy, python/ray/serve/experimental/llm/policy.py and queue.py).
- vLLM: --max-num-batched-tokens 8700, 7500, 8100, 8100; launch_vllm sleeps 10 ms before each engine step. vLLM
  0.1's scheduler (vllm/core/scheduler.py, _schedule) counts the running sequences' decode tokens, adds waiting prompts
  while the total stays within max_num_batched_tokens and the blocks allocate, and runs both in one step; minillm's
  token budget does the same, except that it cuts the prompt that would overflow into a chunk where vLLM 0.1 waits.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from minillm.papers.anyscale_runner import Implementation

POST = "https://www.anyscale.com/blog/continuous-batching-llm-inference"
CODE = "https://github.com/anyscale/llm-continuous-batching-benchmarks"

MODEL_CONFIG = "opt-13b"  # minillm/card/models/opt-13b.json, with its source
GPU = "a100-40gb-sxm"
DTYPE = "fp16"  # the launchers load OPT-13B in torch.float16 (FasterTransformer: fp16 weights)
PROMPT_TOKENS = 512
MEAN_REPLY = 128
MAX_TOKENS = (32, 128, 512, 1536)
REQUESTS = 1000
HEADLINE_MAX = 1536  # where the headline multiples are read (see above)

# The benchmark's knobs per max length (CODE's benchmark_configs/*_variable_size)
STATIC_BATCH = {32: 16, 128: 12, 512: 8, 1536: 4}  # naive HF pipelines and FasterTransformer
BATCHED_TOKENS = {32: 8700, 128: 7500, 512: 8100, 1536: 8100}  # vLLM's max_num_batched_tokens (TGI's total too)

# The post's figures (POST)
PUBLISHED_OVER_NAIVE = {"vllm": 23.0, "continuous": 8.0, "ft": 4.0}  # "Up to 23x", "8x", "4x" throughput
NAIVE_TOKENS_S = 81.0  # naive static "plummets to 81 token/s" (at the highest variance)
VLLM_OVER_CONTINUOUS = 2.0  # vLLM "more than doubles performance compared to naive continuous batching"
# The post's back-of-the-envelope for OPT-13B on its A100 ("The basics of LLM inference"): "~14k tokens can be held in
# memory at once"; sequences of 512: "at most ~28 sequences in a batch"; of 2048: "limited to 7 sequences"
KV_TOKENS = 14_000
SEQUENCES_THAT_FIT = {512: 28, 2048: 7}


@dataclass(frozen=True)
class System:
    """One system the post measured, as minillm's knobs."""

    key: str
    label: str
    policy: str  # "static" or "continuous" (engine/scheduler.py)
    kv: str  # "contiguous": each seat reserves prompt + max tokens ahead; "paged": blocks as tokens come
    crowd_replies: bool  # every reply runs to the crowd's longest (naive HF's harness) and is credited its own
    vllm_budget: bool  # tokens per step capped at vLLM's max_num_batched_tokens; else whole prompts, no cap
    costs: Implementation  # what its own code and the harness add (anyscale_runner.py)
    how: str  # the mapping, said
    unpriced: str = ""  # what of this system's step the simulation cannot price (no source here measures it)
    quota: bool = False  # admitted by TGI's token quota (papers/quota.py), not into seats of max length

    def mechanism(self) -> System:
        """The batching mechanism alone: priced as a serving engine, no harness, every reply its own length."""
        return replace(self, crowd_replies=False, costs=Implementation())


HF_CODE = dict(kv_passes=3)  # transformers' OPT attention: torch.cat of the past KV every step (anyscale_runner.py)

SYSTEMS = {
    s.key: s
    for s in (
        System("naive", "naive static (HF pipelines)", "static", "contiguous", True, False,
               Implementation(**HF_CODE),
               "static policy; contiguous KV; the benchmark's batch (16/12/8/4 seats); whole prompts in one step; "
               "every reply runs to the crowd's longest (its harness), credited its own length; HF's OPT code",
               "the per-step time of Hugging Face's eager OPT forward beyond the bytes and FLOPs priced"),
        System("ft", "FasterTransformer (static)", "static", "contiguous", False, False,
               Implementation(pause_per_batch_s=1.0),
               "static policy; contiguous KV; the same batches; each batch runs to its longest reply, finished rows "
               "computed on (the batch keeps its shape); fused kernels (a serving engine's step); the harness's 1 s "
               "before each batch",
               "FasterTransformer's per-step time beyond the bytes and FLOPs priced"),
        System("continuous", "continuous, no paging (TGI, Ray)", "continuous", "contiguous", False, False,
               Implementation(padded=True, split_prefill=True, **HF_CODE),
               "continuous policy; contiguous KV: each seat reserves prompt + max tokens, seats = what the card's KV "
               "memory holds; whole prompts, run apart; HF's OPT code in TGI's padded batches",
               "the per-step time of Hugging Face's eager OPT forward in TGI's padded batches beyond the bytes and "
               "FLOPs priced"),
        System("vllm", "vLLM (continuous + paged)", "continuous", "paged", False, True,
               Implementation(pause_per_step_s=0.01),
               "continuous policy; paged KV (16-token blocks, 90% of memory); decode rows and prompts in one step, "
               "up to the benchmark's max_num_batched_tokens (vLLM 0.1's scheduler); the harness's 10 ms a step",
               "vLLM 0.1's per-step time beyond the bytes and FLOPs priced (its scheduler, sampler and launches)"),
    )
}  # fmt: skip
