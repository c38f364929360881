"""Export writes the standard Llama layout; importing it back gives the same logits."""

import json

import pytest
import torch
from safetensors import safe_open

from minillm.serving.export import export_llama, import_llama
from tests.conftest import random_model


def test_export_names_shapes_and_round_trip(tmp_path):
    model = random_model("gqa")
    cfg = model.cfg
    export_llama(model, tmp_path)
    hf = json.loads((tmp_path / "config.json").read_text())
    assert hf["hidden_size"] == cfg.dim and hf["num_key_value_heads"] == cfg.n_kv_heads
    assert hf["num_hidden_layers"] == cfg.n_layers and hf["intermediate_size"] == cfg.ffn_dim
    for field in ["rms_norm_eps", "rope_theta", "vocab_size", "max_position_embeddings", "tie_word_embeddings"]:
        assert field in hf
    kv = cfg.n_kv_heads * cfg.head_dim
    expected = {"model.embed_tokens.weight": (cfg.vocab_size, cfg.dim), "model.norm.weight": (cfg.dim,)}
    expected["lm_head.weight"] = (cfg.vocab_size, cfg.dim)
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}."
        expected |= {
            p + "self_attn.q_proj.weight": (cfg.dim, cfg.dim),
            p + "self_attn.k_proj.weight": (kv, cfg.dim),
            p + "self_attn.v_proj.weight": (kv, cfg.dim),
            p + "self_attn.o_proj.weight": (cfg.dim, cfg.dim),
            p + "mlp.gate_proj.weight": (cfg.ffn_dim, cfg.dim),
            p + "mlp.up_proj.weight": (cfg.ffn_dim, cfg.dim),
            p + "mlp.down_proj.weight": (cfg.dim, cfg.ffn_dim),
            p + "input_layernorm.weight": (cfg.dim,),
            p + "post_attention_layernorm.weight": (cfg.dim,),
        }
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        shapes = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    assert shapes == expected

    tokens = torch.randint(0, 256, (2, 17))
    with torch.no_grad():
        torch.testing.assert_close(import_llama(tmp_path)(tokens), model(tokens))


def test_transformers_reads_the_export_with_the_same_logits(tmp_path):
    """The export is the standard layout for real: Hugging Face's own Llama computes our logits (when installed)."""
    transformers = pytest.importorskip("transformers", reason="transformers is not a minillm dependency")
    model = random_model("gqa")
    export_llama(model, tmp_path)
    theirs = transformers.LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    tokens = torch.randint(0, 256, (2, 17))
    with torch.no_grad():
        torch.testing.assert_close(theirs(tokens).logits, model(tokens), rtol=1e-4, atol=1e-5)
