"""The same matmuls with each weight laid out once for the CPU's kernel (the model runner's seam: a runner runs the
model it is given; this layer hands it the same model with faster linears, and the same tokens).

On a CPU, torch's Linear calls the BLAS library its wheel was built with (MKL). A matmul kernel reads the weight in
small blocks that suit its registers, so MKL first copies the weight into that layout: on every call, for every
layer, every step. The shipped model's matmuls are small (a step's few to few hundred tokens against weights of
0.1-1.4 MB), and that copy is a large part of each one. oneDNN, torch's other CPU library and the one vLLM's CPU
build calls, takes the weight already laid out: it is copied once, here, and every later call only reads it.

Measured on this project's 2-core AMD EPYC, one thread: the layers' 16 linears, cycled through as a forward does,
took 1.6-1.9x less time at 4 to 96 tokens; at 1 token MKL was as fast or faster (lesson 07b times them on yours).
The whole engine against vLLM's eager one, on the same crowd: BENCHMARKS.md section 19 (`bench --only peer`).

A PrepackedLinear keeps its `weight` (checkpoints, export and state_dict see the same names) and lays it out
lazily, on its first call in a process (a model sent to an engine process travels as its weights). Change the weight
afterwards and call `relayout()`: the packed copy does not follow it.
"""

from __future__ import annotations

import torch
from torch import nn


def can_prepack(model: nn.Module) -> bool:
    """oneDNN's prepacked linear: a CPU build with oneDNN, float weights on the CPU."""
    weight = next(model.parameters())
    return weight.device.type == "cpu" and weight.dtype == torch.float32 and torch.backends.mkldnn.is_available()


class PrepackedLinear(nn.Module):
    """nn.Linear's y = x W^T + b through oneDNN, with W laid out once in oneDNN's blocked layout."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # (out, in), as saved
        self.bias = linear.bias
        self.packed: torch.Tensor | None = None  # (opaque) the weight in oneDNN's layout

    def relayout(self) -> None:
        self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x (..., in) -> (..., out)
        if self.packed is None:
            self.relayout()
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def __getstate__(self):  # (the opaque copy does not pickle: the receiver lays the weight out again)
        return self.__dict__ | {"packed": None}


def prepack(model: nn.Module) -> nn.Module:
    """Every nn.Linear in the model replaced by a PrepackedLinear, in place; a model that cannot (not a CPU with
    oneDNN, not float32) is returned as it is."""
    if not can_prepack(model):
        return model
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, name, PrepackedLinear(child))
    return model
