"""The grammar's limits hold as a pattern grows (no request costs more time or memory than they allow, none reaches a
RecursionError), and its characters are Unicode's: JSON strings hold any character, raw or escaped, as `json` reads
them; a regex's \\xHH and \\uXXXX are characters, as `re` reads them (issue 40)."""

from __future__ import annotations

import json
import re
import time
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm.errors import InputError
from minillm.grammar import MAX_PATTERN, compile_regex, compile_schema
from minillm.grammar.automaton import DEAD, MAX_STATES, MAX_WORK
from minillm.grammar.json_schema import MAX_DEPTH, schema_regex
from minillm.grammar.regex import MAX_NESTING, RegexError
from minillm.serving.openai_protocol import ApiError
from minillm.serving.openai_structured import automaton, pattern_of

SECONDS = 3.0  # of this process's CPU time (each case takes well under a second alone; CPU time, not the wall clock,
# so that other processes on a loaded 2-core machine do not count; they still slow it: the slowest, 0.6 s alone,
# took 2.0 s of CPU once beside the suite, app servers and a browser; unbounded, it took 116 s)
MEGABYTES = 64


def nested(kind: str, depth: int) -> dict:
    schema = {"type": "integer"}
    for _ in range(depth):
        if kind == "array":
            schema = {"type": "array", "items": schema}
        else:
            schema = {"type": "object", "properties": {"a": schema}, "required": ["a"], "additionalProperties": False}
    return schema


def refused_quickly(build) -> str:
    """The refusal's message, checked to come within SECONDS of CPU time and (run again, traced) MEGABYTES of Python
    memory."""
    start = time.process_time()
    with pytest.raises(InputError) as refusal:
        build()
    took = time.process_time() - start
    assert took < SECONDS, f"refused after {took:.2f} s"
    tracemalloc.start()
    try:
        with pytest.raises(InputError):
            build()
        peak = tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()
    assert peak < MEGABYTES, f"refused after {peak:.0f} MB"
    return str(refusal.value)


# --- limits -----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("depth", [20, 26, 40])
def test_arrays_nested_deep_are_refused_at_once_with_the_length_limit(depth):
    """Each array level doubles the pattern (its items twice): checked as it grows, never built in full."""
    message = refused_quickly(lambda: compile_schema(nested("array", depth)))
    assert f"the limit is {MAX_PATTERN:,}" in message or f"the limit is {MAX_DEPTH}" in message, message


@pytest.mark.parametrize("kind", ["array", "object"])
@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 330, 2_000])
def test_a_schema_nested_past_the_limit_is_refused_naming_it(kind, depth):
    if kind == "object":
        message = refused_quickly(lambda: compile_schema(nested(kind, depth)))
        assert f"nested more than {MAX_DEPTH} levels deep, the limit is {MAX_DEPTH}" in message, message
    with pytest.raises(ApiError) as refusal:  # the server's way: a 400 on response_format, naming the limit
        pattern_of(
            {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": nested(kind, depth)}}}
        )
    assert refusal.value.status == 400 and refusal.value.param == "response_format"
    assert "the limit is" in str(refusal.value), str(refusal.value)


def test_objects_nested_to_the_limit_still_compile():
    dfa = compile_schema(nested("object", MAX_DEPTH))
    assert dfa.matches(json.dumps(json.loads('{"a": ' * MAX_DEPTH + "7" + "}" * MAX_DEPTH)))


def test_many_wide_pieces_are_refused_before_they_are_joined():
    wide = {"type": "array", "items": {"type": "array", "items": {"type": "string", "maxLength": 9}}}
    names = [f"p{i}" for i in range(5_000)]
    schema = {
        "type": "object",
        "properties": dict.fromkeys(names, wide),
        "required": names,
        "additionalProperties": False,
    }
    assert f"{MAX_PATTERN:,}" in refused_quickly(lambda: schema_regex(schema))
    assert f"{MAX_PATTERN:,}" in refused_quickly(lambda: schema_regex({"type": ["array"] * 10_000, "items": wide}))
    assert f"{MAX_PATTERN:,}" in refused_quickly(lambda: schema_regex({"enum": ["é" * 50_000]}))


@pytest.mark.parametrize(
    "pattern", [r"([a-z]{1,20}){1,100}@x", r"((a?){100}){100}b", r"((a|b?){200}){50}", r"(a|b)*a(a|b){14}"]
)
def test_a_pattern_whose_automaton_is_too_large_is_refused_within_a_second_or_so(pattern):
    """The state count alone does not bound the work: a state of ((a?){100}){100}b holds thousands of positions
    (116 s and 11 GB before the work was counted)."""
    message = refused_quickly(lambda: compile_regex.__wrapped__(pattern))
    assert f"the limit is {MAX_STATES}" in message or f"the limit is {MAX_WORK:,}" in message, message


@pytest.mark.parametrize("pattern", ["(" * 10_000 + "a" + ")" * 10_000, "(?:" * 3_000 + "a" + ")" * 3_000])
def test_groups_nested_past_the_limit_are_refused_not_a_recursion_error(pattern):
    message = refused_quickly(lambda: compile_regex("x" + pattern[: MAX_PATTERN - 1]))
    assert f"the limit is {MAX_NESTING}" in message, message
    compile_regex("(" * MAX_NESTING + "a" + ")" * MAX_NESTING)  # (the limit itself compiles)


@pytest.mark.parametrize("pattern", ["a**", "a{2}{3}", "(a*)*{2}"])
def test_a_repeat_of_a_repeat_is_refused_as_python_does(pattern):
    with pytest.raises(re.error):
        re.compile(pattern)
    with pytest.raises(RegexError, match="repeat of a repeat"):
        compile_regex(pattern)


def test_the_server_refuses_them_with_a_400_that_names_the_limit():
    deep = pattern_of(
        {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": nested("array", 6)}}}
    )[0]
    assert automaton(deep) is not None  # (a few levels are fine)
    with pytest.raises(ApiError) as refusal:
        automaton(r"([a-z]{1,20}){1,100}@x", "regex")
    assert refusal.value.status == 400 and "the limit is" in str(refusal.value)


# --- JSON strings hold any character ------------------------------------------------------------------------------
STRING = compile_schema({"type": "string"})


@pytest.mark.parametrize(
    "text", ['"é"', '"\\u00e9"', '"\\u00E9"', '"😀"', '"\\ud83d\\ude00"', '"\\uD83D\\uDE00"', '"日本語"',
             '"a\\"b\\\\c\\/\\n"', '"\x7f"', '"\U0010ffff"', '"\\uffff"', '""'],
)  # fmt: skip
def test_a_json_string_holds_any_character_raw_or_escaped(text):
    assert isinstance(json.loads(text), str)
    assert STRING.matches(text), text


@pytest.mark.parametrize("text", ['"\x01"', '"\n"', '"\\x41"', '"\\u12"', '"\\ud83d"', '"\\ude00"', '"\\ud83dx"', '"a'])
def test_raw_controls_bad_escapes_and_lone_surrogates_are_refused(text):
    assert not STRING.matches(text), text


@pytest.mark.parametrize(
    "data", [b'"\xc0\x80"', b'"\xc3"', b'"\xed\xa0\x80"', b'"\xf4\x90\x80\x80"', b'"\xf5\x80\x80\x80"', b'"\x80"',
             b'"\xe0\x80\xaf"', b'"\xff"'],
)  # fmt: skip
def test_only_valid_utf8_is_allowed(data):
    with pytest.raises(UnicodeDecodeError):
        data.decode("utf-8")
    state = STRING.walk(0, data)
    assert state == DEAD or not STRING.accepts(state), data


def loads_a_string(text: str, longest: int | None = None) -> bool:
    """What `json` and the schema say: one JSON string, nothing around it, every character one UTF-8 can write."""
    if text != text.strip(" \t\n\r"):
        return False
    try:
        value = json.loads(text)
        value.encode("utf-8")  # (a lone surrogate json reads, but it is no character)
    except (ValueError, AttributeError, UnicodeEncodeError):
        return False
    return isinstance(value, str) and (longest is None or len(value) <= longest)


PIECES = ['"', "\\", "u", "d", "8", "3", "D", "e", "0", "E", "n", "/", "a", "é", "😀", "\x01", " "]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=14))
def test_the_string_automaton_accepts_what_json_accepts(pieces):
    text = '"' + "".join(pieces) + '"'
    assert STRING.matches(text) == loads_a_string(text), text


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([p for p in PIECES if p != "u"]), max_size=8))
def test_a_counted_string_accepts_what_json_and_max_length_accept(pieces):
    """(with maxLength, characters are written raw: \\uXXXX is left out of the alphabet)"""
    text = '"' + "".join(pieces) + '"'
    assert compile_schema({"type": "string", "maxLength": 3}).matches(text) == loads_a_string(text, 3), text


@pytest.mark.parametrize("value", ["café", "😀!", "日本", 'a"é\\'])
def test_an_enum_value_matches_in_either_form(value):
    dfa = compile_schema({"enum": [value, 1]})
    forms = {json.dumps(value), json.dumps(value, ensure_ascii=False), json.dumps(value).upper().replace("\\U", "\\u")}
    for text in forms:
        if json.loads(text) == value:
            assert dfa.matches(text), text
    assert not dfa.matches(json.dumps(value + "x")) and dfa.matches("1")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["c", "a", "f", "é", "\\", "u", "0", "e", "9", "E", '"']), max_size=12))
def test_what_an_enum_allows_json_reads_as_its_value(pieces):
    text = '"' + "".join(pieces) + '"'
    if compile_schema({"enum": ["café"]}).matches(text):
        assert json.loads(text) == "café", text


def test_a_property_name_matches_in_either_form():
    dfa = compile_schema({"type": "object", "properties": {"prénom": {"type": "string"}}, "required": ["prénom"],
                          "additionalProperties": False})  # fmt: skip
    for doc in ({"prénom": "Zoé"}, {"prénom": "Zo\\u00e9"}):
        assert dfa.matches(json.dumps(doc)) and dfa.matches(json.dumps(doc, ensure_ascii=False))


# --- a regex's characters by number ---------------------------------------------------------------------------------
NUMBERED = [r"caf\xe9", r"\u00e9+x?", r"(\U0001F600|\x41)*", r"[\x41-\x43]+\u65e5", r"\x7f\x00?", r"caf(e|\u00e9)s?"]


@pytest.mark.parametrize("pattern", NUMBERED)
@settings(max_examples=80, deadline=None)
@given(text=st.text(alphabet="cafeésxABC\x7f\x00日😀", max_size=6))
def test_numbered_characters_are_read_as_pythons_re_reads_them(pattern, text):
    dfa = compile_regex(pattern)
    assert dfa.matches(text) == bool(re.fullmatch(pattern, text)), (pattern, text)


def test_caf_xe9_is_cafe_with_an_accent():
    dfa = compile_regex(r"caf\xe9")
    assert dfa.matches("café") and re.fullmatch(r"caf\xe9", "café")
    assert not dfa.accepts(dfa.walk(0, b"caf\xe9"))  # (no longer the raw byte 0xE9: invalid UTF-8)


@pytest.mark.parametrize(
    "pattern, needle",
    [(r"[\xe9]", "ASCII"), (r"[\u00e9-\u00ff]", "ASCII"), (r"\ud800", "surrogate"), (r"\U00110000", "U+10FFFF"),
     (r"\u12", "4 hex digits"), (r"[\P{ASCII}]", "class")],
)  # fmt: skip
def test_numbered_characters_a_class_or_utf8_cannot_hold_are_refused(pattern, needle):
    with pytest.raises(RegexError, match=re.escape(needle)):
        compile_regex(pattern)


def test_any_non_ascii_character_is_one_escape():
    dfa = compile_regex(r"(\P{ASCII}|[a-z])+")
    for text in ("é", "日本", "😀x", "\U0010ffff", "\x80"):
        assert dfa.matches(text), text
    assert not dfa.matches("A") and dfa.walk(0, b"\xed\xa0\x80") == DEAD
