"""The models people run now, read from their config.json: experts, latent attention and sliding windows.

Each family names the same ideas with its own fields (as the Hugging Face configs spell them):

    experts (E routed, k per token)   Mixtral, gpt-oss: num_local_experts, num_experts_per_tok (gpt-oss also
                                      experts_per_token); an expert is intermediate_size wide, every layer has them
                                      Qwen3-MoE: num_experts, num_experts_per_tok, moe_intermediate_size; layer i has
                                      experts unless it is in mlp_only_layers, every decoder_sparse_step-th layer
                                      DeepSeek-V2/V3: n_routed_experts, n_shared_experts (run by every token),
                                      num_experts_per_tok, moe_intermediate_size; the first first_k_dense_replace
                                      layers are dense (intermediate_size), then every moe_layer_freq-th has experts
    latent attention (MLA)            DeepSeek-V2/V3: kv_lora_rank (the cached latent), qk_rope_head_dim (the rotary
                                      part of each key, cached beside it), qk_nope_head_dim, v_head_dim, q_lora_rank
                                      (null: queries straight from the residual)
    sliding windows                   sliding_window (tokens a local layer sees) with layer_types (gpt-oss, newer
                                      configs: "sliding_attention" / "full_attention" per layer) or, for Gemma 3,
                                      sliding_window_pattern (every pattern-th layer is global: 5 local, 1 global)

Gemma 3's checkpoints nest the language model's fields in text_config (beside the vision tower's, which the cost
model leaves out) and leave several at their defaults; `flatten` lifts them and fills those defaults in.
A config with a sliding_window and no layer pattern (Mistral-7B-v0.1: every layer windowed) keeps being priced as full
attention, as it was before windows were priced (lesson 07's numbers use it): window_layers is 0 for it.
"""

from __future__ import annotations

from minillm.errors import ConfigError

# transformers' Gemma3TextConfig defaults for the fields google/gemma-3-*-it leave out of text_config
# (src/transformers/models/gemma3/configuration_gemma3.py, Gemma3TextConfig.__init__): the vocabulary, context,
# tied lm_head and the 5:1 local/global pattern.
DEFAULTS = {
    "gemma3_text": {"vocab_size": 262_208, "max_position_embeddings": 131_072, "tie_word_embeddings": True,
                    "sliding_window_pattern": 6, "num_key_value_heads": 4, "head_dim": 256},
}  # fmt: skip
NORMS = {"gemma2": 4, "gemma3_text": 4}  # RMSNorms per layer: Gemma adds one before and after the MLP
QK_NORM = ("qwen3", "qwen3_moe", "gemma3_text")  # an RMSNorm of head_dim over each head's query and key
EXPERT_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts")


def flatten(config: dict) -> dict:
    """The language model's own fields: text_config lifted to the top (Gemma 3, multimodal checkpoints), and the
    family's defaults for fields the file leaves out."""
    text = config.get("text_config")
    if isinstance(text, dict):
        config = {**{k: v for k, v in config.items() if k != "text_config"}, **text}
    return {**DEFAULTS.get(config.get("model_type"), {}), **config}


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


def _number(config: dict, key: str, name: str) -> int | None:
    return whole_number(config, key, name)


def _first(config: dict, keys, name: str) -> int | None:
    for key in keys:
        value = _number(config, key, name)
        if value is not None:
            return value
    return None


def expert_fields(config: dict, name: str, layers: int, intermediate: int) -> dict:
    """ModelSpec's expert fields, or {} for a dense model."""
    experts = _first(config, EXPERT_FIELDS, name)
    if not experts:
        return {}
    k = _first(config, ("num_experts_per_tok", "experts_per_token"), name)
    if k is None or not 1 <= k <= experts:
        raise ConfigError(f"config for {name!r} has {experts} experts but num_experts_per_tok = {k}: each token "
                          f"must pick between 1 and {experts} of them")  # fmt: skip
    width = _number(config, "moe_intermediate_size", name) or intermediate
    shared = _number(config, "n_shared_experts", name) or 0
    first_dense = _number(config, "first_k_dense_replace", name) or 0
    every = _number(config, "moe_layer_freq", name) or _number(config, "decoder_sparse_step", name) or 1
    dense_only = config.get("mlp_only_layers") or []
    if not isinstance(dense_only, list) or not all(isinstance(i, int) and 0 <= i < layers for i in dense_only):
        raise ConfigError(f"config for {name!r}: mlp_only_layers must be a list of layer numbers below {layers}")
    if "first_k_dense_replace" in config:  # DeepSeek: dense first, then every `every`-th layer from there
        sparse = [i >= first_dense and i % every == 0 for i in range(layers)]
    else:  # Qwen-MoE: every `every`-th layer, counting from 1, unless listed as MLP only
        sparse = [i not in dense_only and (i + 1) % every == 0 for i in range(layers)]
    model_type = config.get("model_type")
    return {
        "experts": experts,
        "experts_per_token": k,
        "shared_experts": shared,
        "expert_intermediate": width,
        "moe_layers": sum(sparse),
        # gpt-oss: a bias on the router and on every expert's matrices; DeepSeek-V3: the router's per-expert
        # correction bias (e_score_correction_bias, its load balancing without an auxiliary loss)
        "router_bias": model_type == "gpt_oss" or config.get("topk_method") == "noaux_tc",
    }


def latent_fields(config: dict, name: str) -> dict:
    """ModelSpec's multi-head latent attention fields, or {} when the keys and values are cached per head."""
    rank = _number(config, "kv_lora_rank", name)
    if not rank:
        return {}
    dims = {key: _number(config, key, name) for key in ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")}
    missing = [key for key, value in dims.items() if not value or value < 1]
    if missing:
        raise ConfigError(f"config for {name!r} has kv_lora_rank (latent attention) but no {missing}")
    head_dim = dims["qk_nope_head_dim"] + dims["qk_rope_head_dim"]  # a query's and a key's width per head
    q_rank = _number(config, "q_lora_rank", name) or 0  # null (DeepSeek-V2-Lite): queries from the residual
    return {"kv_lora_rank": rank, "q_lora_rank": q_rank, **dims, "head_dim": head_dim}


def window_layers(config: dict, name: str, layers: int, window: int | None) -> int:
    """How many layers keep only the last `window` tokens (0: every layer attends to the whole context)."""
    if not window:
        return 0
    types = config.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers:
            raise ConfigError(f"config for {name!r}: layer_types must list one type for each of its {layers} layers")
        return sum(t == "sliding_attention" for t in types)
    pattern = _number(config, "sliding_window_pattern", name)
    if pattern:  # Gemma 3: layer i is global when (i + 1) is a multiple of the pattern
        return sum((i + 1) % pattern != 0 for i in range(layers))
    return 0


def family_fields(config: dict, name: str, layers: int, intermediate: int, window: int | None) -> dict:
    """Every ModelSpec field beyond the Llama-shaped ones, read from a (flattened) config."""
    kind = config.get("model_type", "llama")
    fields = {**expert_fields(config, name, layers, intermediate), **latent_fields(config, name)}
    fields["window_layers"] = window_layers(config, name, layers, window)
    fields["norms_per_layer"] = NORMS.get(kind, 2)
    fields["attention_sinks"] = kind == "gpt_oss"  # one learned logit per head that soaks up attention
    return fields
