"""DistServe's experiment as its sources give it: what was published, the placements, the SLOs, each engine's knobs.

The paper: Yinmin Zhong, Shengyu Liu, Junda Chen, Jianbo Hu, Yibo Zhu, Xuanzhe Liu, Xin Jin, Hao Zhang, "DistServe:
Disaggregating Prefill and Decoding for Goodput-optimized Large Language Model Serving", OSDI 2024 (PAPER, arXiv
2401.09670v3). Read in a transcription of the arXiv HTML (its tables and figures are images there), every table value
checked against a second transcription and the artifact's own scripts (CODE, commit 82831f1):
- abstract: "DistServe can serve 7.4x more requests or 12.6x tighter SLO, compared to state-of-the-art systems, while
  staying within latency constraints for > 90% of requests". Section 6.2 says against what: the 7.4x is over
  DeepSpeed-MII (chatbot, "1.6x-7.4x"); over vLLM the chatbot gains are "2.0x-4.6x" (OPT-13B/66B/175B, Figure 8),
  code completion "5.7x higher request rate and 1.4x more stringent SLO", summarization "4.3x higher request rate and
  12.6x more stringent SLO" (OPT-66B, Figure 9). Which model holds which end of 2.0x-4.6x is only in Figure 8's plot.
- section 1, Figure 1: "a 13B LLM" (OPT-13B, the paper's family), input 512 and output 64 tokens, one A100 80GB,
  vLLM: "about 1.6 requests per second", prefill alone "5.6 rps", decoding alone "10 rps"; "2 GPUs for prefill and 1
  GPU for decoding ... 10 rps, or equally 3.3 rps per GPU, which is 2.1x higher". Its SLO lines are in the image only:
  P90 TTFT 0.4 s and P90 TPOT 0.04 s as AI Systems Performance Engineering (O'Reilly, ch. 17, Figure 17-2) reads the
  same figure from the authors' blog (an assumption: one reading, not the paper's text).
- section 6.1: 4 nodes of 8 SXM A100-80GB on NVLink, 25 Gbps across nodes; FP16; Poisson arrivals; vLLM at intra-op
  1, 4, 8 for OPT-13B, 66B, 175B; SLO attainment target 90%. Table 1 (image; both transcriptions agree): chatbot
  OPT-13B TTFT 0.25 s / TPOT 0.1 s, OPT-66B 2.5 / 0.15, OPT-175B 4.0 / 0.2; code completion OPT-66B 0.125 / 0.2;
  summarization OPT-66B 15 / 0.15.
- section 4.3: FCFS; arrivals to the prefill instance with the shortest queue, then the least loaded decoding
  instance; KV over NVLink inside a node (placement Algorithm 2), "pulled" by the decoding instance.
Read in the code (CODE):
- evaluation/2-benchmark-serving/2-start-api-server.py: placements (context TP, PP, decoding TP, PP): OPT-13B
  (2, 1, 1, 1), OPT-66B (4, 1, 2, 2), OPT-175B (3, 3, 4, 3); vLLM TP 1 / 4 / 8, --max-num-batched-tokens 16384,
  --max-num-seqs 1024, --block-size 16, --gpu-memory-utilization 0.95; DistServe context max batch 128 and 8192
  tokens a batch, decoding max batch 1024, the same block size and memory share.
- evaluation/ae-scripts/e2e/*-client.sh and _plot.py: 100 prompts per GPU at each per-GPU rate for OPT-13B (vLLM
  100 prompts, DistServe 300 on its 3 GPUs); goodput: the per-GPU rate where the share of requests meeting both TTFT
  and TPOT crosses 90% (TPOT: (last token - first token) / (tokens - 1)). The plot script's OPT-66B chatbot SLOs are
  0.4 s / 0.1 s, not Table 1's 2.5 / 0.15: the paper's table is used here.
- evaluation/2-benchmark-serving/0-prepare-dataset.py: ShareGPT conversations of 3 turns or more, the prompt a random
  number of leading turns joined, the reply the next turn, OPT tokenizer, pairs with prompt + output >= 2048 dropped.
  The prepared data set is not published (nor Figure 7's numbers): see distserve_trace.py for the assumption.
"""

from __future__ import annotations

from dataclasses import dataclass

PAPER = (
    "https://arxiv.org/abs/2401.09670 (OSDI 2024, https://www.usenix.org/conference/osdi24/presentation/zhong-yinmin)"
)
CODE = "https://github.com/LLMServe/DistServe"
COMMIT = "82831f1604cc6b10bebd360f6c437a07790dde9f"
GPU = "a100-80gb-sxm"
DTYPE = "fp16"  # section 6.1
LINK = "nvlink-3"  # Algorithm 2 keeps a prefill and its decoding instance in one node: the KV crosses NVLink
ATTAINMENT = 0.90  # the share of requests meeting both SLOs (section 6.1)
MEMORY_SHARE = 0.95  # --gpu-memory-utilization of both systems
BLOCK = 16
MAX_LEN = 2048  # OPT's max_position_embeddings: the data sets are cut to it
REQUESTS_PER_GPU = 100  # the artifact's OPT-13B runs: 100 prompts per GPU at each rate


@dataclass(frozen=True)
class Engine:
    """One engine's knobs (2-start-api-server.py)."""

    seats: int  # max batch size (requests at once)
    batch_tokens: int  # tokens a prompt batch may hold


VLLM = Engine(seats=1024, batch_tokens=16384)  # --max-num-seqs, --max-num-batched-tokens
CONTEXT = Engine(seats=128, batch_tokens=8192)  # --context-max-batch-size, --context-max-tokens-per-batch
DECODING = Engine(seats=1024, batch_tokens=65536)  # --decoding-max-batch-size, --decoding-max-tokens-per-batch


@dataclass(frozen=True)
class Placement:
    """One instance pair: the prefill and the decoding instance's parallelism, how many of each."""

    prefill_tp: int
    decode_tp: int
    prefill: int = 1  # prefill instances
    decode: int = 1  # decoding instances

    @property
    def gpus(self) -> int:
        return self.prefill * self.prefill_tp + self.decode * self.decode_tp

    @property
    def name(self) -> str:
        return f"{self.prefill}P(TP{self.prefill_tp}) + {self.decode}D(TP{self.decode_tp})"


@dataclass(frozen=True)
class App:
    """An application of Table 1: its model, data set, SLOs, and each system's cards."""

    key: str
    model: str  # minillm/card/models/NAME.json
    trace: str  # distserve_trace.TRACES
    ttft_s: float
    tpot_s: float
    vllm_tp: int
    placement: Placement
    quantile: float | None = None  # None: both SLOs per request (section 6); 90: P90 of each (Figure 1)


APPS = {
    a.key: a
    for a in (
        App("chatbot-13b", "opt-13b", "sharegpt", 0.25, 0.1, 1, Placement(2, 1)),
        App("figure-1", "opt-13b", "fixed-512-64", 0.4, 0.04, 1, Placement(1, 1, prefill=2), quantile=90),
    )
}


@dataclass(frozen=True)
class Published:
    """One figure the paper states, and where it is read."""

    app: str  # APPS key
    figure: str  # what the run measures it by: "distserve/vllm" (per-GPU ratio), or a system's per-GPU goodput
    what: str
    value: float
    unit: str  # "x" or "req/s"
    where: str
    at_least: bool = False


PUBLISHED = (
    Published("chatbot-13b", "distserve/vllm", "DistServe over vLLM, chatbot per-GPU goodput (paper: 2.0x-4.6x over "
              "OPT-13B/66B/175B, each at least 2.0x)", 2.0, "x", "section 6.2, Figure 8", at_least=True),
    Published("figure-1", "vllm", "vLLM goodput, one GPU (1.6 req/s)", 96, "req/min", "section 1, Figure 1"),
    Published("figure-1", "prefill", "prefill alone, per-GPU goodput (5.6 req/s)", 336, "req/min",
              "section 1, Figure 1"),
    Published("figure-1", "decode", "decoding alone, per-GPU goodput (10 req/s)", 600, "req/min",
              "section 1, Figure 1"),
    Published("figure-1", "distserve/vllm", "2 prefill GPUs + 1 decoding GPU over vLLM, per GPU", 2.1, "x",
              "section 1, Figure 1"),
)  # fmt: skip
CHATBOT_RANGE = (2.0, 4.6)  # section 6.2: DistServe over vLLM, chatbot, OPT-13B/66B/175B
# Stated but not run here (each needs OPT-66B or OPT-175B, pipeline parallelism and a data set not published):
NOT_RUN = (
    ("up to 7.4x more requests (over DeepSpeed-MII, chatbot)", "abstract, section 6.2",
     "DeepSpeed-MII's chunked prefill on OPT-66B/175B; `papers sarathi` runs chunked prefill against vLLM"),
    ("12.6x tighter SLO, 4.3x rate (summarization, OPT-66B on LongBench)", "abstract, section 6.2, Figure 9",
     "OPT-66B with decoding TP2 x PP2; LongBench's reply lengths are not published"),
    ("5.7x rate, 1.4x tighter SLO (code completion, OPT-66B on HumanEval)", "section 6.2, Figure 9",
     "OPT-66B with decoding TP2 x PP2; HumanEval's lengths under the OPT tokenizer are not published"),
    ("1.8x-3.2x tighter SLO than vLLM (chatbot)", "section 6.2, Figure 8", "the per-model split is in the plot only; "
     "--slo-scale runs any point of that sweep"),
)  # fmt: skip
