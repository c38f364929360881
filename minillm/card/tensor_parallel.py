"""Tensor parallelism on real cards: one rank's share of a step, plus the collectives that join the ranks.

The split is minillm/parallel/shard.py's (Megatron-LM's layout, as vLLM, SGLang and TensorRT-LLM run it): each of
`tp` cards holds 1/tp of every layer's query heads, key/value heads and MLP columns, and, as serving engines do for
a 128k-token vocabulary, 1/tp of the embedding table and of lm_head (vocabulary rows; vLLM's VocabParallelEmbedding
and ParallelLMHead). Norm weights stay whole on every card (a few KB). So one rank

    streams 1/tp of the weights, reads and holds 1/tp of every user's KV (its own kv heads), does 1/tp of the FLOPs,
    and reads and writes the hidden-wide activations whole (every rank holds all of x) but the rest 1/tp;

which is exactly what the cost model charges a model 1/tp as wide in heads, kv heads, MLP and vocabulary and as
wide in hidden: `rank_spec` builds that model, and roofline.py and enginecost.py price it unchanged. At tp = 1 it
is the model itself, and every number is the one-card number.

A mixture of experts is split the same way here: every card holds 1/tp of every expert's columns (as vLLM runs MoE
layers without --enable-expert-parallel), so a step touches as many experts on each card as on one, each 1/tp as big;
the router stays whole on every card. Expert parallelism (whole experts per card, tokens sent to them) is not priced.
Latent attention (MLA) splits its heads, but every card keeps the whole latent of every token (one latent serves all
heads): its KV per card does not shrink with tp, which is why DeepSeek serves it with data-parallel attention.

What one card never pays, per step:
    2 all-reduces per layer (after o_proj and after down_proj) and one after the embedding lookup (each rank looks
    up the tokens in its rows of the table), each of tokens x hidden activations;
    one gather of the logits (each rank has its vocabulary rows' columns) to the rank that samples.
A ring all-reduce sends (and receives) 2(tp-1)/tp of the buffer from each rank, a gather (tp-1)/tp, so one costs
link.latency_s + those bytes / link.bandwidth (one way, the datasheet's rate: medium buffers, 0.1-10 MB, reach well
under it, so at large batches this is the optimistic side). Engines do not overlap them with compute in decode (each
sits between the matmul that makes its input and the one that needs its output): the step is the rank's step plus
its collectives.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from minillm.card.enginecost import EngineStep, engine_step
from minillm.card.hardware import LINKS, Device, Link, get_link
from minillm.card.modelspec import ModelSpec
from minillm.card.roofline import tally
from minillm.config import check_split
from minillm.errors import ConfigError

BATCHES = tuple(2**i for i in range(13))  # 1 ... 4096: where the all-reduces' share of a decode step is looked for


def check_tp(spec: ModelSpec, tp: int) -> None:
    """`tp` must split the query heads, the key/value heads and the MLP's columns evenly (parallel.shard's rule);
    a mixture of experts' experts' columns too."""
    check_split(spec.name, spec.heads, spec.kv_heads, spec.intermediate, tp, part="card")
    if spec.experts and spec.expert_intermediate % tp:
        raise ConfigError(f"--tp {tp} cannot split {spec.name}'s experts ({spec.expert_intermediate} columns each): "
                          f"choose one of {', '.join(map(str, tp_choices(spec)))}")  # fmt: skip


def tp_choices(spec: ModelSpec) -> list[int]:
    """Every tp that splits the model evenly."""
    counts = (spec.heads, spec.kv_heads, spec.intermediate) + ((spec.expert_intermediate,) if spec.experts else ())
    return [d for d in range(1, spec.kv_heads + 1) if all(n % d == 0 for n in counts)]


def rank_spec(spec: ModelSpec, tp: int) -> ModelSpec:
    """What one of `tp` cards holds and computes, as a model of its own (tp = 1: the model itself)."""
    check_tp(spec, tp)
    return spec if tp == 1 else _split(spec, tp)


@lru_cache(maxsize=64)  # (a simulated run asks once a step)
def _split(spec: ModelSpec, tp: int) -> ModelSpec:
    return replace(spec, name=f"{spec.name} (1/{tp})", heads=spec.heads // tp, kv_heads=spec.kv_heads // tp,
                   intermediate=spec.intermediate // tp, vocab=-(-spec.vocab // tp),
                   expert_intermediate=spec.expert_intermediate // tp)  # fmt: skip


def link_of(device: Device, link: str | Link | None = None) -> Link:
    """The link `link` names, else the card's own."""
    if isinstance(link, Link):
        return link
    name = link or device.link
    if name is None:
        raise ConfigError(f"{device.name} has no link to another card that the cost model knows; give one with "
                          f"--link ({', '.join(LINKS)})")  # fmt: skip
    return get_link(name)


@dataclass(frozen=True, slots=True)
class TPStep:
    """One tensor-parallel step: what each rank computes, and what the ranks send each other."""

    tp: int
    rank: EngineStep  # one rank's matmuls, attention and launches, on its share
    allreduces: int  # 2 per layer and 1 for the embedding lookup (0 at tp = 1)
    allreduce_bytes: float  # bytes each rank sends in them: 2(tp-1)/tp x tokens x hidden x activation bytes, each
    gather_bytes: float  # the logits each rank sends to be gathered: (tp-1)/tp x rows x vocab x activation bytes
    comm_s: float  # the collectives' seconds: latency each, plus bytes / the link's one-way bandwidth

    @property
    def time_s(self) -> float:
        return self.rank.time_s + self.comm_s

    @property
    def comm_share(self) -> float:
        return self.comm_s / self.time_s


def tp_step(spec: ModelSpec, device: Device, rows, dtype="bf16", kv_dtype="bf16", tp: int = 1, link=None) -> TPStep:
    """Predicted seconds of one serving-engine step of `spec` split over `tp` cards of `device` joined by `link`
    (a LINKS name; None: the card's own). rows: as for enginecost.engine_step."""
    rank = engine_step(rank_spec(spec, tp), device, rows, dtype, kv_dtype)
    if tp == 1:
        return TPStep(1, rank, 0, 0.0, 0.0, 0.0)
    wire = link_of(device, link)
    n_rows, tokens, _, _ = tally(rows)
    act = 4 if dtype == "fp32" else 2
    allreduces = 2 * spec.layers + 1
    allreduce_bytes = allreduces * 2 * (tp - 1) / tp * tokens * spec.hidden * act
    gather_bytes = (tp - 1) / tp * n_rows * spec.vocab * act
    comm_s = (allreduces + 1) * wire.latency_s + (allreduce_bytes + gather_bytes) / wire.bandwidth
    return TPStep(tp, rank, allreduces, allreduce_bytes, gather_bytes, comm_s)


def tp_decode(spec, device, batch: int, context: int, dtype="bf16", kv_dtype="bf16", tp=1, link=None) -> TPStep:
    """One decode step: `batch` rows, each adding one token after `context` cached ones."""
    if batch < 1 or context < 0:
        raise ConfigError(f"decode needs batch >= 1 and context >= 0, got batch {batch}, context {context}")
    return tp_step(spec, device, [(1, context)] * batch, dtype, kv_dtype, tp, link)


def dominated_batches(spec, device, context: int, dtype="bf16", kv_dtype="bf16", tp=1, link=None) -> list[int]:
    """The decode batches of BATCHES at which the collectives take at least half of the step."""
    if tp == 1:
        return []
    return [b for b in BATCHES if tp_decode(spec, device, b, context, dtype, kv_dtype, tp, link).comm_share >= 0.5]


def where_they_dominate(batches: list[int]) -> str:
    """'from batch 256', 'up to batch 4', 'at batches 8-64' or 'at no batch from 1 to 4,096'."""
    if not batches:
        return f"at no batch from {BATCHES[0]} to {BATCHES[-1]:,}"
    if batches[-1] == BATCHES[-1] and batches[0] != BATCHES[0]:
        return f"from batch {batches[0]:,}"
    if batches[0] == BATCHES[0] and batches[-1] != BATCHES[-1]:
        return f"up to batch {batches[-1]:,}"
    return "at every batch" if len(batches) == len(BATCHES) else f"at batches {batches[0]:,}-{batches[-1]:,}"
