"""Speculative decoding priced by the roofline: what a step of guesses costs, and the batch where it stops paying.

Per step, for a batch of B users at `context` tokens each (roofline.step_cost prices every step):

    plain        one decode step of the model:             B rows of 1 token          -> B tokens
    speculative  k draft steps of the draft model:          B rows of 1 token, k times
                 one verify step of the model:              B rows of k + 1 tokens     -> B x E tokens

If each guess is right with probability alpha (independently of the others), a verify row keeps the guesses
before the first miss and adds the model's own token, so it gains E = 1 + alpha + ... + alpha^k tokens
(Leviathan et al., 2023, eq. 1). Speculation pays while

    speedup(B) = E x t_decode(B) / (t_verify(B) + k x t_draft(B))  >  1.

At small B every step is memory-bound: the verify step reads the same weights as a decode step, so it costs
about the same, and the draft steps read a small model: speedup ~ E / (1 + k x draft/model). As B grows the
verify step's k + 1 tokens per row turn it compute-bound first (it has k + 1 times the FLOPs of a decode step):
from there every guess, right or wrong, costs real time, and batching has already filled the idle maths that
speculation was spending. `crossover` finds the first batch where speedup(B) < 1.

On this machine the tiny model's steps are priced op by op (opcost.py, what `whatif --validate` checks): a CPU is
far from its roofline (a 1-row matmul runs at a fraction of a big one's FLOP/s, the KV is gathered into a copy
before attention, every torch call has a fixed cost), and those are exactly the costs a verify row shares out
over its k + 1 tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from minillm.card.hardware import Device
from minillm.card.modelspec import ModelSpec, spec_from_config
from minillm.card.roofline import (
    LOGIT_BYTES,
    SERVING_ENGINE,
    Kernels,
    compute_dtype,
    free_kv_bytes,
    kv_bytes_per_token,
    step_cost,
    weight_bytes,
)
from minillm.config import MAX_SPECULATE, ModelConfig
from minillm.errors import ConfigError


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens a verify row gains in one step: 1 + alpha + alpha^2 + ... + alpha^k."""
    if not 0 <= alpha <= 1 or k < 0:
        raise ConfigError(f"need an acceptance rate in [0, 1] and k >= 0, got {alpha} and {k}")
    return float(k + 1) if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def alpha_from_tokens(tokens_per_row: float, k: int) -> float:
    """The per-guess acceptance rate that gains `tokens_per_row` tokens a verify row of k guesses (inverted by
    bisection): what a measured run says alpha is."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens(mid, k) < tokens_per_row else (lo, mid)
    return (lo + hi) / 2


@dataclass(frozen=True)
class SpeculationCost:
    batch: int
    k: int
    alpha: float
    decode_s: float  # one plain decode step
    verify_s: float  # one verify step: every row k + 1 tokens
    draft_s: float  # one draft step (a speculative step runs k of them)
    tokens_per_row: float  # E: what a verify row gains per step
    # users who leave and newcomers in their seats: seconds of prompt work per output token (the model's, the same
    # with or without speculation; the draft's own, speculation only)
    prefill_s: float = 0.0
    draft_prefill_s: float = 0.0

    @property
    def speculative_s(self) -> float:
        return self.verify_s + self.k * self.draft_s

    @property
    def plain_tokens_per_s(self) -> float:
        return 1 / (self.decode_s / self.batch + self.prefill_s)

    @property
    def speculative_tokens_per_s(self) -> float:
        return 1 / (self.speculative_s / (self.batch * self.tokens_per_row) + self.prefill_s + self.draft_prefill_s)

    @property
    def speedup(self) -> float:
        return self.speculative_tokens_per_s / self.plain_tokens_per_s


@dataclass(frozen=True)
class Pricing:
    """How steps are priced: the roofline's dtypes and kernel counts for the model and the draft, and a fixed
    cost per engine step outside the forward (a serving engine overlaps it with the GPU: 0)."""

    dtype: str = "bf16"
    kv_dtype: str = "bf16"
    kernels: Kernels = SERVING_ENGINE
    draft_kernels: Kernels = SERVING_ENGINE
    verify_kernels: Kernels | None = None  # (default: `kernels`)
    step_overhead_s: float = 0.0  # per engine step: charged to the plain step, and once to a speculative one


def speculation_cost(target: ModelSpec, draft: ModelSpec, device: Device, batch: int, k: int, alpha: float,
                     context: int = 512, pricing: Pricing = Pricing()) -> SpeculationCost:  # fmt: skip
    """One plain step and one speculative step of `batch` users at `context` tokens, on `device`."""
    if batch < 1 or k < 1:
        raise ConfigError(f"need batch >= 1 and k >= 1, got batch {batch}, k {k}")
    p = pricing

    def cost(spec, rows, kernels) -> float:
        return step_cost(spec, device, rows, p.dtype, p.kv_dtype, kernels).time_s

    decode = cost(target, [(1, context)] * batch, p.kernels) + p.step_overhead_s
    verify = verify_step_s(target, device, batch, k, context, p) + p.step_overhead_s
    draft_step = cost(draft, [(1, context)] * batch, p.draft_kernels)
    return SpeculationCost(batch, k, alpha, decode, verify, draft_step, expected_tokens(alpha, k))


def verify_step_s(target: ModelSpec, device: Device, batch: int, k: int, context: int, p: Pricing) -> float:
    """A verify step: rows of k + 1 tokens, priced as prompt chunks are, but with logits at every token, not only
    the last (the roofline prices the vocabulary projection once per row): k more per row are added."""
    c = step_cost(target, device, [(k + 1, context)] * batch, p.dtype, p.kv_dtype, p.verify_kernels or p.kernels)
    more = k * batch  # positions whose logits a prompt chunk would not need
    compute_s = (c.flops + more * 2 * target.vocab * target.hidden) / device.peak_flops(compute_dtype(p.dtype, device))
    memory_s = c.memory_s + more * target.vocab * LOGIT_BYTES / device.bandwidth
    return max(memory_s, compute_s) / device.efficiency + c.overhead_s


def crossover(cost_at, largest: int = 4096) -> int | None:
    """The smallest batch at which a speculative step makes fewer tokens/s than a plain one, where cost_at(batch)
    gives the SpeculationCost (None: not up to `largest`; 1: it never pays). Doubling, then bisecting."""
    pays = lambda batch: cost_at(batch).speedup >= 1
    if not pays(1):
        return 1
    low = 1  # pays at `low`
    while pays(min(2 * low, largest)):
        if 2 * low >= largest:
            return None
        low *= 2
    high = min(2 * low, largest)  # does not pay at `high`
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if pays(middle) else (low, middle)
    return high


def card_crossover(target: ModelSpec, draft: ModelSpec, device: Device, k: int, alpha: float, context: int = 512,
                   pricing: Pricing = Pricing()) -> int | None:  # fmt: skip
    return crossover(lambda batch: speculation_cost(target, draft, device, batch, k, alpha, context, pricing))


def spec_of(cfg: ModelConfig, name: str) -> ModelSpec:
    """A minillm model's shape as the cost model reads one (a config.json's fields)."""
    fields = {"hidden_size": cfg.dim, "intermediate_size": cfg.ffn_dim, "num_hidden_layers": cfg.n_layers,
              "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim,
              "vocab_size": cfg.vocab_size, "max_position_embeddings": cfg.max_seq_len}  # fmt: skip
    return spec_from_config(fields, name)


class ThisMachine:
    """minillm's own model and draft on this machine, priced op by op (opcost.step_bill, the predictor `whatif
    --validate` checks against measured steps): each matmul at the FLOP/s its number of rows reaches here (a verify
    step's k + 1 tokens per row make its matmuls bigger, so faster per token), the KV gathered and attended once per
    row whatever its tokens, and every torch call, counted on the real forward, at its calibrated cost. Python
    outside the forward (scheduling, packing, the draft's bookkeeping) is left out."""

    def __init__(self, model, draft, cal: dict):
        from minillm.card.measure import step_calls

        self.target, self.small, self.cal = spec_of(model.cfg, "minillm"), spec_of(draft.cfg, "minillm-draft"), cal
        # calls per step depend on the code and the depth, not on the batch or the context: counted once
        self.calls = {new: step_calls(model, 2, 16, new) for new in range(1, MAX_SPECULATE + 2)}
        self.draft_calls = step_calls(draft, 2, 16)

    def cost(self, batch: int, k: int, alpha: float, context: int, newcomers: tuple[int, int] | None = None):
        """newcomers: (prompt, reply) tokens of the users who take the seats of those who leave: each prompt rides
        in a step (its work priced without calls: the step's are counted already), and the draft reads it too."""
        from minillm.card.opcost import step_bill

        rows = lambda new: [(new, context)] * batch
        decode = step_bill(self.target, self.cal, rows(1), self.calls[1]).time_s
        verify = step_bill(self.target, self.cal, rows(k + 1), self.calls[k + 1], logits_rows=batch * (k + 1))
        draft_step = step_bill(self.small, self.cal, rows(1), self.draft_calls).time_s
        prefill = draft_prefill = 0.0
        if newcomers:
            prompt, reply = newcomers
            prefill = step_bill(self.target, self.cal, [(prompt, 0)], 0, logits_rows=1).time_s / reply
            draft_prefill = step_bill(self.small, self.cal, [(prompt, 0)], 0, logits_rows=1).time_s / reply
        return SpeculationCost(batch, k, alpha, decode, verify.time_s, draft_step, expected_tokens(alpha, k), prefill,
                               draft_prefill)  # fmt: skip


def users_that_fit(target: ModelSpec, draft: ModelSpec, device: Device, context: int, dtype: str = "bf16") -> int:
    """Users at `context` tokens each when the card holds both models' weights and both KV caches."""
    free = free_kv_bytes(target, device, dtype) - weight_bytes(draft, dtype)
    return max(0, int(free // (context * (kv_bytes_per_token(target) + kv_bytes_per_token(draft)))))


def card_table(target: ModelSpec, draft: ModelSpec, devices: list[Device], ks=(2, 4, 8), alphas=(0.6, 0.7, 0.8, 0.9),
               context: int = 2048) -> list[dict]:  # fmt: skip
    """For each card, k and acceptance rate: the speedup at batch 1, the batch where speculation stops paying, and
    how many users fit at all (past that batch the question does not arise)."""
    rows = []
    for device in devices:
        for k in ks:
            for alpha in alphas:
                one = speculation_cost(target, draft, device, 1, k, alpha, context)
                rows.append({"gpu": device.name, "k": k, "alpha": alpha, "speedup_at_1": one.speedup,
                             "crossover_batch": card_crossover(target, draft, device, k, alpha, context),
                             "users_that_fit": users_that_fit(target, draft, device, context)})  # fmt: skip
    return rows
