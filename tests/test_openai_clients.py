"""The requests the field's own clients send, as they send them: guidellm's stream_options (vLLM's
continuous_usage_stats beside OpenAI's include_usage), OpenAI's include_obfuscation, and lm-eval's prompts as token
ids, several to a request, on /v1/completions. The real server, its engine in a process of its own (conftest.server).
"""

from __future__ import annotations

import json

import pytest
import torch

from minillm.layers import generate
from minillm.model.tokenizer import BOS, VOCAB_SIZE, decode, encode, encode_prompt
from minillm.serving.openai_output import token_text

GUIDELLM = {"include_usage": True, "continuous_usage_stats": True}  # what guidellm 0.8.1 sends, always


def sse(client, url: str, body: dict) -> list:
    with client.stream("POST", url, json=body | {"stream": True}) as response:
        assert response.status_code == 200, response.read()
        lines = [line[6:] for line in response.iter_lines() if line]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def plain(model, ids: list[int], max_tokens: int) -> list[int]:
    """The offline loop's greedy reply (EOS dropped, as the server counts)."""
    tokens = generate(model, ids, max_tokens, use_cache=False).tokens
    return [t for t in tokens if t < 256]


def error_of(response, param: str) -> str:
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param, response.json()
    return response.json()["error"]["message"]


# --- stream_options --------------------------------------------------------------------------------
@pytest.mark.parametrize("endpoint", ["completions", "chat/completions"])
def test_guidellms_stream_options_get_usage_on_every_chunk_and_a_last_one(server, client, shipped_model, endpoint):
    chat = endpoint.startswith("chat")
    ask = {"messages": [{"role": "user", "content": "spell 305"}]} if chat else {"prompt": "spell 305"}
    chunks = sse(client, f"{server.url}/{endpoint}", ask | {"max_tokens": 12, "stream_options": GUIDELLM})
    prompt = encode_prompt("spell 305") if chat else [BOS, *encode("spell 305")]
    want = plain(shipped_model, prompt, 12)
    assert all("usage" in c for c in chunks)  # continuous_usage_stats: every chunk
    *pieces, last = chunks
    assert last["choices"] == [] and last["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": len(want),
                                                       "total_tokens": len(prompt) + len(want)}  # fmt: skip
    made = [c["usage"]["completion_tokens"] for c in pieces]
    assert made == sorted(made) and made[-1] == len(want)  # the counts so far, never going back
    assert all(c["usage"]["prompt_tokens"] == len(prompt) for c in pieces)
    text = "".join(c["choices"][0]["delta"].get("content", "") if chat else c["choices"][0]["text"] for c in pieces)
    assert text == decode(want)


def test_continuous_usage_goes_with_include_usage_and_obfuscation_is_accepted(server, client):
    """As vLLM: continuous_usage_stats alone adds nothing; include_obfuscation has nothing to pad on loopback."""
    url, ask = f"{server.url}/completions", {"prompt": "spell 4", "max_tokens": 4}
    alone = sse(client, url, ask | {"stream_options": {"continuous_usage_stats": True}})
    assert not any("usage" in c for c in alone)
    for options in ({"include_obfuscation": True}, {"include_obfuscation": False, "include_usage": True}):
        chunks = sse(client, url, ask | {"stream_options": options})
        assert ("usage" in chunks[-1]) == options.get("include_usage", False)
    error_of(
        client.post(url, json=ask | {"stream": True, "stream_options": {"include_usage": "yes"}}), "stream_options"
    )
    message = error_of(client.post(url, json=ask | {"stream_options": {"obfuscate": True}}), "stream_options")
    assert "continuous_usage_stats" in message and "include_obfuscation" in message


def test_the_openai_client_reads_usage_from_the_stream(server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url, api_key="none")
    options = {"include_usage": True, "include_obfuscation": True}
    messages = [{"role": "user", "content": "spell 7"}]
    stream = client.chat.completions.create(
        model="minillm", messages=messages, max_tokens=8, stream=True, stream_options=options
    )
    chunks = list(stream)
    assert chunks[-1].usage.prompt_tokens == len(encode_prompt("spell 7")) and chunks[-1].usage.completion_tokens
    usage = [c.usage for c in client.completions.create(model="minillm", prompt="spell 7", max_tokens=3, stream=True,
                                                         stream_options=GUIDELLM)]  # fmt: skip
    assert all(u is not None for u in usage) and usage[-1].prompt_tokens == 1 + len("spell 7")


# --- prompts as OpenAI takes them ------------------------------------------------------------------------
def test_a_prompt_as_token_ids_goes_to_the_model_as_sent(server, client, shipped_model):
    ids = [BOS, *encode("count down from 6")]
    reply = client.post(f"{server.url}/completions", json={"prompt": ids, "max_tokens": 20}).json()
    text = client.post(f"{server.url}/completions", json={"prompt": "count down from 6", "max_tokens": 20}).json()
    assert reply["choices"][0]["text"] == text["choices"][0]["text"] == decode(plain(shipped_model, ids, 20))
    assert reply["usage"]["prompt_tokens"] == len(ids)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_several_prompts_are_several_choices_in_their_order(server, client, shipped_model, stream):
    prompts = ["spell 12", [BOS, *encode("count down from 5")], "spell 3"]
    body = {"prompt": prompts[::2], "max_tokens": 16}  # an array of strings
    as_ids = {"prompt": [p if isinstance(p, list) else [BOS, *encode(p)] for p in prompts], "max_tokens": 16}
    for ask in (body, as_ids):
        sent = ask["prompt"]
        want = [decode(plain(shipped_model, p if isinstance(p, list) else [BOS, *encode(p)], 16)) for p in sent]
        prompt_tokens = sum(len(p) if isinstance(p, list) else 1 + len(p) for p in sent)
        if stream:
            chunks = sse(client, f"{server.url}/completions", ask | {"stream_options": {"include_usage": True}})
            texts = ["".join(c["choices"][0]["text"] for c in chunks[:-1] if c["choices"][0]["index"] == i)
                     for i in range(len(sent))]  # fmt: skip
            finishes = [c["choices"][0]["finish_reason"] for c in chunks[:-1] if c["choices"][0]["finish_reason"]]
            usage = chunks[-1]["usage"]
            assert len(finishes) == len(sent)
        else:
            reply = client.post(f"{server.url}/completions", json=ask).json()
            assert [c["index"] for c in reply["choices"]] == list(range(len(sent)))
            texts, usage = [c["text"] for c in reply["choices"]], reply["usage"]
        assert texts == want
        assert usage["prompt_tokens"] == prompt_tokens
        assert usage["completion_tokens"] == sum(len(encode(t)) for t in want)


def test_the_openai_client_sends_token_ids_and_batches(server, shipped_model):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url, api_key="none")
    reply = client.completions.create(model="minillm", prompt=[[BOS, *encode("spell 8")], [BOS, *encode("spell 9")]],
                                      max_tokens=10)  # fmt: skip
    want = [decode(plain(shipped_model, [BOS, *encode(p)], 10)) for p in ("spell 8", "spell 9")]
    assert [c.index for c in reply.choices] == [0, 1] and [c.text for c in reply.choices] == want


BAD_PROMPTS = {
    "a token id past the vocabulary": ([BOS, VOCAB_SIZE], f"[0, {VOCAB_SIZE - 1}]"),
    "a negative token id": ([-1, 5], f"[0, {VOCAB_SIZE - 1}]"),
    "a token id past the vocabulary, in a batch": ([[BOS, 5], [BOS, 10**6]], f"[0, {VOCAB_SIZE - 1}]"),
    "an empty array": ([], "array of token ids"),
    "an empty array of ids in a batch": ([[BOS], []], "array of token ids"),
    "strings and ids mixed": (["spell 4", [BOS, 5]], "array of token ids"),
    "a float id": ([BOS, 1.5], "array of token ids"),
    "a boolean id": ([True, 5], "array of token ids"),
    "an empty string in a batch": (["spell 4", " "], "empty"),
    "too many prompts": (["spell 4"] * 129, "at most 128"),
}  # fmt: skip


@pytest.mark.parametrize("prompt,needle", BAD_PROMPTS.values(), ids=BAD_PROMPTS.keys())
def test_bad_prompts_are_400_naming_what_is_allowed(server, client, prompt, needle):
    assert needle in error_of(client.post(f"{server.url}/completions", json={"prompt": prompt}), "prompt")
    assert client.post(f"{server.url}/completions", json={"prompt": "spell 4", "max_tokens": 2}).status_code == 200


# --- echo: the prompt scored (lm-eval's loglikelihood) -------------------------------------------------------
def model_logprobs(model, ids: list[int]) -> torch.Tensor:
    """Row i: the model's log-probabilities for the token after ids[:i + 1] (one plain forward, offline)."""
    with torch.no_grad():
        return model(torch.tensor([ids]))[0].float().log_softmax(-1)


def test_echo_with_max_tokens_0_scores_the_prompt_as_the_model_does(server, client, shipped_model):
    body = {"prompt": "count down from 7", "echo": True, "logprobs": 2, "max_tokens": 0}
    reply = client.post(f"{server.url}/completions", json=body).json()
    (choice,) = reply["choices"]
    ids = [BOS, *encode("count down from 7")]
    assert choice["text"] == "count down from 7" and choice["finish_reason"] == "length"
    assert reply["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 0, "total_tokens": len(ids)}
    logprobs, want = choice["logprobs"], model_logprobs(shipped_model, ids)
    assert logprobs["tokens"] == ["<bos>", *"count down from 7"]
    assert logprobs["text_offset"] == [0, *range(len("count down from 7"))]
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None  # nothing came before it
    got = logprobs["token_logprobs"][1:]
    assert got == pytest.approx([want[i, t].item() for i, t in enumerate(ids[1:])], abs=1e-4)
    for i, top in enumerate(logprobs["top_logprobs"][1:]):  # the 2 likeliest there, and the prompt's own token
        best = want[i].topk(2)
        assert {token_text(t) for t in best.indices.tolist()} <= set(top)
        assert top[logprobs["tokens"][i + 1]] == pytest.approx(got[i], abs=1e-6)
        assert sorted(top.values(), reverse=True)[:2] == pytest.approx(best.values.tolist(), abs=1e-4)


def test_lm_evals_loglikelihood_request_token_ids_echo_and_one_token(server, client, shipped_model):
    """lm-eval's local-completions sends context + continuation as token ids, echo, logprobs 1, max_tokens 1, and
    sums token_logprobs[ctxlen:-1]: the continuation's log-likelihood given the context."""
    context, continuation = [BOS, *encode("spell 42")], encode(" forty two")
    ids, ctxlen = context + continuation, len(context)
    batch = [ids, [BOS, *encode("count down from 3")]]
    body = {"prompt": batch, "echo": True, "logprobs": 1, "max_tokens": 1, "temperature": 0}
    reply = client.post(f"{server.url}/completions", json=body).json()
    first = reply["choices"][0]
    assert [c["index"] for c in reply["choices"]] == [0, 1] and first["text"].startswith("spell 42 forty two")
    assert len(first["logprobs"]["token_logprobs"]) == len(ids) + 1  # the prompt's tokens, then the one made
    want = model_logprobs(shipped_model, ids)
    offline = sum(want[i - 1, ids[i]].item() for i in range(ctxlen, len(ids)))
    assert sum(first["logprobs"]["token_logprobs"][ctxlen:-1]) == pytest.approx(offline, abs=1e-4)
    assert reply["usage"]["prompt_tokens"] == len(ids) + len(batch[1])
    # a reply that ended at once shows its EOS (lm-eval drops the last token it gets), which no usage counts
    ended = [c["logprobs"]["tokens"][-1] == "<eos>" for c in reply["choices"]]
    assert any(ended) and reply["usage"]["completion_tokens"] == ended.count(False)
    assert all(len(c["logprobs"]["tokens"]) == len(p) + 1 for c, p in zip(reply["choices"], batch))


def test_echo_without_logprobs_and_streamed_echo(server, client, shipped_model):
    ids = [BOS, *encode("spell 6")]
    made = decode(plain(shipped_model, ids, 8))
    reply = client.post(f"{server.url}/completions", json={"prompt": "spell 6", "echo": True, "max_tokens": 8})
    assert reply.json()["choices"][0]["text"] == "spell 6" + made and reply.json()["choices"][0]["logprobs"] is None
    body = {"prompt": ["spell 6", "spell 6"], "echo": True, "logprobs": 0, "max_tokens": 8, "stream_options": GUIDELLM}
    chunks = sse(client, f"{server.url}/completions", body)
    for i in (0, 1):
        mine = [c["choices"][0] for c in chunks[:-1] if c["choices"][0]["index"] == i]
        assert mine[0]["text"] == "spell 6" and mine[0]["logprobs"]["token_logprobs"][0] is None  # the prompt first
        assert "".join(c["text"] for c in mine) == "spell 6" + made
        offsets = [o for c in mine for o in c["logprobs"]["text_offset"]]
        ended = [len("spell 6" + made)] if len(encode(made)) < 8 else []  # (an EOS shown after the text)
        assert offsets == [0, *range(len("spell 6" + made)), *ended]
    assert chunks[-1]["usage"]["completion_tokens"] == 2 * len(encode(made))
    scored = sse(client, f"{server.url}/completions", body | {"max_tokens": 0})
    assert [c["choices"][0]["text"] for c in scored[:-1]] == ["spell 6", "spell 6"]
    assert scored[-1]["usage"]["completion_tokens"] == 0


def test_echo_limits_are_400s(server, client):
    url = f"{server.url}/completions"
    error_of(client.post(url, json={"prompt": "spell 4", "max_tokens": 0}), "max_tokens")  # (0: only with echo)
    error_of(client.post(url, json={"prompt": "spell 4", "echo": True, "max_tokens": -1}), "max_tokens")
    error_of(client.post(url, json={"prompt": "spell 4", "echo": "yes"}), "echo")
    chat = {"messages": [{"role": "user", "content": "spell 4"}], "echo": True}
    assert "echo" in error_of(client.post(f"{server.url}/chat/completions", json=chat), "echo")  # (completions' only)


def test_vllm_bench_serves_completions_body_is_served_and_a_real_penalty_refused(server, client):
    """`vllm bench serve`'s default backend sends exactly this (vllm/benchmarks/lib/endpoint_request_func.py,
    async_request_openai_completions): the neutral repetition_penalty 1.0 asks for nothing; another value is a 400."""
    body = {"model": "minillm", "prompt": "count down from 9", "repetition_penalty": 1.0, "max_tokens": 8,
            "logprobs": None, "stream_options": {"include_usage": True}, "ignore_eos": True}  # fmt: skip
    chunks = sse(client, f"{server.url}/completions", body)
    assert chunks[-1]["usage"]["completion_tokens"] == 8
    refused = client.post(f"{server.url}/completions", json=body | {"repetition_penalty": 1.2})
    assert "repetition_penalty" in error_of(refused, "repetition_penalty")
