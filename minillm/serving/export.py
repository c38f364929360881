"""Export to (and import from) the standard Llama checkpoint layout, with a tokenizer any server can load.

Our module names already follow Hugging Face's LlamaForCausalLM (checkpoint.llama_layout cuts the matrices the
model fuses back into Llama's), so export is a prefix ("model.") plus a config.json with the usual field names.
Any tool that reads Llama checkpoints can load the folder and compute the same logits.

A server needs more than weights: text in and out, and the chat format. So the folder also holds
  tokenizer.json           minillm's byte-level tokenizer in the `tokenizers` library's format: the 256 bytes
                           (ids 0..255, each written as GPT-2's printable stand-in character, so a vocabulary of
                           strings can hold raw bytes) and <pad> <bos> <eos> <sep> (256..259); plain text gets
                           <bos> in front, as the completions endpoint sends it
  tokenizer_config.json    the special tokens and the chat template: encode_prompt's format, <bos> [system <sep>]
                           user <sep> (the last system and user messages, as the server's chat endpoint takes them)
  generation_config.json   greedy decoding, ending at <eos>
so `transformers serve FOLDER` (or vLLM) serves the same model with the same token ids as minillm.
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import load_file, save_file

from minillm.config import ModelConfig
from minillm.errors import CheckpointError
from minillm.model.checkpoint import fused_layout, llama_layout
from minillm.model.tokenizer import BOS, EOS, PAD, SEP, SPECIAL_NAMES
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
    """Weights, config, tokenizer, chat template and generation defaults: a folder any Llama server loads."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    weights = llama_layout(model.state_dict(), model.cfg)
    tensors = {llama_name(n): t.detach().contiguous().cpu() for n, t in weights.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    files = {"config.json": llama_config(model.cfg), "tokenizer.json": tokenizer_json(),
             "tokenizer_config.json": tokenizer_config(model.cfg.max_seq_len),
             "special_tokens_map.json": {k: v for k, v in tokenizer_config(0).items() if k.endswith("_token")},
             "generation_config.json": {"bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD,
                                        "do_sample": False}}  # fmt: skip
    for name, content in files.items():
        (out / name).write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n")
    return out


EXPORTED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                  "special_tokens_map.json", "generation_config.json")  # fmt: skip

# encode_prompt's format as a Jinja chat template: the last system (or developer) message and the last user message
# (a string, or text parts), as <bos> [system <sep>] user <sep>. The reply starts right after: no generation prompt.
CHAT_TEMPLATE = (
    '{%- set ns = namespace(system="", user="") -%}'
    "{%- for m in messages -%}"
    '{%- set ns.text = "" -%}'
    "{%- if m.content is string -%}{%- set ns.text = m.content -%}"
    "{%- elif m.content -%}{%- for part in m.content if part.type == 'text' -%}"
    "{%- set ns.text = ns.text + part.text -%}{%- endfor -%}{%- endif -%}"
    "{%- if m.role in ['system', 'developer'] -%}{%- set ns.system = ns.text -%}"
    "{%- elif m.role == 'user' -%}{%- set ns.user = ns.text -%}{%- endif -%}"
    "{%- endfor -%}"
    "<bos>{%- if ns.system -%}{{ ns.system }}<sep>{%- endif -%}{{ ns.user }}<sep>"
)


def byte_characters() -> list[str]:
    """Byte b -> the character that stands for it in a byte-level vocabulary (GPT-2's convention, which the
    `tokenizers` library's ByteLevel pre-tokenizer and decoder use): printable Latin-1 bytes are themselves, the
    others (controls, space, DEL, ...) take the characters from U+0100 on, in byte order."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    stand_ins = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(stand_ins)) for b in range(256)]


def tokenizer_json() -> dict:
    """minillm's tokenizer (tokenizer.py) in the `tokenizers` library's JSON: a BPE model with the 256 bytes and no
    merges, so every byte is one token whose id is its value."""
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    special = [{"id": i, "content": name, "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": False, "special": True} for i, name in sorted(SPECIAL_NAMES.items())]  # fmt: skip
    bos = {"SpecialToken": {"id": "<bos>", "type_id": 0}}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": special,
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<bos>": {"id": "<bos>", "ids": [BOS], "tokens": ["<bos>"]}},
        },
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {c: b for b, c in enumerate(byte_characters())},
            "merges": [],
        },  # fmt: skip
    }


def tokenizer_config(max_len: int) -> dict:
    names = {PAD: "pad_token", BOS: "bos_token", EOS: "eos_token", SEP: "sep_token"}
    return {name: SPECIAL_NAMES[i] for i, name in names.items()} | {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_len,
        "chat_template": CHAT_TEMPLATE,
    }


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
