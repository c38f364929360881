"""Constrained decoding: the regex subset compiles to an automaton that agrees with Python's `re`, a JSON schema to
the JSON texts it allows, and the engine's replies follow their pattern under every engine feature, token for token
the plain loop's constrained reply (generate(..., constraint=...))."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minillm.config import EngineConfig, Sampling
from minillm.engine.request import Request
from minillm.engine.scheduler import ContinuousScheduler, StaticScheduler
from minillm.errors import InputError
from minillm.grammar import compile_json_object, compile_regex, compile_schema
from minillm.grammar.automaton import MAX_STATES
from minillm.grammar.json_schema import JSON_OBJECT_DEPTH, SchemaError
from minillm.grammar.regex import RegexError
from minillm.layers import LayeredEngine, generate
from minillm.model.tokenizer import EOS, decode, encode_prompt
from tests.conftest import random_model
from tests.test_speculate import noisy

PATTERNS = [
    r"abc", r"a|bc|", r"(ab)*c", r"[0-9]+", r"-?(0|[1-9][0-9]*)(\.[0-9]+)?", r"a{2,4}b{3}c{2,}", r"x?y+z*",
    r'"([^"\\]|\\.)*"', r"(?:cat|dog)s?", r"\d{1,3}(,\d{3})*", r"[a-c-]+", r"\w+@\w+\.com", r"^(yes|no)$",
    r"(a|ab)(c|bcd)(d*)", r".*", r"[^a-z]{0,3}", r"\s\S\W\D", r"\x41\.\n\t", r"[\]\\-]+",
]  # fmt: skip


@pytest.mark.parametrize("pattern", PATTERNS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_automaton_agrees_with_pythons_re(pattern, data):
    dfa, python = compile_regex(pattern), re.compile(pattern)
    text = data.draw(st.from_regex(python, fullmatch=True))
    if text.isascii():  # (the subset reads `.` and negated classes as ASCII)
        assert dfa.matches(text), f"{pattern!r} must match {text!r}"
    other = data.draw(st.text(alphabet='abcdxyz0129-.,"\\@ \n\tA]', max_size=10))
    assert dfa.matches(other) == bool(python.fullmatch(other)), f"{pattern!r} on {other!r}"


@pytest.mark.parametrize("pattern", PATTERNS + [r"(a|b)*c", r"\d{3}-\d{4}"])
def test_every_state_can_still_reach_an_end(pattern):
    """No dead end: from every state some token is allowed, and some path leads to an accepting state."""
    dfa = compile_regex(pattern)
    for state in range(dfa.num_states):
        assert dfa.allowed(state).any(), f"state {state} of {pattern!r} allows nothing"


@pytest.mark.parametrize(
    "pattern, needle",
    [("(ab", "never closed"), ("[ab", "never closed"), ("ab)", "unmatched"), ("a*?", "lazy"), ("(?=a)b", "(?:"),
     (r"(a)\1", "backreferences"), ("a{3,1}", "fewer"), ("*a", "repeats nothing"), ("a{999}", "at most 256"),
     ("[é]", "ASCII"), ("a^b", "only supported at the very start"), ("[z-a]", "range"), ("\\", "lone backslash"),
     ("a{,3}", "{m,n}"), (r"\xZZ", "hex"), ("[^\\x00-\\x7f]", "matches nothing")],
)  # fmt: skip
def test_a_bad_pattern_is_refused_with_the_reason(pattern, needle):
    with pytest.raises(RegexError, match=re.escape(needle)):
        compile_regex(pattern)


def test_a_pattern_too_big_for_an_automaton_is_refused_with_the_limit():
    with pytest.raises(RegexError, match=f"{MAX_STATES}"):
        compile_regex("(a|b)*a(a|b){14}")  # the textbook blow-up: a DFA must remember the last 15 letters


# --- JSON schemas -----------------------------------------------------------------------------------------------
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer"},
        "height": {"type": "number"},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog", 3, None]}, "maxItems": 2},
        "kind": {"type": ["boolean", "null"]},
        "address": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                    "additionalProperties": False},
    },
    "required": ["name", "age", "height", "pets", "kind", "address"],
    "additionalProperties": False,
}  # fmt: skip
GOOD = [
    {"name": "Ada", "age": 36, "height": 1.65, "pets": [], "kind": True, "address": {"city": "London"}},
    {"name": 'a "q"\\', "age": -7, "height": -2e10, "pets": ["dog", None], "kind": None, "address": {"city": ""}},
]
BAD = [
    {"name": "Ada", "age": 36.5, "height": 1, "pets": [], "kind": True, "address": {"city": "x"}},  # age not integer
    {"name": "Ada" * 5, "age": 1, "height": 1, "pets": [], "kind": True, "address": {"city": "x"}},  # name too long
    {"name": "Ada", "age": 1, "height": 1, "pets": ["cat"] * 3, "kind": 0, "address": {"city": "x"}},  # 3 pets
    {"age": 1, "name": "Ada", "height": 1, "pets": [], "kind": True, "address": {"city": "x"}},  # out of order
    {"name": "Ada", "age": 1, "height": 1, "pets": ["fish"], "kind": True, "address": {"city": "x"}},  # not in enum
]


def test_a_schema_allows_its_documents_in_either_layout_and_nothing_else():
    dfa = compile_schema(PERSON)
    for doc in GOOD:
        for separators in ((",", ":"), (", ", ": ")):
            text = json.dumps(doc, separators=separators)
            assert dfa.matches(text), text
    for doc in BAD:
        assert not dfa.matches(json.dumps(doc)), json.dumps(doc)


def test_any_json_object_nests_a_few_levels():
    dfa = compile_json_object()
    for text in ["{}", '{"a": 1}', '{"a": {"b": [1, 2.5, "x", null]}, "c": true}', '{"a": {"b": {"c": 1}}}']:
        assert dfa.matches(text), text
    assert JSON_OBJECT_DEPTH == 3 and not dfa.matches('{"a": {"b": {"c": []}}}')  # the bound: 4 deep
    for text in ["[1]", '{"a": }', '{"a" 1}', "{a: 1}", '"x"', '{"a": 1,}']:
        assert not dfa.matches(text), text


@pytest.mark.parametrize(
    "schema, needle",
    [({"type": "string", "pattern": "a+"}, "'pattern'"), ({"type": "integer", "minimum": 0}, "'minimum'"),
     ({"anyOf": [{"type": "string"}]}, "'anyOf'"), ({"title": "x"}, "no 'type'"), ({"type": {}}, "type {}"),
     ({"type": "object", "properties": {}, "required": "ab"}, "list of property names"),
     ({"enum": [float("inf")]}, "not a JSON value"), ({"type": "object", "properties": {"a": {"type": "string"}}},
     "'a' is not in 'required'"), ({"type": "date"}, "type 'date'"), ({"type": "array"}, "needs 'items'"),
     ({"type": "object", "properties": {}, "additionalProperties": True}, "additionalProperties"),
     ({"type": "object", "properties": {"a": {"$ref": "#/x", "type": "string"}}, "required": ["a"]}, "$ref"),
     ("not a schema", "must be an object")],
)  # fmt: skip
def test_an_unsupported_keyword_is_named_never_ignored(schema, needle):
    with pytest.raises(SchemaError, match=re.escape(needle)):
        compile_schema(schema)


def test_words_that_constrain_nothing_are_allowed():
    described = {"type": "integer", "title": "Age", "description": "in years", "default": 3}
    assert compile_schema(described).matches("42")


# --- the engine: every feature, and the plain loop's reply -------------------------------------------------------
DIGITS = r"[0-9]{2,5}(\.[0-9])?"  # a short reply with a choice inside and a sure end
WORD_LIST = r'\["[a-z]{1,4}"(, "[a-z]{1,4}"){0,3}\]'


def model():
    return random_model("gqa")


def constrained(i: int, pattern: str = DIGITS, sampling: Sampling | None = None) -> Request:
    prompt = [257] + [(11 * i + j) % 256 for j in range(3 + 5 * (i % 4))]
    sampling = replace(sampling or Sampling(), constraint=compile_regex(pattern))  # (the pattern travels in it)
    return Request(f"c{i}", prompt, 40, sampling=sampling)  # (every reply ends by 33)


def plain_reply(r: Request) -> list[int]:
    s = r.sampling
    return generate(model(), r.prompt_ids, r.max_new_tokens, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                    seed=s.seed, use_cache=False, constraint=s.constraint).tokens  # fmt: skip


def serve(requests, scheduler=None, draft=None, **cfg) -> LayeredEngine:
    cfg = {"max_len": 256, "debug": True, "slots": 3} | cfg
    engine = LayeredEngine(model(), scheduler or ContinuousScheduler(), EngineConfig(**cfg), draft=draft)
    for r in requests:
        engine.submit(r)
    engine.run(max_steps=3000)
    return engine


FEATURES = {
    "continuous-paged": {},
    "contiguous": {"kv": "contiguous"},
    "static": {"scheduler": StaticScheduler()},
    "budget-1": {"token_budget": 1},
    "chunked": {"token_budget": 7, "slots": 4},
    "prefix-caching": {"prefix_caching": True, "block_size": 4},
    "preempted": {"kv": "paged", "block_size": 4, "num_blocks": 20, "slots": 4},
    "speculating": {"speculate": 3, "draft": "noisy"},
    "prompt-lookup": {"speculate": 2, "drafter": "ngram"},
}


@pytest.mark.parametrize("feature", FEATURES)
def test_constrained_replies_follow_their_pattern_token_for_token_the_plain_loops(feature):
    how = dict(FEATURES[feature])
    scheduler = how.pop("scheduler", None)
    token_budget = how.pop("token_budget", None)
    if token_budget is not None:
        scheduler = ContinuousScheduler(token_budget=token_budget)
    draft = noisy() if how.pop("draft", None) else None
    requests = [constrained(i, DIGITS if i % 2 else WORD_LIST) for i in range(6)]
    requests.append(Request("free", [257, 40, 41, 42], 20, ignore_eos=True))  # an unconstrained neighbour
    engine = serve(requests, scheduler, draft, **how)
    for r in requests[:-1]:
        assert r.output_ids == plain_reply(r), f"{feature}: {r.id}"
        text = decode(r.output_ids)
        pattern = DIGITS if r.id in ("c1", "c3", "c5") else WORD_LIST
        assert r.finish_reason == "eos" and re.fullmatch(pattern, text), f"{feature}: {r.id} gave {text!r}"
    assert requests[-1].output_ids == generate(model(), requests[-1].prompt_ids, 20, use_cache=False,
                                               ignore_eos=True).tokens  # fmt: skip
    if feature == "preempted":
        assert sum(r.preemptions for r in requests) > 0, "memory must run short for this case to test preemption"
    if engine.cfg.kv == "paged":
        assert engine.cache.allocator.num_free == engine.cache.allocator.num_blocks, "KV blocks leaked"


def test_sampled_constrained_replies_draw_only_allowed_tokens_and_follow_their_seed():
    warm = Sampling(temperature=1.5, seed=4)
    requests = [constrained(i, WORD_LIST, sampling=warm) for i in range(4)]
    serve(requests)
    for r in requests:
        assert re.fullmatch(WORD_LIST, decode(r.output_ids)) and r.output_ids == plain_reply(r)


def test_sampled_constrained_requests_speculate_inside_the_pattern():
    requests = [constrained(i, WORD_LIST, sampling=Sampling(temperature=1.0, seed=i)) for i in range(4)]
    trace = serve(requests, draft=noisy(), speculate=3).trace()
    for r in requests:
        assert re.fullmatch(WORD_LIST, decode(r.output_ids)), decode(r.output_ids)
    assert sum(trace.request(r.id).drafts_verified for r in requests) > 0


def test_the_cap_reached_before_the_pattern_ends_finishes_with_length():
    r = Request("short", [257, 1, 2], 3, sampling=Sampling(constraint=compile_regex(r"[a-z]{6}")))
    serve([r])
    assert r.finish_reason == "length" and re.fullmatch(r"[a-z]{3}", decode(r.output_ids))


def test_eos_only_where_the_pattern_may_end(shipped_model):
    """The shipped model answers "count down from 5" with '5 4 3 2 1' and EOS; held to three digits it can only
    stop after the third; held to 'yes|no' after a whole word."""
    prompt = encode_prompt("count down from 5")
    for pattern in (r"[0-9]{3}", r"(yes|no)", r"5 4 3( 2( 1)?)?"):
        r = Request(pattern, prompt, 30, sampling=Sampling(constraint=compile_regex(pattern)))
        engine = LayeredEngine(shipped_model, ContinuousScheduler(), EngineConfig(slots=1))
        engine.submit(r)
        engine.run()
        assert r.finish_reason == "eos" and re.fullmatch(pattern, decode(r.output_ids)), (pattern, r.output_ids)
    assert decode(r.output_ids) == "5 4 3 2 1"  # what it would say anyway fits the last pattern


def test_a_constrained_request_that_ignores_eos_is_rejected_with_the_reason():
    r = Request("x", [257, 5], 8, ignore_eos=True, sampling=Sampling(constraint=compile_regex("[0-9]+")))
    serve([r])
    assert r.finish_reason.startswith("rejected") and "cannot ignore EOS" in r.finish_reason
    with pytest.raises(InputError, match="cannot ignore EOS"):
        generate(model(), [257, 5], 8, ignore_eos=True, constraint=compile_regex("[0-9]+"))


def test_the_trace_says_how_many_tokens_each_constrained_row_could_pick():
    r = constrained(0, r"[ab]c[0-9]")
    trace = serve([r], slots=1).trace()
    counts = [s.allowed.get("c0") for s in trace.steps if "c0" in s.allowed]
    assert counts == [2, 1, 10, 1]  # a or b; c; a digit; then only EOS
    assert EOS not in r.output_ids and decode(r.output_ids)[1] == "c"
