"""What a 2023 system's own code and its benchmark's harness add to a step, priced on the simulated card.

card/simulate.py prices a step as a serving engine runs it (enginecost.py: fused kernels, attention reading each
row's KV in place, prompts beside the decode rows). The systems the Anyscale post measured did more than that, and
their code says where; each is priced here with the same roofline, never with a number of our own:

    kv_passes 3      Hugging Face's OPT attention (transformers' OPTAttention, as of mid-2023) appends the new token
                     by `key_states = torch.cat([past_key_value[0], key_states], dim=2)`, and the same for values:
                     every decode step reads the past KV, writes it again, and attention reads the copy (3 passes,
                     enginecost's Kernels.kv_passes). Naive HF pipelines and TGI/Ray Serve on OPT ran this code.
    padded           a batch kept as one padded tensor (TGI's CausalLMBatch, Ray Serve's re-implementation of it):
                     every row attends over the longest row's keys, and a row leaving (filter) or joining
                     (concatenate) rebuilds the tensor: all the batch's KV read and written once more.
    split_prefill    new prompts run in a forward of their own (TGI's prefill; Ray Serve's process_new_batch before
                     generate_next_token, python/ray/serve/experimental/llm/scheduler.py), not beside the decode
                     rows: the weights are streamed once more.
    pause_per_step   the harness sleeps before every engine step (launch_scripts/launch_vllm: time.sleep(0.01)).
    pause_per_batch  ... before every static batch (launch_scripts/launch_fastertransformers: time.sleep(1)).

The kernel count stays the serving engine's (an eager HF forward launches more, but no source here says how long
each launch takes on that A100, so none is added).
"""

from __future__ import annotations

from dataclasses import dataclass

from minillm.card.enginecost import engine_step
from minillm.card.roofline import SERVING_ENGINE, Kernels, kv_bytes_per_token
from minillm.card.simulate import SimulatedRunner, planned_token


@dataclass(frozen=True)
class Implementation:
    """The costs above, each off (0, False) for a serving engine's step."""

    kv_passes: int = 1
    padded: bool = False
    split_prefill: bool = False
    pause_per_step_s: float = 0.0
    pause_per_batch_s: float = 0.0

    @property
    def kernels(self) -> Kernels:
        return Kernels(SERVING_ENGINE.per_layer, SERVING_ENGINE.per_step, self.kv_passes)

    def said(self) -> list[str]:
        """What it adds, in words (empty: a serving engine's step)."""
        parts = []
        if self.kv_passes > 1:
            parts.append(f"the KV crosses memory {self.kv_passes} times a step (torch.cat of the past KV)")
        if self.padded:
            parts.append("a padded batch: each row attends over the longest row, rebuilt when a row leaves or joins")
        if self.split_prefill:
            parts.append("prompts in a forward of their own")
        if self.pause_per_step_s:
            parts.append(f"the harness sleeps {self.pause_per_step_s * 1e3:g} ms before each step")
        if self.pause_per_batch_s:
            parts.append(f"the harness sleeps {self.pause_per_batch_s:g} s before each batch")
        return parts


class PricedRunner(SimulatedRunner):
    """A simulated card whose steps also pay an Implementation's costs. Rows of one token are decode rows (the
    experiment's prompts are 512 tokens, run whole)."""

    def __init__(self, spec, device, implementation: Implementation, dtype="fp16", kv_dtype="fp16"):
        super().__init__(spec, device, dtype, kv_dtype)
        self.implementation, self.kernels = implementation, implementation.kernels
        self.members: set[str] = set()  # the padded batch's requests at the last step
        self.extra_s = {"rebuild": 0.0, "pause": 0.0}  # seconds the costs beyond a step's forward added
        self.decode_rows = 0  # rows that decoded, summed over the steps (/ steps: the mean batch)

    def run(self, batch, cache, picker=None) -> list[int]:
        starts = cache.prepare(batch.seats, batch.counts, batch.padding_rows)
        rows = list(zip(batch.counts, starts))
        if batch.padding_rows:  # held seats are computed too: copies of the first decode row
            rows += [rows[batch.counts.index(1)]] * batch.padding_rows
        seconds = self.step_seconds(rows, {r.id for r in batch.requests})
        self.clock.advance(seconds)
        self.busy_s += seconds
        return [planned_token(r) for r in batch.sampled]

    def price(self, rows) -> float:
        return engine_step(self.spec, self.card, rows, self.dtype, self.kv_dtype, self.kernels).time_s if rows else 0.0

    def step_seconds(self, rows: list[tuple[int, int]], members: set[str]) -> float:
        impl = self.implementation
        decode = [(n, cached) for n, cached in rows if n == 1]
        self.decode_rows += len(decode)
        prompts = [(n, cached) for n, cached in rows if n > 1]
        longest = max((cached for _, cached in decode), default=0)
        if impl.padded:  # (1, longest): every row reads as many keys as the longest row holds
            decode = [(1, longest)] * len(decode)
        seconds = self.price(decode) + self.price(prompts) if impl.split_prefill else self.price(decode + prompts)
        if impl.padded and self.members and members != self.members and decode:
            bytes_moved = 2 * len(rows) * (longest + 1) * kv_bytes_per_token(self.spec, self.kv_dtype)
            rebuild = bytes_moved / (self.card.bandwidth * self.card.efficiency)
            seconds, self.extra_s["rebuild"] = seconds + rebuild, self.extra_s["rebuild"] + rebuild
        self.members = members
        pause = impl.pause_per_step_s + (impl.pause_per_batch_s if not decode else 0.0)  # a batch starts on prompts
        self.extra_s["pause"] += pause
        return seconds + pause
