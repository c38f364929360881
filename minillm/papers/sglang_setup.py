"""SGLang's RadixAttention experiment as its sources give it: what was published, the benchmarks' workloads, and how
SGLang's runtime of the time maps onto minillm's knobs.

The paper: Lianmin Zheng, Liangsheng Yin, Zhiqiang Xie, Chuyue Sun, Jeff Huang, Cody Hao Yu, Shiyi Cao, Christos
Kozyrakis, Ion Stoica, Joseph E. Gonzalez, Clark Barrett, Ying Sheng, "SGLang: Efficient Execution of Structured
Language Model Programs", NeurIPS 2024 (PAPER; arXiv 2312.07104v2). The PDF could not be fetched here: its text was
read in two independent transcriptions of it (one English, one annotated), which agree word for word on every figure
quoted below. Its figures' bars (Fig. 5, 8, 13) are images in both: no number in them could be read (report says so).

Read in the paper:
- 6.1: "We run most experiments on AWS EC2 G5 instances, which are equipped with NVIDIA A10G GPUs (24GB). We run 7B
  models on a single A10G"; "we use float16 precision"; models "dense Llama-2". Appendix C: "Fig. 5 and Fig. 6 are
  obtained by running Llama-7B on a single A10G (24GB) GPU"; "Fig. 8(c) is obtained by running Llama-7B on a single
  A10G". Throughput is "programs per second", with "a sufficiently large batch of program instances".
- 6.1 workloads: "5-shot MMLU"; "We decode one token for MMLU"; "Multi-turn chat with 4 turns, where the input of
  each turn is randomly sampled between 256-512 tokens. Multi-turn chat (short) means short output (4-8 tokens) and
  multi-turn chat (long) means long output (256-512 tokens)".
- 6.2: "On these benchmarks, the cache hit rate ranges from 50% to 99%. Fig. 13 (Appendix) lists the achieved and
  optimal cache hit rates for all of them, showing that our cache-aware scheduling approaches 96% of the optimal hit
  rate on average." Section 3: "We define the cache hit rate as number of cached prompt tokens / number of prompt
  tokens"; Theorem 3.1: the optimal rate is a depth-first visit of the requests' radix tree, with a cache at least
  the longest request. 6.2 also: multi-turn chat's speedup "is more noticeable for short outputs ... For long
  outputs ... there is almost no speedup".
- 6.3: Fig. 8(c) isolates the cache ("No Cache" against "Full optimizations") on Llama-7B / A10G, as bars only.
Read in the code (CODE; benchmark/ and python/sglang/srt/server_args.py of early 2024):
- benchmark/mmlu/bench_sglang.py: per subject, the prompt is "The following are multiple choice questions (with
  answers) about ..." + 5 dev examples (ntrain 5, cut while over 1536 tokens) + the test question; max_new_tokens 1;
  all subjects' questions in subject order; benchmark/mmlu/README.md runs `--nsub 10` (the first 10 subjects).
- benchmark/multi_turn_chat/bench_sglang.py, data_gen.py: --num-qa 20 conversations, --turns 4, each turn appends
  a prompt of random characters tokenized to 256-512 tokens and generates 4-8 tokens (--long: 256-512) with
  ignore_eos; the next turn's prompt is the whole conversation so far.
- test_utils.py add_common_sglang_args_and_parse: --parallel 64 (at most 64 programs in flight: a closed loop).
- server_args.py: mem_fraction_static 0.90 at tp 1; max_prefill_num_token's "real bound will be the maximum of this
  value and the model's maximum context length" (4096 for Llama-2); schedule_heuristic "lpm" (cache-aware).
"""

from __future__ import annotations

from dataclasses import dataclass

PAPER = "https://arxiv.org/abs/2312.07104 (NeurIPS 2024)"
CODE = "https://github.com/sgl-project/sglang"
MODEL = "llama-2-7b"  # the benchmarks serve meta-llama/Llama-2-7b-chat-hf: the same shapes (card/models/llama-2-7b)
GPU = "a10g"
DTYPE = "fp16"
MEM_FRACTION = 0.90  # server_args.py: mem_fraction_static at tp 1 (weights + KV pool)
PREFILL_TOKENS = 4096  # tokens a prefill step may hold: max(max_prefill_num_token=None, context length 4096)
PARALLEL = 64  # programs in flight (the benchmarks' --parallel)
ROOMY_GPU = "a100-80gb-sxm"  # for the account only: a KV pool that holds every chat in flight
BLOCK = 16  # minillm's (and vLLM's) KV block; SGLang's radix tree pages one token at a time
HIT_RANGE = (50.0, 99.0)  # percent: "the cache hit rate ranges from 50% to 99%" (6.2)
OF_OPTIMAL = 96.0  # percent: "approaches 96% of the optimal hit rate on average" (6.2, Fig. 13)

# MMLU lengths. No copy of the MMLU data is here, so the prompts' lengths come from EvalScope's statistics of the
# 5-shot MMLU prompts (evalscope.readthedocs.io/en/v1.6.0/benchmarks/mmlu.html, "Per-Subset Statistics", its first 10
# rows: the subjects in alphabetical order, as the benchmark sorts them; their sample counts match MMLU's test sets):
# (subject, questions, prompt characters mean, min, max).
MMLU_SUBJECTS = (
    ("abstract_algebra", 100, 1256.98, 1143, 1383),
    ("anatomy", 135, 1446.0, 1306, 1783),
    ("astronomy", 152, 2616.64, 2401, 3191),
    ("business_ethics", 100, 2756.36, 2492, 3145),
    ("clinical_knowledge", 265, 1680.76, 1510, 1995),
    ("college_biology", 144, 2104.53, 1874, 2641),
    ("college_chemistry", 100, 1800.19, 1641, 2239),
    ("college_computer_science", 100, 3424.74, 3129, 4137),
    ("college_mathematics", 100, 1972.77, 1776, 2230),
    ("college_medicine", 173, 2377.62, 2005, 6779),
)
CHARS_PER_TOKEN = 4.0  # ASSUMED: English text in Llama-2's tokenizer, about 4 characters a token
SHARED_SHARE = 5 / 6  # ASSUMED: the 5 shared examples are 5/6 of the mean prompt, the test question the sixth

# Multi-turn chat (benchmark/multi_turn_chat): conversations, turns, and each turn's lengths (inclusive ranges).
CHAT_CONVERSATIONS = 20
CHAT_TURNS = 4
CHAT_QUESTION = (256, 512)
CHAT_ANSWER = {"chat-short": (4, 8), "chat-long": (256, 512)}


@dataclass(frozen=True)
class Workload:
    key: str
    label: str
    programs: int  # the benchmark's default number of programs (MMLU: the first 10 subjects' questions)
    source: str


WORKLOADS = {
    w.key: w
    for w in (
        Workload("mmlu", "MMLU 5-shot (one token out)", sum(s[1] for s in MMLU_SUBJECTS),
                 "benchmark/mmlu/bench_sglang.py --nsub 10; lengths: EvalScope's MMLU statistics"),
        Workload("chat-short", "multi-turn chat, short (4 turns, 4-8 tokens out)", CHAT_CONVERSATIONS,
                 "benchmark/multi_turn_chat/bench_sglang.py"),
        Workload("chat-long", "multi-turn chat, long (4 turns, 256-512 tokens out)", CHAT_CONVERSATIONS,
                 "benchmark/multi_turn_chat/bench_sglang.py --long"),
    )
}  # fmt: skip

SYSTEMS = {
    "cache": "SGLang with RadixAttention: minillm's continuous scheduler with the waiting queue in longest-prefix-"
    "match order (sglang_lpm.py), its prefix cache on (full blocks shared; freed blocks keep their keys, the least "
    f"recently freed handed out first: LRU), prefill steps of at most {PREFILL_TOKENS} tokens",
    "fcfs": 'the same cache, first come first served (Fig. 8(c)\'s "FCFS Schedule")',
    "no-cache": 'the cache off, first come first served (Fig. 8(c)\'s "No Cache")',
}
