"""The KV hand-over priced: a prompt's keys and values sent from the card that prefilled it to the card that decodes.

Disaggregated serving (layers/handover.py; DistServe, Mooncake, vLLM's KV connectors) moves every prompt's KV once:

    bytes   = kv_bytes_per_token(spec, kv_dtype) x prompt tokens
              (keys AND values, every layer, the kv heads only: 128 KiB a token for Llama-3.1-8B in bf16);
              under tensor parallelism each of the tp cards sends its own kv heads to its counterpart, 1/tp each, all
              at once, so the time is one card's share over one card's link
    seconds = link.latency_s + bytes / link.bandwidth

The bandwidth is the link's one-way rate (hardware.LINKS: NVLink inside a server, InfiniBand between servers), the
latency its fixed cost, paid once: assumption, a request's blocks go as one batch (NIXL and Mooncake's transfer engine
post a request's block list at once). Real transfers overlap the next prompt's compute (layer by layer, in vLLM's and
SGLang's PD modes) and reach less than the peak for small messages: the peak and one fixed cost are the simple middle.
"""

from __future__ import annotations

from dataclasses import dataclass

from minillm.card.hardware import Link
from minillm.card.modelspec import ModelSpec
from minillm.card.roofline import kv_bytes_per_token
from minillm.card.tensor_parallel import rank_spec


@dataclass(frozen=True, slots=True)
class KVTransfer:
    tokens: int
    bytes: float  # what one card sends (under tp: its share)
    seconds: float


def kv_transfer(spec: ModelSpec, tokens: int, link: Link, kv_dtype: str = "bf16", tp: int = 1) -> KVTransfer:
    """What handing `tokens` tokens of KV over `link` costs, per card of a tp-wide engine."""
    sent = kv_bytes_per_token(rank_spec(spec, tp), kv_dtype) * tokens
    return KVTransfer(tokens, sent, link.latency_s + sent / link.bandwidth)
