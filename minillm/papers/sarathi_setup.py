"""Sarathi-Serve's experiment as its sources give it: what was published, how the capacity was searched, and how the
two schedulers it compares map onto minillm's knobs.

The paper: Amey Agrawal, Nitin Kedia, Ashish Panwar, Jayashree Mohan, Nipun Kwatra, Bhargav S. Gulavani, Alexey
Tumanov, Ramachandran Ramjee, "Taming Throughput-Latency Tradeoff in LLM Inference with Sarathi-Serve", OSDI 2024
(PAPER; arXiv 2403.02310v3). The PDF itself could not be fetched here: its figures were read in two independent
transcriptions of it that cite its pages (the abstract, read on papers.cool and arxiv; Table 1-3, section 5.1 and
Figure 12 read in notes that quote the PDF page by page), and every one checked below against the code (CODE).

Read in the paper:
- abstract: "For Mistral-7B on single A100 GPUs, we achieve 2.6x higher serving capacity and up to 3.7x higher serving
  capacity for the Yi-34B model on two A100 GPUs as compared to vLLM" (pages 1, 3, 14).
- Table 1: Mistral-7B on one A100 80GB (Azure NC96ads v4). The precision is not said (assumed: bf16, the model's
  own torch_dtype; fp16 weighs the same).
- Table 2 (openchat_sharegpt4): prompt tokens median 1730, P90 5696, std 2088; output median 415, P90 834; requests
  whose prompt + output exceeds 8192 tokens are dropped. (arxiv_summarization: prompt 7059 / 12985 / 3638, output
  208 / 371 / 265, filtered at 16384.) Arrivals: Poisson.
- metrics (section 5): capacity is the highest load (queries per second) whose P99 time-between-tokens (TBT) meets
  the SLO, with the median scheduling delay at most 2 s (so that queues do not grow without bound).
- Table 3: the P99 TBT SLOs are 5x (strict) and 25x (relaxed) a decode step with 4K of context and a batch of 32:
  Mistral-7B 0.1 s strict, 0.5 s relaxed.
- section 5.1: token budgets 512 under the strict SLO and 2048 under the relaxed one (all models but LLaMA2-70B).
  Which SLO and trace the 2.6x is at is not said; read here at openchat_sharegpt4, strict, where the paper puts its
  largest gains (the same paper's Figure 12, Mistral-7B on openchat: "3.5x" over vLLM at 100 ms with budget 512
  against vLLM's best of three batch caps).
Read in the code (CODE, commit 96f9911 unless said):
- sarathi/benchmark/capacity_search: a bisection over QPS, P99 of decode_token_execution_plus_preemption_time (the
  time between a request's tokens) against --tbt-slo-value, P50 of request_scheduling_delay (arrival to first
  scheduled) against --scheduling-delay-slo-value 2.0; config.yml: 2048 requests per run, vLLM and Sarathi at
  batch_size (max_num_seqs) 128; config.py: vLLM's max_num_batched_tokens = the trace's max length (8192).
- sarathi/core/scheduler/vllm_scheduler.py: while prompts are waiting and fit (seats, blocks, max_num_batched_tokens),
  a step runs only whole prompts; the running requests decode only in steps with no prompt (sarathi_vllm.py).
- sarathi/core/scheduler/sarathi_scheduler.py: decodes first, then running prefills' next chunks, then new requests'
  chunks, all within chunk_size tokens a step: minillm's ContinuousScheduler with that token budget.
- data/processed_traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv (commit 72339db): 30,731 requests whose
  prompt median 1730 and P90 5696, output median 415 and P90 834, match Table 2: the trace the paper drew from.
  Its output std is 266, not Table 2's 101. Prompt and output lengths correlate at 0.04 (Pearson; 0.05 Spearman):
  drawn apart here, each from its quantiles below.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

PAPER = "https://arxiv.org/abs/2403.02310 (OSDI 2024, https://www.usenix.org/conference/osdi24/presentation/agrawal)"
CODE = "https://github.com/microsoft/sarathi-serve"
TRACE_FILE = f"{CODE}/blob/72339db/data/processed_traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv"

MAX_SEATS = 128  # config.yml: batch_size 128 for vLLM and Sarathi-Serve alike
SCHEDULING_DELAY_S = 2.0  # median scheduling delay bound (section 5; capacity_search/main.py's default)
TBT_QUANTILE = 99
REQUESTS = 2048  # config.yml's num_requests: the paper's crowd per run (the default run samples fewer: see sarathi.py)
QUANTILES = tuple(range(0, 101, 5))  # the trace tables below: the 0th, 5th, ... 100th percentile


@dataclass(frozen=True)
class Trace:
    """A trace's lengths: its prompt and output quantiles (QUANTILES), the cap on prompt + output, Table 2's figures."""

    key: str
    prompt_quantiles: tuple[int, ...]
    output_quantiles: tuple[int, ...]
    max_total: int
    published: dict  # Table 2: {"prompt": (median, P90), "output": (median, P90)}
    source: str


def lognormal_quantiles(median: float, p90: float, top: int) -> tuple[int, ...]:
    """Where no trace file was found: the lognormal through Table 2's median and P90 (an assumption), read at
    QUANTILES (the 0th and 100th at the 0.1st and 99.9th), cut to 1..`top`."""
    unit = NormalDist()
    sigma = math.log(p90 / median) / unit.inv_cdf(0.9)
    at = [min(max(q / 100, 0.001), 0.999) for q in QUANTILES]
    return tuple(max(1, min(top, round(median * math.exp(sigma * unit.inv_cdf(p))))) for p in at)


TRACES = {
    t.key: t
    for t in (
        Trace("openchat_sharegpt4",
              (1, 29, 74, 180, 382, 580, 777, 973, 1203, 1457, 1730, 2060, 2401, 2799, 3235, 3734, 4278, 4918, 5696,
               6563, 8141),
              (2, 44, 84, 130, 181, 228, 271, 312, 346, 381, 415, 453, 493, 534, 581, 628, 683, 754, 834, 920, 1024),
              8192, {"prompt": (1730, 5696), "output": (415, 834)},
              f"quantiles of {TRACE_FILE}"),
        Trace("arxiv_summarization", lognormal_quantiles(7059, 12985, 16383), lognormal_quantiles(208, 371, 16383),
              16384, {"prompt": (7059, 12985), "output": (208, 371)},
              "lognormals through Table 2's median and P90 (no trace file of it, filtered at 16384, was found)"),
    )
}  # fmt: skip


@dataclass(frozen=True)
class Deployment:
    """A model on its cards, and its SLOs (Table 1, Table 3) and budgets (section 5.1)."""

    model: str  # minillm/card/models/NAME.json
    gpu: str
    tp: int
    dtype: str
    slo_s: dict  # "strict"/"relaxed" -> P99 TBT, seconds
    budget: dict  # "strict"/"relaxed" -> Sarathi-Serve's token budget


DEPLOYMENTS = {
    "mistral-7b": Deployment("mistral-7b", "a100-80gb-sxm", 1, "bf16", {"strict": 0.1, "relaxed": 0.5},
                             {"strict": 512, "relaxed": 2048}),
}  # fmt: skip


@dataclass(frozen=True)
class StepOverhead:
    """The host's time around each forward, measured: fixed + per_row x the step's sequences."""

    fixed_s: float
    per_row_s: float
    source: str

    def seconds(self, rows: int) -> float:
        return self.fixed_s + self.per_row_s * rows


# Vidur (Agrawal et al., MLSys 2024; the simulator the paper tuned its budgets with, section 4.3) measured the CPU
# time of each step of the same vLLM-derived engine on an A100: github.com/microsoft/vidur
# data/profiling/a100/cpu_overheads.csv (commit 0633efa), Llama-2-7b-hf at TP 1 (Mistral-7B is not profiled there;
# the same width and depth is assumed to cost the same). Schedule + sampler + prepare inputs + process model outputs
# (the E2E means, ms): 2.98337 at batch 8, 12.55833 at batch 64; the line through them (beyond 64: extrapolated).
HOST_OVERHEAD = StepOverhead(
    fixed_s=1.61551e-3,
    per_row_s=0.170982e-3,
    source="github.com/microsoft/vidur data/profiling/a100/cpu_overheads.csv (Llama-2-7b, TP1)",
)

SYSTEMS = {
    "vllm": "vLLM (prefill-prioritizing): a step runs only whole prompts while any wait and fit (up to "
    "max_num_batched_tokens = 8192, 128 seats); the running requests decode in steps with no prompt",
    "sarathi": "Sarathi-Serve (stall-free): every step decodes the running requests first, then chunks of prompts "
    "in arrival order, all within the token budget (minillm's continuous scheduler with that budget)",
}


@dataclass(frozen=True)
class Published:
    """One capacity multiple the paper states."""

    model: str
    trace: str
    slo: str
    multiple: float
    where: str


PUBLISHED = (Published("mistral-7b", "openchat_sharegpt4", "strict", 2.6, f"{PAPER} (abstract)"),)
