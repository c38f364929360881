"""What one step of a serving engine costs on a datasheet card: the roofline applied kernel by kernel.

roofline.step_cost is the bound: the whole step's bytes at the card's bandwidth against its FLOPs at
peak, the larger of the two, as if every kernel overlapped every other. A real step is a sequence of
kernels that run one after another, and each is bound by its own resource. Two phases matter:

    matmuls    the weights (read once per step) times every new token: memory-bound in decode, compute-bound
               in prefill and at large batches;
    attention  every row's cached keys and values against its new tokens: memory-bound in decode, and its
               bytes grow with batch x context whatever the batch does to the matmuls.

At batch 768 and short context the matmuls are compute-bound while attention still streams 30+ GB of
KV: the bound overlaps the two, the card cannot. So the step is the sum of the two phases' rooflines,
plus the launches.

Compute runs at a share of peak that depends on the dtype (COMPUTE_EFFICIENCY, published measurements);
memory at Device.efficiency of the bandwidth. Attention runs on the 16-bit tensor cores whatever the
weights are (an fp8 KV cache is widened to 16 bits before it is multiplied), at the 16-bit share.
`run --simulate` and `whatif` predict with this; `whatif` shows the bound beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

from minillm.card.hardware import Device
from minillm.card.modelspec import ModelSpec
from minillm.card.roofline import SERVING_ENGINE, Kernels, _per_model, compute_dtype

# Share of dense peak FLOP/s that real prefill-sized work reaches, by the dtype it multiplies in:
# - 16-bit: FlashAttention-2 (Dao, 2023, abstract): GPT training end to end at up to 225 TFLOP/s per A100,
#   "72% model FLOPs utilization" of its 312 dense bf16 TFLOP/s (matmuls and attention together).
# - fp8: FlashAttention-3 (Shah et al., 2024, abstract): FP8 attention "close to 1.2 PFLOPs/s" on an H100 SXM,
#   61% of its 1,979 dense fp8 TFLOP/s (its FP16 kernel reaches 75%: fp8 kernels reach a smaller share).
COMPUTE_EFFICIENCY = {"fp32": 0.72, "bf16": 0.72, "fp16": 0.72, "fp8": 0.61}


@dataclass(frozen=True, slots=True)
class EngineStep:
    """One step's predicted seconds, phase by phase."""

    matmul_s: float  # weights (and activations) against the matmuls' FLOPs: the larger
    attention_s: float  # the KV read and written against attention's FLOPs: the larger
    overhead_s: float  # kernels x launch cost
    matmul_bound: str  # "memory" or "compute"
    attention_bound: str

    @property
    def time_s(self) -> float:
        return self.matmul_s + self.attention_s + self.overhead_s


def engine_step(spec: ModelSpec, device: Device, rows, dtype="bf16", kv_dtype="bf16", kernels: Kernels = SERVING_ENGINE
                ) -> EngineStep:  # fmt: skip
    """Predicted seconds of one serving-engine step. rows: one (new_tokens, cached_before) per row, as for
    roofline.step_cost (which this never undercuts: it is the bound)."""
    pm = _per_model(spec, device, dtype, kv_dtype, kernels)
    n_rows, tokens, streamed, kv_read, kv_write, attention_flops = pm.moved(rows, kernels.kv_passes)
    bandwidth = device.bandwidth * device.efficiency
    matmul_bytes = streamed + (pm.embedding_row + pm.act_token) * tokens + pm.act_row * n_rows
    matmul_flops = pm.flops_token * tokens + pm.flops_row * n_rows
    matmul_memory = matmul_bytes / bandwidth
    share = lambda dtype: 1.0 if device.achieved else COMPUTE_EFFICIENCY[dtype]  # measured rates: already achieved
    matmul_compute = matmul_flops / (pm.peak * share(compute_dtype(dtype, device)))
    attention_memory = (kv_read + kv_write) / bandwidth
    sixteen = "fp32" if dtype == "fp32" else "bf16"
    attention_compute = attention_flops / (device.peak_flops(sixteen) * share(sixteen))
    bound = lambda memory, compute: "memory" if memory >= compute else "compute"
    return EngineStep(max(matmul_memory, matmul_compute), max(attention_memory, attention_compute), pm.overhead,
                      bound(matmul_memory, matmul_compute), bound(attention_memory, attention_compute))  # fmt: skip


def engine_decode(spec, device, batch: int, context: int, dtype="bf16", kv_dtype="bf16") -> EngineStep:
    """One decode step: `batch` rows, each adding one token after `context` cached ones."""
    return engine_step(spec, device, [(1, context)] * batch, dtype, kv_dtype)
