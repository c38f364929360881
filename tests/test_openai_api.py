"""The OpenAI API's options through the server, as a client relies on them: sampling per request, stop strings,
logprobs, refused options, error objects for every status, limits before work, and no 500 whatever the body.

The module's server runs its engine in a process of its own (as `serve` does); the fuzz test uses a small random
model on an engine thread, so hypothesis's hundred bodies take seconds.
"""

from __future__ import annotations

import json

import httpx
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minillm.config import ModelConfig
from minillm.layers import generate
from minillm.model.tokenizer import EOS, decode, encode_prompt
from minillm.model.transformer import Transformer
from minillm.serving.server import ServerThread, build_loop

MAX_BODY = 1_000_000  # a server refuses bigger bodies by default (--max-body-bytes)


def chat(client, server, prompt: str = "count down from 9", **options) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": prompt}]} | options
    return client.post(f"{server.url}/chat/completions", content=json.dumps(body))  # (escaped: surrogates go too)


def streamed(client, server, prompt: str, **options) -> list:
    body = {"messages": [{"role": "user", "content": prompt}], "stream": True} | options
    with client.stream("POST", f"{server.url}/chat/completions", json=body) as response:
        assert response.status_code == 200, response.read()
        lines = [line for line in response.iter_lines() if line]
    return [line[6:] if line == "data: [DONE]" else json.loads(line[6:]) for line in lines]


def metric(client, server, name: str) -> float:
    text = client.get(f"{server.base}/metrics").text
    return float(next(line.split()[1] for line in text.splitlines() if line.startswith(f"minillm_{name} ")))


def error_of(response: httpx.Response, status: int, param: str | None = None) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert param is None or error["param"] == param, error
    return error["message"]


# --- sampling --------------------------------------------------------------------------------------
def test_a_seeded_request_gets_the_same_reply_as_the_plain_loop_whatever_runs_beside_it(server, client, shipped_model):
    ask = {"temperature": 2.0, "top_p": 0.95, "top_k": 40, "seed": 11, "max_tokens": 24, "return_token_ids": True}
    alone = chat(client, server, "spell 90210", **ask).json()["choices"][0]["token_ids"]
    with client.stream("POST", f"{server.url}/chat/completions",
                       json={"messages": [{"role": "user", "content": "count down from 50"}], "stream": True,
                             "temperature": 1.0, "seed": 3}) as busy:  # fmt: skip
        next(busy.iter_lines())  # another sampled request runs beside it
        beside = chat(client, server, "spell 90210", **ask).json()["choices"][0]["token_ids"]
    ids = encode_prompt("spell 90210")
    plain = generate(shipped_model, ids, 24, temperature=2.0, top_p=0.95, top_k=40, seed=11, use_cache=False).tokens
    assert alone == beside == plain
    # (at OpenAI's highest temperature, 2, this model is too sure of its spelling for top_p 0.95 to leave a choice)
    flat = ask | {"top_p": 1.0}
    one, other = (chat(client, server, "spell 90210", **flat | {"seed": s}).json()["choices"][0]["token_ids"]
                  for s in (11, 12))  # fmt: skip
    greedy = chat(client, server, "spell 90210", max_tokens=24, return_token_ids=True).json()["choices"][0]
    assert other != one and greedy["token_ids"] == generate(shipped_model, ids, 24, use_cache=False).tokens


def test_n_replies_are_n_choices_each_its_lone_seeded_twin_whole_or_streamed(server, client, shipped_model):
    """OpenAI's n: the prompt runs once (layers/replies.py), choice i draws from seed + i, as vLLM's children do."""
    ask = {"n": 3, "temperature": 2.0, "seed": 4, "max_tokens": 16, "return_token_ids": True, "ignore_eos": True}
    ids = encode_prompt("what is 7")  # (a question it was never taught: its replies part at temperature 2)
    twins = [generate(shipped_model, ids, 16, temperature=2.0, seed=4 + i, use_cache=False, ignore_eos=True).tokens
             for i in range(3)]  # fmt: skip
    whole = chat(client, server, "what is 7", **ask).json()
    assert [c["index"] for c in whole["choices"]] == [0, 1, 2]
    assert [c["token_ids"] for c in whole["choices"]] == twins and len({tuple(t) for t in twins}) > 1
    assert whole["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 48, "total_tokens": len(ids) + 48}
    chunks = [c for c in streamed(client, server, "what is 7", **ask) if isinstance(c, dict) and c["choices"]]
    texts = ["".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"][0]["index"] == i)
             for i in range(3)]  # fmt: skip
    assert texts == [c["message"]["content"] for c in whole["choices"]]
    prompts = {"prompt": ["spell 12", "spell 3"], "n": 2, "max_tokens": 8}  # reply j to prompt k: choice 2k + j
    texts = [c["text"] for c in client.post(f"{server.url}/completions", json=prompts).json()["choices"]]
    assert texts[0] == texts[1] != texts[2] == texts[3]  # (greedy: a prompt's replies are one reply)


BAD_SAMPLING = [("temperature", "hot"), ("temperature", -0.1), ("temperature", True), ("top_p", 0), ("top_p", 1.5),
                ("top_k", -1), ("top_k", 1.5), ("seed", -1), ("seed", "7"), ("seed", 2**64)]  # fmt: skip


@pytest.mark.parametrize("field,value", BAD_SAMPLING)
def test_bad_sampling_values_are_400_naming_the_field(server, client, field, value):
    error_of(chat(client, server, **{field: value}), 400, param=field)


def test_nan_and_infinity_are_400(server, client):
    for raw in (b"NaN", b"Infinity", b"-Infinity"):
        body = b'{"messages": [{"role": "user", "content": "spell 4"}], "temperature": ' + raw + b"}"
        response = client.post(f"{server.url}/chat/completions", content=body)
        assert "temperature must be a number" in error_of(response, 400, param="temperature")


# --- stop strings ----------------------------------------------------------------------------------
def test_a_stop_string_ends_the_reply_without_it(server, client):
    whole = chat(client, server, "count down from 9", stop=["5"], return_token_ids=True).json()
    choice = whole["choices"][0]
    assert choice["message"]["content"] == "9 8 7 6 " and choice["finish_reason"] == "stop"
    assert decode(choice["token_ids"]) == "9 8 7 6 5"  # counted: the tokens up to the stop string's end
    assert whole["usage"]["completion_tokens"] == len("9 8 7 6 5")
    assert chat(client, server, "count down from 9", stop="7 6").json()["choices"][0]["message"]["content"] == "9 8 "


def test_a_stop_string_split_over_chunks_is_held_back_and_the_seat_freed(server, client):
    """Every token is a chunk of its own: "3 2" arrives over three chunks, and none of it may be sent."""
    messages = streamed(client, server, "count down from 30", stop=["3 2", "never"],
                        stream_options={"include_usage": True})  # fmt: skip
    assert messages[-1] == "[DONE]"
    chunks, usage = messages[:-2], messages[-2]["usage"]
    text = "".join(m["choices"][0]["delta"].get("content", "") for m in chunks)
    full = chat(client, server, "count down from 30").json()["choices"][0]["message"]["content"]
    assert text == full[: full.index("3 2")] and chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert usage["completion_tokens"] == full.index("3 2") + 3
    trace = client.get(f"{server.base}/trace").json()
    stopped = next(r for r in reversed(trace["requests"]) if r["finish_reason"] == "stop")
    assert len(stopped["output_ids"]) < len(full)  # told to stop: it did not run on to EOS
    assert metric(client, server, "kv_blocks_used") == 0 and metric(client, server, "requests_running") == 0


@pytest.mark.parametrize(
    "stop", [["a", "b", "c", "d", "e"], [""], [3], "\ud800"], ids=["five", "empty", "int", "surrogate"]
)
def test_bad_stop_is_400(server, client, stop):
    error_of(chat(client, server, stop=stop), 400, param="stop")


# --- logprobs --------------------------------------------------------------------------------------
def test_chat_logprobs_in_openais_shape_equal_the_models(server, client, shipped_model):
    reply = chat(client, server, "spell 7", logprobs=True, top_logprobs=2, max_tokens=6, return_token_ids=True).json()
    choice = reply["choices"][0]
    entries, ids = choice["logprobs"]["content"], choice["token_ids"]
    assert len(entries) == len(ids) == reply["usage"]["completion_tokens"]
    prompt = encode_prompt("spell 7")
    with torch.no_grad():
        want = shipped_model(torch.tensor([prompt + ids]))[0].log_softmax(-1)  # (T, V)
    for i, entry in enumerate(entries):
        row = want[len(prompt) - 1 + i]
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"} and entry["bytes"] == [ids[i]]
        assert entry["token"] == chr(ids[i]) and entry["logprob"] == pytest.approx(row[ids[i]].item(), abs=1e-4)
        assert [t["logprob"] for t in entry["top_logprobs"]] == pytest.approx(row.topk(2).values.tolist(), abs=1e-4)
        assert entry["top_logprobs"][0]["token"] == entry["token"]  # greedy: the likeliest token was chosen
    assert chat(client, server, "spell 7").json()["choices"][0]["logprobs"] is None  # not asked: none


def test_completion_logprobs_and_streamed_logprobs(server, client):
    body = {"prompt": "spell 7", "logprobs": 1, "max_tokens": 5}
    logprobs = client.post(f"{server.url}/completions", json=body).json()["choices"][0]["logprobs"]
    assert set(logprobs) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert len(logprobs["tokens"]) == len(logprobs["top_logprobs"]) == 5 and logprobs["text_offset"] == [0, 1, 2, 3, 4]
    assert all(token in top for token, top in zip(logprobs["tokens"], logprobs["top_logprobs"]))
    chunks = streamed(client, server, "spell 31", logprobs=True)[1:-1]  # (after the role chunk, before [DONE])
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    tokens = "".join(e["token"] for c in chunks for e in (c["choices"][0]["logprobs"] or {"content": []})["content"])
    assert tokens == content and content


def test_top_logprobs_needs_logprobs_and_lies_in_openais_ranges(server, client, shipped_model):
    """Chat's top_logprobs: 0-20 (OpenAI's range); completions' legacy logprobs: 0-5."""
    error_of(chat(client, server, top_logprobs=2), 400, param="top_logprobs")
    assert "from 0 to 20" in error_of(chat(client, server, logprobs=True, top_logprobs=21), 400, param="top_logprobs")
    error_of(client.post(f"{server.url}/completions", json={"prompt": "x", "logprobs": 9}), 400, param="logprobs")
    error_of(client.post(f"{server.url}/completions", json={"prompt": "x", "logprobs": 6}), 400, param="logprobs")
    reply = chat(client, server, "spell 7", logprobs=True, top_logprobs=20, max_tokens=3, return_token_ids=True)
    choice = reply.json()["choices"][0]
    prompt, made = encode_prompt("spell 7"), choice["token_ids"]
    with torch.no_grad():
        want = shipped_model(torch.tensor([prompt + made]))[0].float().log_softmax(-1)[len(prompt) - 1 :]
    assert len(choice["logprobs"]["content"]) == len(made) == 3
    for entry, row in zip(choice["logprobs"]["content"], want):
        assert len(entry["top_logprobs"]) == 20
        assert [t["logprob"] for t in entry["top_logprobs"]] == pytest.approx(row.topk(20).values.tolist(), abs=1e-4)


def test_temperature_above_openais_range_is_a_400_naming_it(server, client):
    assert "from 0 to 2" in error_of(chat(client, server, temperature=2.5), 400, param="temperature")
    assert chat(client, server, "spell 4", temperature=2, max_tokens=3, seed=1).status_code == 200


# --- what the server cannot do: refused, never dropped ------------------------------------------------
REFUSED = {"echo": True, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required",
           "response_format": {"type": "xml"}, "presence_penalty": 0.5, "frequency_penalty": 1,
           "logit_bias": {"50": 10}, "n": 17, "best_of": 3, "suffix": "!", "unknown_option": 1}  # fmt: skip


@pytest.mark.parametrize("field", REFUSED)
def test_an_option_this_server_cannot_honour_is_a_400_naming_it(server, client, field):
    endpoint = "completions" if field in ("best_of", "suffix") else "chat/completions"  # (echo: completions' only)
    body = {"prompt": "spell 4"} if endpoint == "completions" else {"messages": [{"role": "user", "content": "hi"}]}
    message = error_of(client.post(f"{server.url}/{endpoint}", json=body | {field: REFUSED[field]}), 400, param=field)
    assert field in message


def test_options_that_ask_for_nothing_are_fine(server, client):
    harmless = {"presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {}, "tools": [], "tool_choice": "none",
                "response_format": {"type": "text"}, "n": 1, "user": "someone", "stop": None, "seed": None}  # fmt: skip
    assert chat(client, server, "spell 4", **harmless).status_code == 200


# --- error objects everywhere ------------------------------------------------------------------------
def test_every_error_is_an_openai_error_object(server, client):
    error_of(client.get(f"{server.url}/no/such/route"), 404)
    assert "model_not_found" == chat(client, server, model="gpt-5").json()["error"]["code"]
    error_of(chat(client, server, model="gpt-5"), 404, param="model")
    error_of(client.get(f"{server.url}/models/gpt-5"), 404, param="model")
    assert client.get(f"{server.url}/models/minillm").json()["id"] == "minillm"
    error_of(client.get(f"{server.url}/chat/completions"), 405)
    error_of(client.get(f"{server.base}/trace", params={"last_steps": "many"}), 422, param="last_steps")
    error_of(client.post(f"{server.url}/completions", json={"prompt": "x" * MAX_BODY}), 413)


# --- limits before work, malformed input: 4xx, and the server keeps serving --------------------------------
DEEP = b"[" * 100_000 + b"]" * 100_000
MALFORMED = {
    "lone surrogate in the prompt": (b'{"prompt": "spell \\ud800"}', "prompt"),
    "lone surrogate in a message": (b'{"messages": [{"role": "user", "content": "\\udfff"}]}', "messages"),
    "lone surrogate in the system message": (b'{"messages": [{"role": "system", "content": "\\ud800"}, '
                                             b'{"role": "user", "content": "spell 4"}]}', "messages"),
    "5,000-digit max_tokens": (b'{"prompt": "spell 4", "max_tokens": ' + b"9" * 5000 + b"}", "max_tokens"),
    "5,000-digit seed": (b'{"prompt": "spell 4", "seed": -' + b"9" * 5000 + b"}", "seed"),
    "nested 100,000 deep": (DEEP, None),
    "nested inside a field": (b'{"prompt": "spell 4", "stop": ' + DEEP[:20_000] + b"}", None),
    "prompt not a string": (b'{"prompt": {"text": "spell 4"}}', "prompt"),
    "messages not a list": (b'{"messages": "spell 4"}', "messages"),
    "content a number": (b'{"messages": [{"role": "user", "content": 4}]}', "messages"),
    "text part not text": (b'{"messages": [{"role": "user", "content": [{"type": "text", "text": 4}]}]}', "messages"),
    "model a number": (b'{"prompt": "spell 4", "model": 4}', "model"),
    "stream_options a list": (b'{"prompt": "spell 4", "stream_options": []}', "stream_options"),
    "max_tokens a float": (b'{"prompt": "spell 4", "max_tokens": 2.5}', "max_tokens"),
    "user a number": (b'{"prompt": "spell 4", "user": 1}', "user"),
    "not UTF-8": (b'{"prompt": "\xff"}', None),
    "empty body": (b"", None),
}  # fmt: skip


@pytest.mark.parametrize("raw,param", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_input_is_a_400_and_the_server_keeps_serving(server, client, raw, param):
    endpoint = "chat/completions" if b'"messages"' in raw else "completions"
    error_of(client.post(f"{server.url}/{endpoint}", content=raw), 400, param=param)
    assert chat(client, server, "spell 12", max_tokens=4).status_code == 200


def test_a_huge_prompt_is_refused_by_its_length_before_it_is_tokenized(server, client, shipped_model):
    response = client.post(f"{server.url}/completions", json={"prompt": "a" * (MAX_BODY - 100)})
    assert "over 1024 tokens" in error_of(response, 400, param="prompt")
    with ServerThread(build_loop(shipped_model, slots=1), max_body_bytes=1000) as small:
        assert "over 1000 bytes" in error_of(client.post(f"{small.url}/completions", json={"prompt": "a" * 1000}), 413)
        assert client.post(f"{small.url}/completions", json={"prompt": "a" * 900, "max_tokens": 1}).status_code == 200


# --- whatever the body, never a 500 -----------------------------------------------------------------------
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
PLAUSIBLE = {"model": st.sampled_from(["minillm", "other"]), "max_tokens": st.integers(-1, 30),
             "temperature": st.floats(-1, 3), "top_p": st.floats(0, 1.2), "top_k": st.integers(-1, 50),
             "seed": st.integers(-5, 2**70), "stop": st.text(max_size=3) | st.lists(st.text(max_size=3), max_size=5),
             "stream": st.booleans(), "logprobs": st.booleans() | st.integers(-1, 7),
             "top_logprobs": st.integers(-1, 7), "n": st.integers(0, 2), "ignore_eos": st.booleans(),
             "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()},
                                                     optional={"continuous_usage_stats": st.booleans(),
                                                               "include_obfuscation": st.booleans()}),
             "echo": st.booleans(),
             "presence_penalty": st.floats(0, 1)}  # fmt: skip


def some(values: st.SearchStrategy) -> st.SearchStrategy:
    """Mostly a plausible value (valid or nearly), sometimes any JSON at all."""
    return st.one_of(values, values, values, json_values)


def with_options(required: dict) -> st.SearchStrategy:
    """A body: the required fields and up to three options."""
    names = st.lists(st.sampled_from(sorted(PLAUSIBLE)), max_size=3, unique=True)
    return names.flatmap(lambda chosen: st.fixed_dictionaries(required | {n: some(PLAUSIBLE[n]) for n in chosen}))


message = st.fixed_dictionaries({"role": st.sampled_from(["user", "user", "system", "assistant", "bot"]),
                                 "content": some(st.text(min_size=1, max_size=30))})  # fmt: skip
junk = st.dictionaries(st.text(max_size=6), json_values, max_size=4) | json_values
token_ids = st.lists(st.integers(-2, 262), min_size=1, max_size=40)  # (the vocabulary: 0-259)
prompts = (
    st.text(min_size=1, max_size=40) | token_ids | st.lists(st.text(min_size=1, max_size=20) | token_ids, max_size=3)
)
completion_bodies = st.one_of(*[with_options({"prompt": some(prompts)})] * 3, junk)
chat_bodies = st.one_of(*[with_options({"messages": some(st.lists(message, min_size=1, max_size=3))})] * 3, junk)


@pytest.fixture(scope="module")
def small_server():
    torch.manual_seed(0)
    tiny = Transformer(ModelConfig(dim=32, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=64, max_seq_len=64))
    with ServerThread(build_loop(tiny.eval(), slots=4)) as running, httpx.Client(timeout=60) as client:
        yield running, client  # (replies of at most 63 tokens: fast)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    endpoint_body=st.tuples(st.just("completions"), completion_bodies)
    | st.tuples(st.just("chat/completions"), chat_bodies)
)
def test_no_body_gets_a_500(small_server, endpoint_body):
    (server, client), (endpoint, body) = small_server, endpoint_body
    response = client.post(f"{server.url}/{endpoint}", content=json.dumps(body).encode())
    assert response.status_code < 500, (body, response.text)
    if response.status_code != 200:
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    elif not body.get("stream"):
        choice = response.json()["choices"][0]
        assert choice["finish_reason"] in ("stop", "length") and EOS not in choice.get("token_ids", [])
