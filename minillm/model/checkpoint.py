"""Save and load the model as safetensors (no pickle: loading a file never runs code from it).

The model's config travels inside the file's metadata, so one file is the whole model.
Weights are stored in float16 (half the size: the shipped file stays under 10 MB) and
loaded back as float32; the held-out accuracy in the metadata is measured after that round trip.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from minillm.config import ModelConfig
from minillm.errors import CheckpointError, ConfigError, DeviceError
from minillm.model.transformer import Transformer

DEFAULT_CHECKPOINT = Path(__file__).parent.parent / "weights" / "minillm.safetensors"
STORAGE_DTYPE = torch.float16
RETRAIN_HINT = "rebuild it with `python -m minillm train` (about 20 minutes on 2 CPU cores)"


def resolve_device(name: str = "auto") -> torch.device:
    """'auto' -> cuda when torch sees a GPU, else cpu. Asking for cuda without a GPU is an error, not a fallback."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise DeviceError("--device cuda was asked for, but torch sees no CUDA GPU here; use --device cpu (or auto)")
    if name not in ("cpu", "cuda"):
        raise DeviceError(f"unknown device {name!r}; choose cpu, cuda or auto")
    return torch.device(name)


def save_checkpoint(model: Transformer, path: str | Path, extra: dict | None = None) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    metadata = {"format": "minillm", "config": json.dumps(model.cfg.to_dict())}
    metadata.update({k: json.dumps(v) for k, v in (extra or {}).items()})
    tensors = {name: t.detach().to(STORAGE_DTYPE).contiguous().cpu() for name, t in model.state_dict().items()}
    save_file(tensors, str(path), metadata=metadata)


def load_model(path: str | Path | None = None, device: str | torch.device = "auto") -> Transformer:
    """Load a checkpoint (the shipped one by default) onto a device, in eval mode."""
    path = Path(path) if path is not None else DEFAULT_CHECKPOINT
    device = resolve_device(device) if isinstance(device, str) else device
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}; {RETRAIN_HINT}")
    try:
        tensors = {name: t.float() for name, t in load_file(str(path)).items()}
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
        cfg = ModelConfig.from_dict(json.loads(metadata["config"]))
    except (SafetensorError, OSError, KeyError, ValueError, ConfigError) as e:
        raise CheckpointError(f"checkpoint {path} is unreadable or corrupt ({e}); {RETRAIN_HINT}") from None
    model = Transformer(cfg)
    try:
        model.load_state_dict(tensors, strict=True)
    except RuntimeError as e:
        first = str(e).splitlines()[0]
        raise CheckpointError(f"checkpoint {path} does not match the model ({first}); {RETRAIN_HINT}") from None
    return model.to(device).eval()


def checkpoint_info(path: str | Path | None = None) -> dict:
    """The metadata saved with a checkpoint (config, training figures), decoded from JSON."""
    path = Path(path) if path is not None else DEFAULT_CHECKPOINT
    with safe_open(str(path), framework="pt") as f:
        return {k: json.loads(v) if k != "format" else v for k, v in (f.metadata() or {}).items()}
