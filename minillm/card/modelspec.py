"""Real models as the cost model sees them: the shapes in a standard Hugging Face config.json.

Llama, Mistral, Qwen2 and Qwen3 are the same decoder as minillm's (model.py): RMSNorm, rotary
positions, grouped-query attention, a SwiGLU MLP. They differ in sizes and in a few small
parameters, which is all a parameter count needs:

    per layer   q, k, v, o projections   hidden x (heads + 2 kv_heads) x head_dim  +  heads x head_dim x hidden
                (Qwen2: biases on q, k, v; Qwen3: an RMSNorm weight of head_dim on q and on k)
                gate, up, down (SwiGLU)   3 x hidden x intermediate
                two RMSNorm weights       2 x hidden
    once        embedding                 vocab x hidden
                final RMSNorm             hidden
                lm_head                   vocab x hidden, unless tied to the embedding

`load_spec("llama-3.1-8b")` reads a shipped file from minillm/card/models/; any other config.json
works by path. Fields follow the config: head_dim, when missing, is hidden_size / heads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from minillm.errors import ConfigError

MODELS_DIR = Path(__file__).parent / "models"
REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")


@dataclass(frozen=True)
class ModelSpec:
    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2: biases on the q, k and v projections
    o_bias: bool = False  # Llama's attention_bias=true also puts one on o_proj
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm over each head's query and key
    max_context: int | None = None  # max_position_embeddings
    sliding_window: int | None = None  # Mistral-7B-v0.1: 4096 (the cost model treats attention as full)

    # --- parameters, by where they sit ---------------------------------------------------------------
    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def layer_matmul_params(self) -> int:
        """Weights one token multiplies through in one layer: the four attention and three MLP matrices."""
        attention = self.hidden * (self.q_dim + 2 * self.kv_dim) + self.q_dim * self.hidden
        return attention + 3 * self.hidden * self.intermediate

    @property
    def layer_small_params(self) -> int:
        """Biases and norm weights of one layer: read, never multiplied through."""
        n = 2 * self.hidden  # input and post-attention RMSNorm
        n += (self.q_dim + 2 * self.kv_dim) * self.qkv_bias + self.hidden * self.o_bias
        n += (2 * self.intermediate + self.hidden) * self.mlp_bias
        return n + 2 * self.head_dim * self.qk_norm

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def lm_head_params(self) -> int:
        """Separate lm_head weights (0 when tied: the embedding matrix serves both)."""
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    @property
    def num_parameters(self) -> int:
        """Exact parameter count, as the checkpoint stores them."""
        per_layer = self.layer_matmul_params + self.layer_small_params
        return self.layers * per_layer + self.embedding_params + self.lm_head_params + self.hidden


def whole_number(config: dict, key: str, name: str, default=None) -> int | None:
    """A config field that must be a whole number: JSON's 4096 or 4096.0, never "4096" (text), 4096.7 or true."""
    value = config.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        shown = f"{value!r} ({type(value).__name__})"
        raise ConfigError(f"config for {name!r}: {key} must be a number, got {shown}; write it without quotes")
    if isinstance(value, float) and not value.is_integer():
        raise ConfigError(f"config for {name!r}: {key} must be a whole number, got {value}")
    return int(value)


def spec_from_config(config: dict, name: str) -> ModelSpec:
    """A ModelSpec from a Hugging Face config.json's fields (Llama, Mistral, Qwen2, Qwen3)."""
    missing = [k for k in REQUIRED if k not in config]
    if missing:
        raise ConfigError(f"config for {name!r} lacks {missing}; a Llama-style config.json has {list(REQUIRED)}")
    sizes = {key: whole_number(config, key, name) for key in REQUIRED}
    small = [f"{key} = {value}" for key, value in sizes.items() if value is None or value < 1]
    # absent (or null): plain multi-head attention, one key/value head per query head; 0 is a mistake, not that
    kv_heads = whole_number(config, "num_key_value_heads", name, sizes["num_attention_heads"])
    head_dim = whole_number(config, "head_dim", name)
    small += [f"{key} = {value}" for key, value in (("num_key_value_heads", kv_heads), ("head_dim", head_dim))
              if value is not None and value < 1]  # fmt: skip
    if small:
        raise ConfigError(f"config for {name!r} has sizes below 1: {', '.join(small)}")
    heads, hidden = sizes["num_attention_heads"], sizes["hidden_size"]
    if head_dim is None:
        if hidden % heads:
            raise ConfigError(f"config for {name!r}: hidden_size {hidden} is not a multiple of num_attention_heads "
                              f"{heads}, and no head_dim is given")  # fmt: skip
        head_dim = hidden // heads
    if heads % kv_heads:
        raise ConfigError(f"{name}: num_key_value_heads ({kv_heads}) must divide num_attention_heads ({heads})")
    max_context = whole_number(config, "max_position_embeddings", name)
    window = whole_number(config, "sliding_window", name) if config.get("use_sliding_window", True) else None
    kind = config.get("model_type", "llama")
    attention_bias = bool(config.get("attention_bias", False))
    return ModelSpec(
        name=name,
        hidden=hidden,
        intermediate=sizes["intermediate_size"],
        layers=sizes["num_hidden_layers"],
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        vocab=sizes["vocab_size"],
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        qkv_bias=kind == "qwen2" or attention_bias,  # Qwen2 always has q/k/v biases (no config field)
        o_bias=attention_bias and kind != "qwen2",
        mlp_bias=bool(config.get("mlp_bias", False)),
        qk_norm=kind == "qwen3",
        max_context=max_context if max_context and max_context > 0 else None,
        sliding_window=window if window and window > 0 else None,
    )


def shipped_models() -> list[str]:
    return sorted(p.stem for p in MODELS_DIR.glob("*.json"))


def load_spec(name_or_path: str | Path) -> ModelSpec:
    """A shipped model by name (minillm/card/models/NAME.json) or any config.json by path (or the folder holding it,
    as a downloaded checkpoint comes)."""
    path = Path(name_or_path)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError(f"{path} is a folder without a config.json; give the path to the model's config.json")
        path = path / "config.json"
    elif path.suffix != ".json" and not path.is_file():
        path = MODELS_DIR / f"{name_or_path}.json"
        if not path.is_file():
            raise ConfigError(
                f"unknown model {str(name_or_path)!r}; known: {', '.join(shipped_models())} "
                "(or give the path to a Hugging Face config.json)"
            )
    try:
        config = json.loads(path.read_text())
    except OSError as e:
        raise ConfigError(f"cannot read model config {path} ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path} is not a config.json object")
    name = path.stem if path.parent == MODELS_DIR else str(path.parent if path.name == "config.json" else path)
    return spec_from_config(config, name)
