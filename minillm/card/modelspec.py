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

The models people run now change three of those lines (families.py reads each from its family's fields):

    experts     some layers' MLP is E routed experts (each a SwiGLU of expert_intermediate) and a router
                (E x hidden); each token runs k of them, plus any shared experts: a token multiplies through k,
                the checkpoint holds E (DeepSeek-V3: 671 B parameters, 37 B of them used by any one token)
    latent      DeepSeek's multi-head latent attention: q through a low-rank latent (hidden x q_lora_rank, then
                q_lora_rank x heads x (nope + rope)); keys and values through one shared latent (hidden x
                (kv_lora_rank + rope), then kv_lora_rank x heads x (nope + v)); o: heads x v x hidden
    windows     some layers see only the last sliding_window tokens: the same weights, less KV (kv_layout.py)

OPT (Zhang et al., 2022; model_type "opt") is the older decoder the 2023 serving papers measured: a plain MLP of two
matrices (fc1, ReLU, fc2: 2 x hidden x ffn_dim, not SwiGLU's 3), biases on every linear, LayerNorms (a weight and a
bias), a learned position table, lm_head tied to the embedding. Its config names the MLP width ffn_dim.

`load_spec("llama-3.1-8b")` reads a shipped file from minillm/card/models/; any other config.json
works by path. Fields follow the config: head_dim, when missing, is hidden_size / heads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from minillm.card.families import QK_NORM, family_fields, flatten, whole_number
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
    sliding_window: int | None = None  # tokens a local layer sees (Mistral-7B-v0.1: 4096, priced as full: families.py)
    window_layers: int = 0  # layers that keep only the last sliding_window tokens (Gemma-3-27B: 52 of 62)
    norms_per_layer: int = 2  # RMSNorm weights of hidden per layer (Gemma: 4)
    gated_mlp: bool = True  # SwiGLU: gate, up and down; False: a plain MLP of two matrices, up and down (OPT)
    norm_bias: bool = False  # LayerNorm: a bias beside every norm weight (OPT)
    position_embeddings: int = 0  # rows of a learned position table (OPT: max_position_embeddings + 2)
    attention_sinks: bool = False  # gpt-oss: one learned logit per head and layer
    # mixture of experts (experts = 0: every layer's MLP is dense, of `intermediate`)
    experts: int = 0  # E routed experts per MoE layer
    experts_per_token: int = 0  # k: the router picks k of the E for each token
    shared_experts: int = 0  # experts every token runs (DeepSeek-V3: 1)
    expert_intermediate: int = 0  # one expert's SwiGLU width
    moe_layers: int = 0  # layers whose MLP is experts; the other layers' is dense, of `intermediate`
    router_bias: bool = False  # a bias per expert on the router (gpt-oss; DeepSeek-V3's correction bias)
    # multi-head latent attention (kv_lora_rank = 0: keys and values cached per kv head)
    kv_lora_rank: int = 0  # the cached latent's width per layer (DeepSeek-V3: 512)
    q_lora_rank: int = 0  # the query's latent (0: queries straight from the residual)
    qk_rope_head_dim: int = 0  # each key's rotary part, cached beside the latent (64); head_dim = nope + rope
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0

    # --- parameters, by where they sit ---------------------------------------------------------------
    @property
    def mlp_matrices(self) -> int:
        """Matrices of hidden x intermediate in a dense MLP: 3 for SwiGLU, 2 for a plain one."""
        return 3 if self.gated_mlp else 2

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def latent(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def dense_layers(self) -> int:
        return self.layers - self.moe_layers

    @property
    def attention_params(self) -> int:
        """Matrices of one layer's attention: q, k, v, o (latent: the down- and up-projections of q and of k/v)."""
        if not self.latent:
            return self.hidden * (self.q_dim + 2 * self.kv_dim) + self.q_dim * self.hidden
        q_out = self.heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        q = self.hidden * self.q_lora_rank + self.q_lora_rank * q_out if self.q_lora_rank else self.hidden * q_out
        kv = self.hidden * (self.kv_lora_rank + self.qk_rope_head_dim)
        kv += self.kv_lora_rank * self.heads * (self.qk_nope_head_dim + self.v_head_dim)
        return q + kv + self.heads * self.v_head_dim * self.hidden

    @property
    def expert_params(self) -> int:
        """One expert's gate, up and down matrices in one layer."""
        return 3 * self.hidden * self.expert_intermediate

    @property
    def expert_bias_params(self) -> int:
        return (2 * self.expert_intermediate + self.hidden) * self.mlp_bias

    @property
    def layer_matmul_params(self) -> int:
        """Weights one token multiplies through in one dense layer: the four attention and the MLP's matrices."""
        return self.attention_params + self.mlp_matrices * self.hidden * self.intermediate

    @property
    def moe_layer_matmul_params(self) -> int:
        """Matrices one MoE layer holds: attention, every expert (routed and shared) and the router."""
        return self.attention_params + (self.experts + self.shared_experts) * self.expert_params + self.router_params

    @property
    def router_params(self) -> int:
        return self.experts * self.hidden

    @property
    def matmul_params(self) -> int:
        """Every layer's matrices, every expert's included: what the weights' dtype applies to."""
        return self.dense_layers * self.layer_matmul_params + self.moe_layers * self.moe_layer_matmul_params

    @property
    def active_matmul_params(self) -> int:
        """The matrices one token multiplies through, over all layers: 2 FLOPs each."""
        unpicked = self.moe_layers * (self.experts - self.experts_per_token) * self.expert_params
        return self.matmul_params - unpicked

    @property
    def layer_small_params(self) -> int:
        """Biases and norm weights of one dense layer: read, never multiplied through."""
        n = 2 * self.hidden * (1 + self.norm_bias)  # input and post-attention norm
        n += (self.q_dim + 2 * self.kv_dim) * self.qkv_bias + self.hidden * self.o_bias
        n += ((self.mlp_matrices - 1) * self.intermediate + self.hidden) * self.mlp_bias
        return n + 2 * self.head_dim * self.qk_norm

    @property
    def small_params(self) -> int:
        """Biases and norm weights of all layers (and the experts' and the router's biases)."""
        extra = (self.norms_per_layer - 2) * self.hidden + self.q_lora_rank + self.kv_lora_rank  # Gemma; MLA's norms
        extra += self.heads * self.attention_sinks
        dense_mlp_bias = (2 * self.intermediate + self.hidden) * self.mlp_bias  # (layer_small_params counts it)
        moe = self.experts * (self.expert_bias_params + self.router_bias) - dense_mlp_bias  # an MoE layer's instead
        return self.layers * (self.layer_small_params + extra) + self.moe_layers * moe

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
        final_norm = self.hidden * (1 + self.norm_bias)
        tables = self.embedding_params + self.position_embeddings * self.hidden
        return self.matmul_params + self.small_params + tables + self.lm_head_params + final_norm

    @property
    def active_parameters(self) -> int:
        """Parameters one token uses: all but the routed experts its router did not pick (the embedding table counted
        whole, as Mistral, Qwen and DeepSeek count "activated" parameters)."""
        unpicked = self.experts - self.experts_per_token
        return self.num_parameters - self.moe_layers * unpicked * (self.expert_params + self.expert_bias_params)


def spec_from_config(config: dict, name: str) -> ModelSpec:
    """A ModelSpec from a Hugging Face config.json's fields (Llama, Mistral, Qwen2, Qwen3; and the families.py reads:
    Mixtral, Qwen3-MoE, DeepSeek-V2/V3, gpt-oss, Gemma 3)."""
    config = flatten(config)
    opt = config.get("model_type") == "opt"
    if opt:  # transformers' OPTConfig: ffn_dim is the MLP width; lm_head is tied (PretrainedConfig's default)
        config = {"intermediate_size": config.get("ffn_dim"), "tie_word_embeddings": True, **config}
        if config.get("word_embed_proj_dim", config.get("hidden_size")) != config.get("hidden_size"):
            raise ConfigError(f"{name}: OPT's project_in/project_out (word_embed_proj_dim) are not priced")
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
    attention_bias = bool(config.get("attention_bias", config.get("enable_bias", opt)))  # OPTConfig.enable_bias: True
    extra = family_fields(config, name, sizes["num_hidden_layers"], sizes["intermediate_size"],
                          window if window and window > 0 else None)  # fmt: skip
    head_dim = extra.pop("head_dim", head_dim)  # latent attention: a query/key head is nope + rope wide
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
        # gpt-oss' experts carry biases (no field says so); OPT's fc1 and fc2 do (enable_bias)
        mlp_bias=bool(config.get("mlp_bias", kind == "gpt_oss" or (opt and attention_bias))),
        qk_norm=kind in QK_NORM,
        max_context=max_context if max_context and max_context > 0 else None,
        sliding_window=window if window and window > 0 else None,
        gated_mlp=not opt,
        norm_bias=opt,
        # transformers' OPTLearnedPositionalEmbedding: "offset the embedding ids by 2", the table 2 rows longer
        position_embeddings=max_context + 2 if opt and max_context else 0,
        **extra,
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
