"""Save and load the model as safetensors (no pickle: loading a file never runs code from it).

The model's config travels in the file's metadata, so one file is the whole model, in Llama's
layout (the fused qkv_proj is saved as q_proj, k_proj, v_proj). Weights are stored in float16
(half the size: the shipped file stays under 10 MB) and loaded back as float32; the held-out
accuracy in the metadata is measured after that round trip.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from minillm.config import ModelConfig, resolve_device
from minillm.errors import CheckpointError, ConfigError
from minillm.model.transformer import Transformer

DEFAULT_CHECKPOINT = Path(__file__).parent.parent / "weights" / "minillm.safetensors"
STORAGE_DTYPE = torch.float16
RETRAIN_HINT = "rebuild it with `python -m minillm train` (about 20 minutes on 2 CPU cores)"


# Matrices the model runs as one matmul (transformer.py) -> Llama's, stacked by rows in this order.
FUSED = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}


def llama_layout(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """The model's state dict under Llama's names: each fused matrix cut back into its parts
    (layers.0.self_attn.qkv_proj.weight -> ...q_proj.weight, ...k_proj.weight, ...v_proj.weight)."""
    kv = cfg.n_kv_heads * cfg.head_dim
    q = cfg.n_heads * cfg.head_dim
    rows = {"self_attn.qkv_proj": [q, kv, kv], "mlp.gate_up_proj": [cfg.ffn_dim] * 2}
    out = {}
    for name, t in state.items():
        fused = next((f for f in FUSED if f".{f}." in name), None)
        if fused is None:
            out[name] = t
        else:
            pieces = zip(FUSED[fused], t.split(rows[fused]))
            out |= {name.replace(fused, part): piece for part, piece in pieces}
    return out


def fused_layout(tensors: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Llama's names -> the model's: each layer's parts stacked into their fused matrix."""
    out = dict(tensors)
    for layer, (fused, parts) in itertools.product(range(cfg.n_layers), FUSED.items()):
        stacked = [out.pop(f"layers.{layer}.{part}.weight") for part in parts]  # KeyError: missing
        out[f"layers.{layer}.{fused}.weight"] = torch.cat(stacked)
    return out


def save_checkpoint(model: Transformer, path: str | Path, extra: dict | None = None) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    metadata = {"format": "minillm", "config": json.dumps(model.cfg.to_dict())}
    metadata.update({k: json.dumps(v) for k, v in (extra or {}).items()})
    weights = llama_layout(model.state_dict(), model.cfg)
    tensors = {name: t.detach().to(STORAGE_DTYPE).contiguous().cpu() for name, t in weights.items()}
    save_file(tensors, str(path), metadata=metadata)


def load_model(path=None, device: str | torch.device = "auto", hint=RETRAIN_HINT) -> Transformer:
    """Load a checkpoint (the shipped one by default) onto a device, in eval mode. hint: how to
    rebuild the file, said when it is missing or broken."""
    path = Path(path) if path is not None else DEFAULT_CHECKPOINT
    device = resolve_device(device) if isinstance(device, str) else device
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}; {hint}")
    try:
        tensors = {name: t.float() for name, t in load_file(str(path)).items()}
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
        cfg = ModelConfig.from_dict(json.loads(metadata["config"]))
    except (SafetensorError, OSError, KeyError, ValueError, ConfigError) as e:
        raise CheckpointError(f"checkpoint {path} is unreadable or corrupt ({e}); {hint}") from None
    model = Transformer(cfg)
    try:
        model.load_state_dict(fused_layout(tensors, cfg), strict=True)
    except (RuntimeError, KeyError) as e:
        why = f"does not match the model ({str(e).splitlines()[0]})"
        raise CheckpointError(f"checkpoint {path} {why}; {hint}") from None
    return model.to(device).eval()


def checkpoint_info(path: str | Path | None = None) -> dict:
    """The metadata saved with a checkpoint (config, training figures), decoded from JSON."""
    path = Path(path) if path is not None else DEFAULT_CHECKPOINT
    with safe_open(str(path), framework="pt") as f:
        return {k: json.loads(v) if k != "format" else v for k, v in (f.metadata() or {}).items()}
