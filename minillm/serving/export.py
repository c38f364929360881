"""Export to (and import from) the standard Llama checkpoint layout.

Our module names already follow Hugging Face's LlamaForCausalLM (checkpoint.llama_layout cuts the matrices the
model fuses back into Llama's), so export is a prefix ("model.") plus a config.json with the usual field names.
Any tool that reads Llama checkpoints can load the folder and compute the same logits.
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import load_file, save_file

from minillm.config import ModelConfig
from minillm.errors import CheckpointError
from minillm.model.checkpoint import fused_layout, llama_layout
from minillm.model.tokenizer import BOS, EOS, PAD
from minillm.model.transformer import Transformer


def llama_config(cfg: ModelConfig) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": cfg.dim,
        "intermediate_size": cfg.ffn_dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_seq_len,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": BOS,
        "eos_token_id": EOS,
        "pad_token_id": PAD,
        "torch_dtype": "float32",
    }


def llama_name(name: str) -> str:
    """Our parameter name -> the Llama checkpoint name (lm_head sits outside `model.`)."""
    return name if name.startswith("lm_head.") else f"model.{name}"


def export_llama(model: Transformer, out_dir: str | Path) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(llama_config(model.cfg), indent=2) + "\n")
    weights = llama_layout(model.state_dict(), model.cfg)
    tensors = {llama_name(n): t.detach().contiguous().cpu() for n, t in weights.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def import_llama(folder: str | Path) -> Transformer:
    """Load a Llama-layout folder (config.json + model.safetensors) back into our model."""
    folder = Path(folder)
    try:
        hf = json.loads((folder / "config.json").read_text())
        tensors = load_file(str(folder / "model.safetensors"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{folder} is not a readable Llama export ({e})") from None
    cfg = ModelConfig(
        vocab_size=hf["vocab_size"],
        dim=hf["hidden_size"],
        n_layers=hf["num_hidden_layers"],
        n_heads=hf["num_attention_heads"],
        n_kv_heads=hf["num_key_value_heads"],
        ffn_dim=hf["intermediate_size"],
        max_seq_len=hf["max_position_embeddings"],
        rope_theta=hf["rope_theta"],
        norm_eps=hf["rms_norm_eps"],
    )
    model = Transformer(cfg)
    ours = {llama_name(n): n for n in llama_layout(model.state_dict(), cfg)}
    missing = set(ours) - set(tensors)
    if missing:
        raise CheckpointError(f"{folder} lacks tensors {sorted(missing)[:3]}...")
    model.load_state_dict(fused_layout({ours[n]: t for n, t in tensors.items() if n in ours}, cfg), strict=True)
    return model.eval()
