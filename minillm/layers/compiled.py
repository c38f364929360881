"""The forward through torch.compile, on a CPU as on a GPU (the model runner's seam: the runner calls the model it is
given; this layer gives it one whose forward is compiled, with the same tokens).

What the compiler gets, and what it is kept from:
- **One graph for every step.** A step's tokens are laid end to end, (1, N), whatever the rows (packing.py), and N is
  a symbol, not a number: size-oblivious, so N = 1 (one user decoding) and N = 300 (a prompt) run one compiled graph.
  The graph is compiled once, before the first step, on a made-up step of two rows (8-11 s for the shipped model on
  this project's 2-core machine; vLLM's CPU build compiles at start too). Were the first step one row, sizes of 1
  would be fixed in it.
- **Attention stays outside it.** Where a token's keys live (block tables, the step's groups and masks) is the cache's
  business, planned in Python once per step. In the graph, attention is one opaque op (`minillm::cached_attention`)
  that calls the step's cache; the compiler fuses what is around it: norms, rotary, residual adds, SwiGLU.
- **Frozen weights.** The weights are constants to the compiler, so it lays each linear's weight out once for
  oneDNN (prepack.py's idea) and fuses the residual add into the matmul after attention.

Without a cache (the plain loop, training) the model runs its plain forward.
"""

from __future__ import annotations

import sys
import time

import torch
import torch._inductor.config as inductor
import torch.fx.experimental._config as symbolic_shapes
from torch import nn

from minillm.engine.kv_cache import PagedKVCache
from minillm.layers.prepack import can_prepack, prepack

FORWARDS = ("plain", "prepacked", "compiled")
STEP: dict = {"cache": None}  # the cache of the step being run: the opaque op's way to it


@torch.library.custom_op("minillm::cached_attention", mutates_args=())
def cached_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
    """q (1, N, H, D); k, v (1, N, Hkv, D): the step's tokens end to end. The cache stores k, v and attends, in the
    shape its plan has ((B, T) rows or (1, N)). Returns (1, N, H, D)."""
    cache = STEP["cache"]
    shape = cache.plan.shape
    out = cache.attend(layer, *(t.view(*shape, *t.shape[2:]) for t in (q, k, v)))
    return out.reshape(q.shape)


@cached_attention.register_fake
def _(q, k, v, layer):  # what the compiler needs to know of it: the output's shape
    return torch.empty_like(q)


class OpaqueCache:
    """What the compiled graph sees as the cache: attention as one op, nothing else."""

    def attend(self, layer: int, q, k, v) -> torch.Tensor:
        return torch.ops.minillm.cached_attention(q, k, v, layer)


class CompiledForward:
    """model.forward's stand-in: a step with a cache runs the compiled graph, anything else the plain forward."""

    def __init__(self, model: nn.Module):
        self.model, self.plain = model, model.forward
        # (both settings are the process's: compiling is the process's choice, made at start)
        symbolic_shapes.backed_size_oblivious = True  # N = 1 is no special case: one graph for every N
        inductor.freezing = True  # weights as constants (torch.compile's options= does not reach this)
        self.compiled = torch.compile(self.plain, dynamic=True)
        self.compile_s: float | None = None  # seconds the compile took (at the first step, or at speed_up's asking)
        self.opaque = OpaqueCache()

    def __call__(self, tokens, positions=None, cache=None, last_only=False, logits_at=None):
        if cache is None or logits_at is None or not self.ready():
            return self.plain(tokens, positions, cache, last_only, logits_at)
        try:  # its one graph serves every step: checking its guards (every weight's, 0.15 ms a step) is skipped
            with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
                return self.run(tokens, positions, cache, logits_at)
        except Exception as e:  # noqa: BLE001
            self.give_up(e)
            return self.plain(tokens, positions, cache, last_only, logits_at)

    def ready(self) -> bool:
        """Compiled, once; False where the compiler failed (e.g. a machine without a C++ compiler): the plain
        forward serves then, after a line that says why."""
        if self.compiled is not None and self.compile_s is None:
            try:
                self.compile()
            except Exception as e:  # noqa: BLE001
                self.give_up(e)
        return self.compiled is not None

    def give_up(self, error: Exception) -> None:
        print(f"--compile: the compiled forward failed ({type(error).__name__}: {str(error)[:200]}); running it "
              "uncompiled", file=sys.stderr)  # fmt: skip
        self.compiled = None

    def run(self, tokens, positions, cache, logits_at) -> torch.Tensor:
        STEP["cache"] = cache
        try:
            # (B, T) -> (1, B * T): the plan keeps the rows' shape. A copy, not a view: the compiler guards a view's
            # base, and a step whose tensors are not views of the same rank would compile again
            flat = lambda t: t.reshape(1, -1).clone()
            return self.compiled(flat(tokens), flat(positions), self.opaque, logits_at=logits_at)  # (R, V)
        finally:
            STEP["cache"] = None

    @torch.no_grad()
    def compile(self) -> None:
        """Compile on a made-up step in a cache of its own: two rows of 2 and 1 tokens, so N = 3 tokens and R = 2
        picks. The compiler keeps sizes 0 and 1 out of its symbols and takes two equal sizes for one: a first step
        of one row, or with N = R, would fix that in the graph, and a later step would compile again."""
        began, device = time.perf_counter(), next(self.model.parameters()).device
        cache = PagedKVCache(self.model.cfg, num_blocks=2, block_size=16, device=device)
        positions = cache.prepare([0, 1], [2, 1])  # (1, 3): the rows end to end
        tokens, picks = torch.zeros_like(positions), torch.tensor([1, 2], device=device)  # each row's last token
        self.run(tokens, positions, cache, logits_at=picks)
        self.compile_s = time.perf_counter() - began


def speed_up(model: nn.Module, forward: str = "prepacked", compile_now: bool = False) -> nn.Module:
    """The model with the forward asked for: "plain" (as written), "prepacked" (linears through oneDNN with
    weights laid out once, where the CPU build has it) or "compiled" (this file; compile_now: here, not at the first
    step, so no step's time holds the compile). Remembered on the model as `model.forward_kind`, so an engine
    process given its weights can do the same (serving/engine_process.py)."""
    if forward not in FORWARDS:
        raise ValueError(f"forward {forward!r}: choose one of {', '.join(FORWARDS)}")
    if forward == "prepacked" and not can_prepack(model):
        forward = "plain"  # (no oneDNN here, or not float32 on a CPU: the linears as written)
    if forward == "prepacked":
        prepack(model)
    elif forward == "compiled":
        model.forward = CompiledForward(model)
        if compile_now:
            model.forward.ready()
    model.forward_kind = forward
    return model
