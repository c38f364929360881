"""The vLLM paper's experiment as its sources give it: what was published, how the evaluation ran, and how each system
it measured maps onto minillm's knobs.

The paper: Woosuk Kwon, Zhuohan Li, Siyuan Zhuang, Ying Sheng, Lianmin Zheng, Cody Hao Yu, Joseph E. Gonzalez, Hao
Zhang, Ion Stoica, "Efficient Memory Management for Large Language Model Serving with PagedAttention", SOSP 2023,
arXiv 2309.06180 (PAPER below). Its text was read in transcriptions of the arXiv version stored in the library (the
search tool's code corpus: the full text, and two independent tables of the numbers printed on Fig. 2, Fig. 13 and in
Table 1, which agree); the engine's defaults in vllm-project/vllm (CODE), vllm/engine/arg_utils.py as of v0.1 (2023).

Read in the paper:
- Abstract and §10: vLLM improves throughput "by 2-4x with the same level of latency" over FasterTransformer and Orca.
- §1, §3.1, Fig. 2 ("Average percentage of memory wastes ... during the experiment in §6.2"): "only 20.4% - 38.2% of
  the KV cache memory is used to store the actual token states in the existing systems". The bars print: Orca (Max)
  20.4 token states / 13.3 reservation / 57.3 internal fragmentation / 8.9 external fragmentation & others; Orca
  (Pow2) 26.8 / 17.9 / 13.6 / 41.6; Orca (Oracle) 38.2 / 25.2 / - / 36.6; vLLM 96.3 token states.
- §3.1: the waste is "reserved slots for future tokens, internal fragmentation due to over-provisioning for potential
  maximum sequence lengths, and external fragmentation from the memory allocator like the buddy allocator".
- §3: OPT-13B's KV is 800 KB a token; sequences up to 2048 tokens. Table 1: OPT-13B on one A100 (40 GB total, 26 GB
  of parameters, 12 GB for KV, "Max. # KV cache slots" 15.7K). §6.1: GCP A2 instances (A100 SXM4 40GB).
- §6.1 workloads: ShareGPT and Alpaca, their tokenized input and output lengths, Poisson arrivals at several rates,
  1-hour traces. Fig. 11's legend: ShareGPT input mean 161.31, output mean 337.99 tokens (the histograms are images).
- §6.1 baselines: FasterTransformer with "a custom scheduler with a dynamic batching mechanism similar to ... Triton":
  a maximum batch size B "as large as possible ... according to the GPU memory capacity", each batch the B earliest
  arrived requests. Orca, re-implemented, with "the buddy allocation algorithm" and three reservations: Oracle (the
  true output length), Pow2 ("over-reserves ... by at most 2x": an output of 25 reserves 32), Max (up to "the maximum
  sequence length of the model, i.e., 2048 tokens").
- §6.1 metric: "normalized latency ... the mean of every request's end-to-end latency divided by its output length".
- §6.2 (Fig. 12, curves in images): on ShareGPT "vLLM can sustain 1.7x-2.7x higher request rates compared to Orca
  (Oracle) and 2.7x-8x compared to Orca (Max), while maintaining similar latencies" (over OPT-13B, 66B and 175B);
  "Compared to FasterTransformer, vLLM can sustain up to 22x higher request rates". Fig. 13a (OPT-13B, ShareGPT,
  2 req/s), average batched requests printed on the bars: Orca (Max) 7.00, Pow2 9.81, Oracle 13.62, vLLM 30.42; the
  text: "2.2x more requests at the same time than Orca (Oracle) and 4.3x more requests than Orca (Max)".
- §7.2: vLLM's default block size is 16.
Read in the code (CODE): vLLM 0.1's EngineArgs: block_size 16, gpu_memory_utilization 0.90, max_num_batched_tokens
2560, max_num_seqs 256. Its benchmarks' ShareGPT sampling (benchmark_serving.py / benchmark_throughput.py,
sample_requests): the first two turns of a conversation, pruned when the prompt or the output is under 4 tokens, the
prompt over 1024, or both over 2048.

Assumptions (not said by the paper; each named in the report):
- ShareGPT's lengths: not shipped here (no data set can be fetched), so each request's input and output lengths are
  drawn from exponentials with Fig. 11's means, pruned as vLLM's benchmark prunes (the histograms are right-skewed
  with a long tail, as an exponential is; the drawn means are printed beside the paper's).
- The re-implemented Orca runs vLLM's own engine and scheduler (same step, same token budget); only its KV allocation
  differs. Its buddy allocator's smallest unit is a 16-token block, and its largest chunk 2048 tokens.
- "The same level of latency": the paper draws curves, not a threshold. A rate is sustained here while the normalized
  latency stays under LATENCY_SLO (the curves' knee: below it latency grows slowly, past it the queue grows without
  bound), checked on a sample of the trace (the report prints both).
- Fig. 2 is read at Fig. 13a's rate (2 req/s): the paper does not say its rate, and its 30.42 vLLM requests of about
  500 tokens each fill the 15.7K slots, as Fig. 2's 96.3% does.
"""

from __future__ import annotations

from dataclasses import dataclass

PAPER = "https://arxiv.org/abs/2309.06180"
CODE = "https://github.com/vllm-project/vllm"

MODEL_CONFIG = "opt-13b"  # minillm/card/models/opt-13b.json, with its source
GPU = "a100-40gb-sxm"  # GCP's A2 instances (§6.1): A100 SXM4 40GB
DTYPE = "fp16"  # §3: "2 (bytes per FP16)"

# ShareGPT as the paper's Fig. 11 states it, pruned as vLLM's benchmark does
MEAN_PROMPT, MEAN_OUTPUT = 161.31, 337.99
MIN_TOKENS, MAX_PROMPT, MAX_SEQUENCE = 4, 1024, 2048

BLOCK = 16  # vLLM's block size (§7.2; EngineArgs.block_size)
TOKEN_BUDGET = 2560  # vLLM 0.1's max_num_batched_tokens
MAX_SEQS = 256  # vLLM 0.1's max_num_seqs
PAPER_KV_SLOTS = 15_700  # Table 1: "Max. # KV cache slots 15.7K" (12 GB / 800 KB)

FIG13_RATE = 2.0  # req/s: Fig. 13a's rate, where Fig. 2 is read too (an assumption, above)
LATENCY_SLO = 0.1  # s/token: the knee's threshold (an assumption, above)
REQUESTS = 200  # requests in the sampled trace (the paper's: 1-hour traces, thousands of requests)

# The paper's figures
TOKEN_SHARE = {"orca-max": 20.4, "orca-pow2": 26.8, "orca-oracle": 38.2, "vllm": 96.3}  # Fig. 2, % token states
FIG2 = {  # Fig. 2's bars: token states, reservation, internal fragmentation, external fragmentation & others
    "orca-max": (20.4, 13.3, 57.3, 8.9),
    "orca-pow2": (26.8, 17.9, 13.6, 41.6),
    "orca-oracle": (38.2, 25.2, 0.0, 36.6),
    "vllm": (96.3, 0.0, 0.0, 3.7),
}
BATCHED = {"orca-max": 7.00, "orca-pow2": 9.81, "orca-oracle": 13.62, "vllm": 30.42}  # Fig. 13a, at 2 req/s
BATCH_RATIO = {"orca-oracle": 2.2, "orca-max": 4.3}  # §6.2: vLLM batches 2.2x / 4.3x more requests
RATE_RATIO = {"orca-oracle": (1.7, 2.7), "orca-max": (2.7, 8.0)}  # §6.2, ShareGPT, over the three OPT models
FT_UP_TO = 22.0  # §6.2: "up to 22x higher request rates" than FasterTransformer
ABSTRACT = (2.0, 4.0)  # "2-4x with the same level of latency"


@dataclass(frozen=True)
class System:
    """One system the paper measured, as minillm's knobs."""

    key: str
    label: str
    policy: str  # "static" (FasterTransformer's batches) or "continuous" (iteration-level)
    reserve: str  # KV per request: "max" (2048 tokens), "pow2", "oracle" (contiguous chunks), "paged" (blocks)
    how: str


SYSTEMS = {
    s.key: s
    for s in (
        System("ft", "FasterTransformer", "static", "max",
               "static policy: batches of the B earliest arrivals, each run to its longest reply; B = the rows of "
               "2048 tokens the KV memory holds"),
        System("orca-max", "Orca (Max)", "continuous", "max",
               "continuous policy (vLLM's scheduler); a buddy-allocated chunk of 2048 tokens per request"),
        System("orca-pow2", "Orca (Pow2)", "continuous", "pow2",
               "continuous policy; a buddy chunk for the prompt + the output length rounded up to a power of 2"),
        System("orca-oracle", "Orca (Oracle)", "continuous", "oracle",
               "continuous policy; a buddy chunk for the prompt + the true output length"),
        System("vllm", "vLLM", "continuous", "paged",
               "continuous policy; paged KV: 16-token blocks as tokens come, the newest preempted when out of blocks"),
    )
}  # fmt: skip
