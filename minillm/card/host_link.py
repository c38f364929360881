"""The link between a card and its host's memory: what a second KV tier (layers/tier.py) copies blocks over.

A block written through to host memory, or loaded back for a returning user, crosses the card's PCIe link (the
card's own memory streams at terabytes a second; this link at tens of gigabytes). Each card's host interface, from
its datasheet (the one-way rates are hardware.LINKS'):
  NVIDIA H100 Tensor Core GPU datasheet, SXM column: "PCIe Gen5: 128GB/s" (both ways)
  NVIDIA H200 Tensor Core GPU datasheet (SXM): "PCIe Gen5: 128GB/s"
  NVIDIA A100 Tensor Core GPU datasheet, 80GB SXM column: "PCIe Gen4: 64GB/s"
  NVIDIA L4 Tensor Core GPU datasheet: "PCIe Gen4 x16 64GB/s"
  GeForce RTX 3090 and RTX 4090 specifications: "PCI Express 4.0" (x16)
The M2 Ultra's GPU shares one memory with its CPU: there is no second tier to copy to.
"""

from __future__ import annotations

from minillm.card.hardware import Device, Link, get_link
from minillm.card.kv_transfer import kv_transfer
from minillm.card.modelspec import ModelSpec
from minillm.errors import ConfigError

HOST_LINKS = {"h100-sxm": "pcie-5", "h200": "pcie-5", "a100-80gb-sxm": "pcie-4", "l4": "pcie-4", "rtx-3090": "pcie-4",
              "rtx-4090": "pcie-4"}  # fmt: skip


def host_link(card: Device) -> Link:
    if card.name not in HOST_LINKS:
        raise ConfigError(f"{card.name} has no host link to price: its memory is the host's (a second KV tier there "
                          "is the same memory); choose a discrete card")  # fmt: skip
    return get_link(HOST_LINKS[card.name])


def host_copy_seconds(spec: ModelSpec, card: Device, tokens: int, kv_dtype: str = "bf16", tp: int = 1) -> float:
    """Copying `tokens` tokens of KV between host memory and the card, as one batch of blocks (per card, under tp)."""
    return kv_transfer(spec, tokens, host_link(card), kv_dtype, tp).seconds
