"""A card you don't have: the real engine serving a real model on a simulated clock.

The engine, the schedulers and the block allocator are the ones that serve the tiny model; only
the runner differs. SimulatedRunner stands in for the model forward: each request replies with
its planned number of tokens and then EOS, and each step advances a virtual clock by what a
serving engine's step over those rows costs on the card (enginecost.py: the roofline, kernel by
kernel). The KV pool gets as many blocks as the card's free memory holds for the model, and
keeps only the allocator's books (an 8B model's pool would be gigabytes of tensors). With tp > 1
the model is split over tp such cards (tensor_parallel.py): the pool is as many blocks as one card
holds its share of (its own kv heads), and a step is one card's share plus the all-reduces between
them. The trace that comes out is an ordinary trace whose times are simulated seconds, so metrics,
the app and the lessons read it unchanged. A request handed from one simulated engine to another (layers/handover.py,
a fleet: fleet.py) carries its KV as tensors of no elements, (0, tokens, 0, 0): the count is all the books need.
"""

from __future__ import annotations

import torch

from minillm.card.hardware import Device
from minillm.card.host_link import host_copy_seconds
from minillm.card.modelspec import ModelSpec
from minillm.card.roofline import activation_reserve_bytes, check_dtypes, free_kv_bytes, kv_blocks, weight_bytes
from minillm.card.tensor_parallel import link_of, rank_spec, tp_choices, tp_step
from minillm.config import EngineConfig
from minillm.engine.packing import Batch
from minillm.engine.paged_books import PagedKVBooks
from minillm.errors import ConfigError
from minillm.model.tokenizer import EOS

MAX_NUM_SEQS = 256  # vLLM's default cap on sequences per step: seats never exceed it
# vLLM V1's default max_num_batched_tokens for its OpenAI server: 8192 on cards with at least 70 GiB,
# 2048 on smaller ones (vllm/engine/arg_utils.py, EngineArgs._set_default_args). A GPU prefills a
# 2048-token chunk in about the time of a decode step, so the budget that suits it is far larger than
# the tiny CPU model's (scheduler.DEFAULT_TOKEN_BUDGET).
SERVER_TOKEN_BUDGET = {True: 8192, False: 2048}
DEFAULT_CONTEXT = 32768  # for a config.json without max_position_embeddings


class VirtualClock:
    """Simulated seconds: they pass only when a step runs (or the engine waits for the next arrival)."""

    name = "simulated"

    def __init__(self):
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def wait_until(self, t: float) -> None:
        self.t = max(self.t, t)

    def advance(self, seconds: float) -> None:
        self.t += seconds


class SimulatedRunner:
    def __init__(self, spec: ModelSpec, device: Device, dtype: str = "bf16", kv_dtype: str = "bf16",
                 utilization: float = 0.9, tp: int = 1, link: str | None = None):  # fmt: skip
        check_dtypes(dtype, kv_dtype)
        self.spec, self.card, self.dtype, self.kv_dtype, self.utilization = spec, device, dtype, kv_dtype, utilization
        self.tp, self.rank_spec = tp, rank_spec(spec, tp)  # one card's share of the model (tp = 1: all of it)
        self.link = link_of(device, link) if tp > 1 else None
        self.model = None
        self.device = f"simulated {device.name}" + (f" x {tp} ({self.link.name})" if tp > 1 else "")
        self.vocab_size, self.max_len = spec.vocab, spec.max_context or DEFAULT_CONTEXT
        self.clock = VirtualClock()
        self.busy_s = 0.0  # simulated seconds spent running steps (the rest: waiting for arrivals)

    def pool_blocks(self, block_size: int) -> int:
        """KV blocks that fit in the card's memory after the weights and the activation reserve."""
        blocks = kv_blocks(self.rank_spec, self.card, self.dtype, self.kv_dtype, block_size, self.utilization)
        if blocks < 1:
            cards = f"{self.tp} x {self.card.name}" if self.tp > 1 else self.card.name
            raise ConfigError(
                f"{self.spec.name} in {self.dtype} does not fit on {cards} with room for any KV cache; "
                + (self.too_big_for_one() or "try --dtype int4 or fp8, or a card with more memory")
            )
        return blocks

    def too_big_for_one(self) -> str | None:
        """Where even int4 weights outgrow one card: how many cards it takes (tensor parallelism), and how to price
        them. None where a smaller --dtype or a bigger card would do."""
        smallest = weight_bytes(self.spec, "int4") + activation_reserve_bytes(self.spec, "int4")
        usable = self.card.memory_bytes * self.utilization
        if self.tp > 1 or smallest < usable:
            return None
        fit = [t for t in tp_choices(self.spec) if free_kv_bytes(rank_spec(self.spec, t), self.card, self.dtype) > 0]
        split = (f"split it over {fit[0]} cards (tensor parallelism; `python -m minillm whatif --model "
                 f"{self.spec.name} --gpu {self.card.name} --dtype {self.dtype} --tp {fit[0]}` prices them, "
                 "run --simulate runs one card)" if fit else "it does not fit even split over as many cards as it has "
                 "heads")  # fmt: skip
        return (f"even in int4 its weights and a step's activations take {smallest / 2**30:,.0f} GiB of the card's "
                f"usable {usable / 2**30:,.0f} GiB: {split}")  # fmt: skip

    def host_copy_seconds(self, tokens: int) -> float:
        """A second KV tier's copy of `tokens` tokens between host memory and this card (layers/tier.py)."""
        return host_copy_seconds(self.spec, self.card, tokens, self.kv_dtype, self.tp)

    def make_cache(self, cfg: EngineConfig, max_len: int) -> PagedKVBooks:
        if cfg.kv != "paged":
            raise ConfigError("a simulated card keeps a paged KV pool's books; use --kv paged")
        return SimulatedKVBooks(cfg.num_blocks or self.pool_blocks(cfg.block_size), cfg.block_size,
                                cfg.prefix_caching)  # fmt: skip

    def run(self, batch: Batch, cache: PagedKVBooks, picker=None) -> list[int]:
        """Charge the step's rows to the clock; each finished row gets its next planned token (or EOS). (No
        logits, so no picker: the planned reply is the pick.)"""
        starts = cache.prepare(batch.seats, batch.counts, batch.padding_rows)
        rows = list(zip(batch.counts, starts))
        if batch.padding_rows:  # held seats are computed too: copies of the first decode row
            rows += [rows[batch.counts.index(1)]] * batch.padding_rows
        seconds = tp_step(self.spec, self.card, rows, self.dtype, self.kv_dtype, self.tp, self.link).time_s
        self.clock.advance(seconds)
        self.busy_s += seconds
        return [planned_token(r) for r in batch.sampled]


class SimulatedKVBooks(PagedKVBooks):
    """The books, and a hand-over's KV without its numbers: only how many tokens it holds."""

    def read_tokens(self, seat: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A hand-over's keys and values: (0, n, 0, 0) each, shaped like the real ones in the dimension that counts."""
        return torch.empty(0, n, 0, 0), torch.empty(0, n, 0, 0)

    def write_tokens(self, seat: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """The imported tokens take their blocks, as if a forward had computed them."""
        self.allocator.append(seat, k.shape[1])


def planned_token(request) -> int:
    """The stand-in model's next token: placeholder text until the planned length, then EOS."""
    planned = request.planned_reply if request.planned_reply is not None else request.max_new_tokens
    if len(request.output_ids) >= planned and not request.ignore_eos:
        return EOS
    return 32 + len(request.output_ids) % 90  # printable ASCII, so a replayed reply is visibly text


def default_token_budget(runner: SimulatedRunner) -> int:
    """The token budget vLLM's server would use on this card."""
    return SERVER_TOKEN_BUDGET[runner.card.memory_bytes >= 70 * 2**30]


def default_slots(runner: SimulatedRunner, block_size: int, typical_tokens: float) -> int:
    """Seats: as many users as the KV memory holds at a typical request's length, at most MAX_NUM_SEQS."""
    per_user = -(-max(1, round(typical_tokens)) // block_size)
    return max(1, min(MAX_NUM_SEQS, runner.pool_blocks(block_size) // per_user))
