"""Export writes the standard Llama layout, importing it back gives the same logits, and the folder carries what a
server needs: a tokenizer and a chat template that give exactly minillm's token ids. Where transformers is installed
(it is no minillm dependency) it loads the folder with identical logits, and its `transformers serve` serves it to
`load` (skipped, with the reason, where it cannot start)."""

import asyncio
import json

import pytest
import torch
from safetensors import safe_open

from minillm.__main__ import main
from minillm.bench.server import free_port, start_transformers_serve
from minillm.engine.generate import generate
from minillm.model.tokenizer import BOS, EOS, decode, encode, encode_prompt
from minillm.serving.export import CHAT_TEMPLATE, EXPORTED_FILES, export_llama, import_llama
from minillm.serving.loadgen import jobs_from_workload, run_jobs
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


# --- a folder any server can load: tokenizer, chat template, generation defaults ---------------------------
PROMPTS = [(None, "count down from 12"), ("You are a helpful assistant.", "spell 4096"),
           ("Système: réponds en français ✓ <not a token>", "spell 7 ünïcödé 🙂")]  # fmt: skip


def messages_for(preamble: str | None, prompt: str) -> list[dict]:
    return ([{"role": "system", "content": preamble}] if preamble else []) + [{"role": "user", "content": prompt}]


def test_export_writes_every_file_a_server_needs(tmp_path):
    export_llama(random_model("gqa"), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(EXPORTED_FILES)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    names = {k: config[k] for k in ("pad_token", "bos_token", "eos_token", "sep_token")}
    assert names == {"pad_token": "<pad>", "bos_token": "<bos>", "eos_token": "<eos>", "sep_token": "<sep>"}
    generation = json.loads((tmp_path / "generation_config.json").read_text())
    assert (generation["eos_token_id"], generation["bos_token_id"], generation["do_sample"]) == (EOS, BOS, False)
    vocab = json.loads((tmp_path / "tokenizer.json").read_text())["model"]["vocab"]
    assert sorted(vocab.values()) == list(range(256)) and len(set(vocab)) == 256  # every byte, once


def test_the_chat_template_writes_encode_prompts_format():
    jinja2 = pytest.importorskip("jinja2.sandbox", reason="jinja2 (it comes with jupyter) renders chat templates")
    template = jinja2.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(CHAT_TEMPLATE)
    render = lambda messages: template.render(messages=messages, add_generation_prompt=True, bos_token="<bos>")
    for preamble, prompt in PROMPTS:
        want = f"<bos>{preamble}<sep>{prompt}<sep>" if preamble else f"<bos>{prompt}<sep>"
        assert render(messages_for(preamble, prompt)) == want
    conversation = [
        {"role": "system", "content": "old"},
        {"role": "user", "content": "count down from 3"},
        {"role": "assistant", "content": "3 2 1"},
        {"role": "developer", "content": "new"},
        {"role": "user", "content": [{"type": "text", "text": "spell "}, {"type": "text", "text": "9"}]},
    ]
    assert render(conversation) == "<bos>new<sep>spell 9<sep>"  # the last system and user messages, as the server


def test_the_tokenizer_and_template_give_minillms_ids(tmp_path):
    import tokenizers  # (pinned in requirements.txt: a missing install fails here, it is not skipped)

    jinja2 = pytest.importorskip("jinja2.sandbox", reason="jinja2 (it comes with jupyter) renders chat templates")
    export_llama(random_model("gqa"), tmp_path)
    tokenizer = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    template = jinja2.ImmutableSandboxedEnvironment().from_string(CHAT_TEMPLATE)
    for preamble, prompt in PROMPTS:
        chat_text = template.render(messages=messages_for(preamble, prompt), bos_token="<bos>")
        assert tokenizer.encode(chat_text, add_special_tokens=False).ids == encode_prompt(prompt, preamble)
        assert tokenizer.encode(prompt).ids == [BOS, *encode(prompt)]  # plain text: <bos> first (completions)
        assert tokenizer.decode(encode(prompt)) == prompt
    every_byte = bytes(range(256)).decode("latin-1")  # (each of these characters is 1 or 2 UTF-8 bytes)
    assert tokenizer.encode(every_byte, add_special_tokens=False).ids == encode(every_byte)


@pytest.fixture(scope="module")
def exported(shipped_model, tmp_path_factory):
    return export_llama(shipped_model, tmp_path_factory.mktemp("export"))


def test_transformers_loads_the_export_with_identical_logits_and_ids(exported, shipped_model):
    transformers = pytest.importorskip("transformers", reason="transformers is not a minillm dependency")
    model = transformers.AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(exported)
    for preamble, prompt in PROMPTS:
        ids = tokenizer.apply_chat_template(messages_for(preamble, prompt), tokenize=True, add_generation_prompt=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        assert list(ids) == encode_prompt(prompt, preamble)
        tokens = torch.tensor([ids])
        with torch.no_grad():
            torch.testing.assert_close(model(tokens).logits, shipped_model(tokens), rtol=1e-4, atol=1e-4)
    assert tokenizer(PROMPTS[0][1])["input_ids"] == [BOS, *encode(PROMPTS[0][1])]


@pytest.mark.slow
def test_transformers_serve_serves_the_export_and_load_drives_it(exported, shipped_model, capsys):
    port = free_port()
    try:
        server = start_transformers_serve(exported, port, continuous_batching=False)  # (faster on a CPU)
    except RuntimeError as e:
        pytest.skip(str(e))
    try:
        url = f"http://127.0.0.1:{port}/v1"
        jobs = jobs_from_workload("chat", 6, seed=4)
        outcomes = asyncio.run(run_jobs(url, jobs, model=str(exported)))
        code = main(["load", "--url", url, "--model", str(exported), "--requests", "4", "--json"])
        summary = json.loads(capsys.readouterr().out)
    finally:
        server.terminate()
        server.wait(30)
    assert code == 0 and summary["finished"] == 4 and summary["errors"] == 0
    for o in outcomes:
        want = generate(shipped_model, encode_prompt(o.job.prompt, o.job.preamble), o.job.max_tokens).tokens
        assert o.error is None and o.text == decode(want), o.job
        assert o.output_tokens == len(want)  # counted from the text: no end token, whatever its usage says
