"""Orca's experiment as its paper gives it: what was published, the trace, and how the two schedulers it compares
map onto minillm's knobs.

The paper: Gyeong-In Yu, Joo Seong Jeong, Geon-Woo Kim, Soojeong Kim, Byung-Gon Chun, "Orca: A Distributed Serving
System for Transformer-Based Generative Models", OSDI 2022, pp. 521-538 (PAPER). The PDF could not be fetched here:
section 6 was read in a transcription of it that quotes its text whole (the evaluation, Table 1, the figure
captions), checked against two independent notes that cite its pages (PDF p11-13).

Read in the paper:
- section 6: Azure ND96asr A100 v4 VMs, 8 NVIDIA 40-GB A100s each over NVLink; fp16 parameters and activations;
  maximum sequence length 2048.
- Table 1: 13B (40 layers, hidden 5120) on 1 GPU; 101B (80, 10240) on 1 x 8; 175B (96, 12288) on 2 inter-layer
  (pipeline) x 8 intra-layer (tensor) partitions, 16 GPUs, a VM per pipeline stage; 341B (120, 15360) on 4 x 8.
- the trace (section 6, 6.2): input tokens ~ U(32, 512) and max_gen_tokens ~ U(1, 128), both inclusive; no request
  emits EOS (each generates exactly max_gen_tokens); arrivals Poisson, the rate varied.
- the metric (Figure 10): the median over requests of end-to-end latency / generated tokens (ms/token), against
  throughput (req/s).
- FasterTransformer has no scheduler: the authors' own takes at most max_bs requests from the queue into a batch
  (Triton's and TF Serving's way) and injects it; the best (max_bs, microbatch) of all tried: (1, 1) or (8, 8). A
  batch cannot return its early-finished requests; "for the first iteration of the batch, FasterTransformer
  processes requests as if they all had the same input length as the shortest one". With 13B it cannot run a batch
  of 8 or more (section 6.1: each request pre-allocates KV for 2048 tokens).
- Orca: iteration-level FCFS (Algorithm 1), at most max_bs requests a batch, each reserving KV for max_tokens at its
  first iteration; with pipeline stages it keeps as many batches in flight as stages, no microbatches (Figure 8a).
- the headline (section 6.2): "to match a median normalized latency of 190ms for the 175B model, which is a double
  of the normalized execution time ... of orca(128) shown in Figure 9c, FasterTransformer provides a throughput of
  0.185 req/s whereas ORCA provides a throughput of 6.81 req/s, which is a 36.9x speedup" (also the abstract). 101B:
  FasterTransformer peaks at 0.49 req/s (Orca's rate there is in a figure only). 13B has no end-to-end figure.
Not said, so assumed (each named where used): which Orca max_bs gave 6.81 req/s (read: its largest, 32); how many
requests a trace holds; the seed.
"""

from __future__ import annotations

from dataclasses import dataclass

PAPER = "https://www.usenix.org/system/files/osdi22-yu.pdf (OSDI 2022, pp. 521-538)"

INPUT_TOKENS = (32, 512)  # U(32, 512), inclusive (section 6.2)
GEN_TOKENS = (1, 128)  # max_gen_tokens ~ U(1, 128)
MAX_SEQUENCE = 2048  # what FasterTransformer pre-allocates per request (section 6.1)
ORCA_MAX_BS = 32  # ASSUMPTION: the largest max_bs of Figure 10's orca curves (1, 8, 16, 32)


@dataclass(frozen=True)
class Deployment:
    """A model on its cards (Table 1), the latency bound its headline is read at, and FasterTransformer's batches."""

    model: str  # minillm/card/models/NAME.json
    gpu: str
    tp: int  # intra-layer partitions
    pp: int  # inter-layer partitions (pipeline stages)
    bound_ms: float | None  # the median normalized latency the paper compares at; None: 2 x simulated orca(128)
    ft_batches: tuple[int, ...]  # FasterTransformer's max_bs tried (microbatch = max_bs: one microbatch a batch)


DEPLOYMENTS = {
    "gpt3-175b": Deployment("gpt3-175b", "a100-40gb-sxm", 8, 2, 190.0, (1, 8)),
    # ASSUMPTION: 8 does not fit FasterTransformer's 2048-token reservations on one card (section 6.1): 1, 2 and 4
    "gpt3-13b": Deployment("gpt3-13b", "a100-40gb-sxm", 1, 1, None, (1, 2, 4)),
}

SYSTEMS = {
    "orca": "Orca: iteration-level scheduling with selective batching; every iteration the finished leave and the "
    "queue's head joins (up to max_bs), whole prompts beside the decoding rows (minillm's continuous scheduler, no "
    "token budget)",
    "ft": "FasterTransformer under request-level scheduling: a batch of up to max_bs from the queue runs until its "
    "longest member is done, finished rows computed on, every result returned when the batch ends (minillm's static "
    "scheduler); the best max_bs at the bound",
}


@dataclass(frozen=True)
class Published:
    model: str
    multiple: float
    rates: dict  # {system: req/s at the bound}
    where: str


PUBLISHED = (Published("gpt3-175b", 36.9, {"ft": 0.185, "orca": 6.81}, f"{PAPER} (abstract; section 6.2)"),)
