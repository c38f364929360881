"""Batching a mixture of experts: a step streams only the experts its tokens chose.

A dense layer's MLP is read once per step whatever the batch. An MoE layer holds E experts and each token's router
picks k of them, so a step of B tokens reads only the experts at least one of its tokens picked. If each token picks
k distinct experts uniformly, a given expert escapes one token with probability 1 - k/E, and all B tokens with
(1 - k/E)^B, so the experts a step touches, per MoE layer, are on average

    E x (1 - (1 - k/E)^B)      (gpt-oss-120b, E = 128, k = 4: B = 1: 4, B = 8: 28.7, B = 64: 111, B = 256: 127.96)

At batch 1 a decode step moves a fraction of the weights (one user of DeepSeek-V3 reads 37 B of 671 B parameters);
then every new row brings in experts nobody had picked, so adding a row costs more than the seeds' rule says (nearly
nothing), until the batch touches every expert and the step reads all the weights, as a dense model's does.
Real routers are not uniform (some experts are popular), which touches fewer: the formula is the even-load case.
Shared experts and dense layers are read at every step, as dense weights are.
"""

from __future__ import annotations

from minillm.card.modelspec import ModelSpec
from minillm.errors import ConfigError

GiB = 2**30


def expected_experts(experts: int, per_token: int, tokens: int) -> float:
    """Routed experts a step of `tokens` tokens touches in one MoE layer, on average: E (1 - (1 - k/E)^B)."""
    if not 1 <= per_token <= experts or tokens < 0:
        raise ConfigError(f"need 1 <= k <= E and tokens >= 0, got k = {per_token}, E = {experts}, tokens = {tokens}")
    return experts * (1 - (1 - per_token / experts) ** tokens)


def expert_slot_bytes(spec: ModelSpec, weight_bytes: float, other_bytes: float) -> float:
    """Bytes of one routed expert in every MoE layer: its matrices at `weight_bytes` a weight, its biases at
    `other_bytes` (what a step reads per expert it touches, summed over the layers)."""
    return spec.moe_layers * (spec.expert_params * weight_bytes + spec.expert_bias_params * other_bytes)


def touched_share(spec: ModelSpec, tokens: int) -> float:
    """The share of the routed experts a step of `tokens` tokens reads (1.0 for a dense model: all of its MLP)."""
    if not spec.experts:
        return 1.0
    return expected_experts(spec.experts, spec.experts_per_token, tokens) / spec.experts


def experts_line(spec: ModelSpec, batch: int, streamed_bytes: float, all_bytes: float) -> str:
    """The one line that says why an MoE model decodes as it does: what a token uses, what the batch reads."""
    touched = expected_experts(spec.experts, spec.experts_per_token, batch)
    shared = f" + {spec.shared_experts} shared" if spec.shared_experts else ""
    return (f"experts: each token runs {spec.experts_per_token}{shared} of {spec.experts} experts in {spec.moe_layers} "
            f"layers ({spec.active_parameters / 1e9:.1f} B of {spec.num_parameters / 1e9:.1f} B parameters); batch "
            f"{batch} touches {touched:.0f} of {spec.experts} per layer: a step streams "
            f"{streamed_bytes / GiB:.1f} of {all_bytes / GiB:.1f} GiB of weights")  # fmt: skip
