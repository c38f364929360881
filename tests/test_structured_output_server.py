"""Structured output through the server, driven by the `openai` client students use: response_format json_schema
(also the client's own parse helper) and json_object, minillm's regex extension, streamed and whole, replies token
for token the offline constrained loop's (engine in a process of its own, and on a thread), finish_reason "length"
when max_tokens cuts a reply, and a 400 naming what cannot be kept: a keyword, an optional property, a pattern too
large (with the limit), a malformed field. The automata cross to the engine process once per pattern
(serving/automata.py)."""

from __future__ import annotations

import json
import pickle
import random
import re

import openai
import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm.config import Sampling
from minillm.engine.request import Request
from minillm.grammar import MAX_PATTERN, compile_json_object, compile_regex, compile_schema
from minillm.grammar.automaton import DEAD, MAX_STATES
from minillm.layers import generate
from minillm.model.tokenizer import BOS, encode, encode_prompt
from minillm.serving.automata import Automata
from minillm.serving.openai_protocol import ApiError
from minillm.serving.openai_structured import automaton, pattern_of
from minillm.serving.server import ServerThread, build_loop

WORD = {
    "type": "object",
    "properties": {
        "word": {"type": "string", "maxLength": 16},
        "digits": {"type": "integer"},
        "even": {"type": "boolean"},
        "task": {"enum": ["spell", "count"]},
        "letters": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2},
    },
    "required": ["word", "digits", "even", "task", "letters"],
    "additionalProperties": False,
}
SPELL = [{"role": "user", "content": "spell 42"}]


def json_schema(schema: dict, strict: bool = True) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": strict}}


def follows_word(reply: dict) -> None:
    assert list(reply) == list(WORD["properties"])  # every property, in the schema's order
    assert isinstance(reply["word"], str) and len(reply["word"]) <= 16
    assert isinstance(reply["digits"], int) and isinstance(reply["even"], bool)
    assert reply["task"] in ("spell", "count")
    assert len(reply["letters"]) <= 2 and all(isinstance(x, str) and len(x) <= 3 for x in reply["letters"])


@pytest.fixture(scope="module")
def thread_server(shipped_model):
    """The shipped model behind HTTP with the engine on a thread: the automaton reaches it without the pipe."""
    with ServerThread(build_loop(shipped_model, slots=4)) as running:
        yield running


@pytest.fixture(params=["process", "thread"])
def any_server(request):
    return request.getfixturevalue("server" if request.param == "process" else "thread_server")


@pytest.fixture
def api(server):
    with openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60) as client:
        yield client


def refused(create, param: str, **request) -> str:
    """The message of the 400 that create(model="minillm", **request) gets, an OpenAI error naming `param`."""
    with pytest.raises(openai.BadRequestError) as caught:
        create(model="minillm", **request)
    error = caught.value
    assert error.status_code == 400 and error.body["param"] == param and error.body["type"] == "invalid_request_error"
    return error.body["message"]


# --- replies that obey ---------------------------------------------------------------------------------------------
def test_a_json_schema_reply_parses_and_follows_the_schema(api):
    reply = api.chat.completions.create(model="minillm", messages=SPELL, response_format=json_schema(WORD))
    assert reply.choices[0].finish_reason == "stop"
    follows_word(json.loads(reply.choices[0].message.content))


def test_strict_false_is_accepted_and_still_followed(api):
    reply = api.chat.completions.create(model="minillm", messages=SPELL, response_format=json_schema(WORD, False))
    follows_word(json.loads(reply.choices[0].message.content))


def test_the_clients_parse_helper_gets_its_model_back(api):
    """client.chat.completions.parse sends a pydantic model as a strict json_schema (titles and all), then reads the
    reply back into the model: the whole round trip a student's code makes."""

    class Answer(pydantic.BaseModel):
        word: str = pydantic.Field(max_length=12)  # (unbounded, the tiny model never closes its quote)
        digits: int
        even: bool

    reply = api.chat.completions.parse(model="minillm", messages=SPELL, response_format=Answer, max_tokens=200)
    assert isinstance(reply.choices[0].message.parsed, Answer)


def test_a_json_object_reply_is_a_json_object_on_both_endpoints(api):
    chat = api.chat.completions.create(model="minillm", messages=SPELL, response_format={"type": "json_object"})
    assert isinstance(json.loads(chat.choices[0].message.content), dict)
    text = api.completions.create(
        model="minillm", prompt="spell 42", extra_body={"response_format": {"type": "json_object"}}
    )
    assert isinstance(json.loads(text.choices[0].text), dict)


@pytest.mark.parametrize("pattern", [r"(yes|no)", r"[0-9]+( [0-9]+)*", r"[a-z]{2,5}-[0-9]"])
def test_the_regex_extension_on_both_endpoints(api, pattern):
    """A finished reply matches the pattern (as Python's re reads it); one cut by max_tokens is a prefix it allows."""
    count = [{"role": "user", "content": "count down from 7"}]
    chat = api.chat.completions.create(model="minillm", messages=count, extra_body={"regex": pattern}, max_tokens=40)
    text = api.completions.create(model="minillm", prompt="count down from 7", extra_body={"regex": pattern},
                                  max_tokens=40)  # fmt: skip
    dfa, finished = compile_regex(pattern), 0
    for reply, choice in ((chat.choices[0].message.content, chat.choices[0]), (text.choices[0].text, text.choices[0])):
        assert dfa.walk(0, reply.encode()) != DEAD, reply
        if choice.finish_reason == "stop":
            assert re.fullmatch(pattern, reply), reply
            finished += 1
    assert finished, "neither reply finished: the test shows nothing"


@pytest.mark.parametrize("sampling", [{}, {"temperature": 1.0, "seed": 5}], ids=["greedy", "sampled"])
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_replies_equal_the_offline_constrained_loop(any_server, client, shipped_model, endpoint, sampling):
    """Token for token generate(..., constraint=...): the automaton that reached the engine (across the pipe, or
    on the engine's thread) is the one the server compiled."""
    cases = [("spell 4096", json_schema(WORD), compile_schema(WORD)), ("spell 7", {"type": "json_object"},
             compile_json_object()), ("count down from 12", None, compile_regex(r"[0-9]+( [0-9]+)*"))]  # fmt: skip
    for prompt, response_format, dfa in cases:
        constraint = {"response_format": response_format} if response_format else {"regex": dfa.pattern}
        ask = {"messages": [{"role": "user", "content": prompt}]} if endpoint == "chat" else {"prompt": prompt}
        body = ask | constraint | sampling | {"max_tokens": 120, "return_token_ids": True}
        path = "chat/completions" if endpoint == "chat" else "completions"
        response = client.post(f"{any_server.url}/{path}", json=body)
        assert response.status_code == 200, response.text
        ids = encode_prompt(prompt) if endpoint == "chat" else [BOS, *encode(prompt)]
        want = generate(shipped_model, ids, 120, sampling.get("temperature", 0.0), seed=sampling.get("seed"),
                        constraint=dfa)  # fmt: skip
        assert response.json()["choices"][0]["token_ids"] == want.tokens, prompt


def test_a_streamed_reply_follows_the_schema(api):
    chunks = list(api.chat.completions.create(model="minillm", messages=SPELL, response_format=json_schema(WORD),
                                              stream=True))  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "stop"
    follows_word(json.loads(text))


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_reply_cut_by_max_tokens_finishes_with_length(api, stream):
    """Cut mid-object: finish_reason "length", and what came is a prefix the schema allows (so not JSON yet)."""
    reply = api.chat.completions.create(model="minillm", messages=SPELL, response_format=json_schema(WORD),
                                        max_tokens=12, stream=stream)  # fmt: skip
    if stream:
        chunks = [c for c in reply if c.choices]
        text, finish = "".join(c.choices[0].delta.content or "" for c in chunks), chunks[-1].choices[0].finish_reason
    else:
        text, finish = reply.choices[0].message.content, reply.choices[0].finish_reason
    dfa = compile_schema(WORD)
    state = dfa.walk(0, text.encode())
    assert finish == "length" and len(text) == 12 and state != DEAD and not dfa.accepts(state)


# --- what cannot be kept: a 400 that names it ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "schema, keyword",
    [({"type": "integer", "minimum": 0}, "minimum"), ({"type": "string", "pattern": "a+"}, "pattern"),
     ({"type": "string", "format": "date"}, "format"), ({"type": "null", "anyOf": [{"type": "null"}]}, "anyOf"),
     (WORD | {"properties": WORD["properties"] | {"digits": {"type": "integer", "maximum": 9}}}, "maximum"),
     ({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}},
       "required": ["a"], "additionalProperties": False}, "uniqueItems")],
)  # fmt: skip
def test_an_unsupported_keyword_is_a_400_naming_it(api, schema, keyword):
    message = refused(
        api.chat.completions.create, "response_format", messages=SPELL, response_format=json_schema(schema)
    )
    assert keyword in message and "response_format.json_schema.schema" in message


def test_an_optional_property_is_a_400_naming_it(api):
    optional = json_schema(WORD | {"required": ["word", "digits", "even", "task"]})
    message = refused(api.chat.completions.create, "response_format", messages=SPELL, response_format=optional)
    assert "'letters'" in message and "required" in message


def test_too_large_is_a_400_with_the_limit(api):
    rng = random.Random(0)
    words = sorted({"".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(6)) for _ in range(1000)})
    long_enum = {"enum": [f"{i:05d}" * 20 for i in range(250)]}
    for schema, limit in (({"enum": words}, f"{MAX_STATES}"), (long_enum, f"{MAX_PATTERN:,}")):  # states, length
        format_ = json_schema(schema)
        message = refused(api.chat.completions.create, "response_format", messages=SPELL, response_format=format_)
        assert limit in message, message
    message = refused(api.completions.create, "regex", prompt="x", extra_body={"regex": "[ab]*a[ab]{10}"})
    assert f"the limit is {MAX_STATES}" in message


BAD = {
    "unknown type": ({"response_format": {"type": "xml"}}, "response_format", "json_schema"),
    "no type": ({"response_format": {}}, "response_format", "json_object"),
    "no name": ({"response_format": {"type": "json_schema", "json_schema": {"schema": WORD}}}, "response_format",
                "name"),
    "no schema": ({"response_format": {"type": "json_schema", "json_schema": {"name": "a"}}}, "response_format",
                  "schema"),
    "strange field": ({"response_format": json_schema(WORD) | {"grammar": "x"}}, "response_format", "'grammar'"),
    "strict not a flag": ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": WORD,
                           "strict": "yes"}}}, "response_format", "strict"),
    "both": ({"response_format": {"type": "json_object"}, "regex": "a"}, "regex", "not both"),
    "regex not text": ({"regex": 7}, "regex", "string"),
    "bad regex": ({"regex": "(ab"}, "regex", "never closed"),
    "lazy regex": ({"regex": "a*?"}, "regex", "lazy"),
    "ignore_eos": ({"regex": "a+", "ignore_eos": True}, "ignore_eos", "ignore_eos"),
}  # fmt: skip


@pytest.mark.parametrize("fields, param, needle", BAD.values(), ids=BAD.keys())
def test_a_malformed_constraint_is_a_400_that_says_so(server, client, fields, param, needle):
    response = client.post(f"{server.url}/chat/completions", json={"messages": SPELL} | fields)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and needle in error["message"], error


def test_text_asks_for_nothing(server, client):
    body = {"messages": SPELL, "response_format": {"type": "text"}, "return_token_ids": True}
    free = client.post(f"{server.url}/chat/completions", json={"messages": SPELL, "return_token_ids": True})
    assert (
        client.post(f"{server.url}/chat/completions", json=body).json()["choices"][0]["token_ids"]
        == (free.json()["choices"][0]["token_ids"])
    )


TYPES = st.sampled_from(["object", "array", "string", "integer", "number", "boolean", "null", "float"])
KEYS = st.sampled_from(["type", "properties", "items", "required", "enum", "const", "minLength", "maxLength",
                        "minItems", "maxItems", "additionalProperties", "title", "minimum", "x"])  # fmt: skip
SCHEMAS = st.recursive(
    st.none() | st.booleans() | st.integers(-2, 8) | st.text(max_size=4) | TYPES | st.lists(TYPES, max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS | st.text(max_size=3), inner, max_size=5),
    max_leaves=16,
)


@settings(max_examples=300, deadline=None)
@given(SCHEMAS)
def test_no_schema_gets_anything_but_a_pattern_or_a_400(schema):
    """Whatever a client sends as a schema: a pattern that compiles, or an ApiError (the app's 400), never a 500.
    (A "type" that names nothing has a test of its own below too.)"""
    try:
        pattern, _ = pattern_of({"response_format": json_schema(schema)})
        if len(pattern) < 2_000:  # (bigger ones take long to compile: the limit tests cover them)
            automaton(pattern)
    except ApiError as e:
        assert e.status == 400 and e.param == "response_format" and str(e)


@pytest.mark.parametrize("schema", [{"type": {}}, {"type": [{}]}])
def test_a_type_that_is_no_name_is_a_400(schema):
    with pytest.raises(ApiError):
        pattern_of({"response_format": json_schema(schema)})


@pytest.mark.parametrize("schema, keyword", [({"anyOf": [{"type": "null"}]}, "anyOf"), ({"$ref": "#/x"}, "$ref")])
def test_a_keyword_without_a_type_is_named_too(schema, keyword):
    with pytest.raises(ApiError, match=re.escape(keyword)):
        pattern_of({"response_format": json_schema(schema)})


# --- across the pipe -------------------------------------------------------------------------------------------------
def test_automata_cross_the_pipe_once_and_both_sides_agree_on_the_slots():
    """Three slots, five patterns, used in an order that evicts: each request the child reads carries the automaton
    the app compiled; its tables cross only when the child does not hold the pattern; the child's automaton for a
    pattern it holds is the same object (its masks built once)."""
    patterns = ["a+", "b+", "(yes|no)", "[0-9]+", "x?y"]
    sender, child = Automata(size=3), Automata(size=3)
    held: dict[int, str] = {}  # what the child holds per slot, as the test follows it
    rng, previous = random.Random(1), {}
    for i in range(60):
        pattern = rng.choice(patterns)
        packed = sender.pack(Request(f"r{i}", [1, 2], 4, sampling=Sampling(constraint=compile_regex(pattern))))
        crossed = pickle.loads(pickle.dumps(packed))  # (what the pipe does)
        slot, _, *tables = crossed.sampling.constraint
        assert bool(tables) == (held.get(slot) != pattern)  # tables only when the child lacks the pattern
        held[slot] = pattern
        got = child.unpack(crossed).sampling.constraint
        assert got.pattern == pattern and (got.moves == compile_regex(pattern).moves).all()
        if not tables:
            assert got is previous[pattern]
        previous[pattern] = got
    assert len(child.kept) == 3
    assert sender.pack(Request("free", [1], 4)).sampling.constraint is None
