"""Structured output through the OpenAI API: a request's `response_format` (or `regex`) -> the pattern its reply
must match -> the automaton the engine masks each step with (grammar/, layers/constrain.py).

On both endpoints, /v1/chat/completions and /v1/completions (as vLLM takes them):

  "response_format": {"type": "text"}            a free reply (the default)
  "response_format": {"type": "json_object"}     any JSON object, nested up to JSON_OBJECT_DEPTH deep
  "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": {...}, "strict": true}}
  "regex": "(yes|no)"                            minillm's own extension (vLLM calls its field guided_regex)

Checked in two steps, both before the request reaches the engine, so a bad constraint is a 400 at once and the
engine only ever receives automata that work:
  1. with_pattern (after the other fields are read): the fields' shapes, and the schema's keywords: one the subset
     cannot keep (json_schema.py), nested too deep or whose pattern grows too long, is a 400 naming it or the
     limit, never ignored (the limits are checked as the pattern grows: no schema is ever built past them);
  2. automaton (then, on a worker thread): the pattern compiled; too large (characters, nesting, states, or the
     work of building them) is a 400 with the limit. Compiled automata are kept by pattern, so json_object
     compiles once per process (the app warms it when it starts) and a client's schema once, however often it is
     sent.
"""

from __future__ import annotations

import asyncio
import threading

from minillm.errors import InputError
from minillm.grammar import compile_regex
from minillm.grammar.automaton import Dfa
from minillm.grammar.json_schema import SchemaError, any_object, preview, schema_regex
from minillm.serving.openai_protocol import ApiError, Ask, utf8

JSON_SCHEMA_FIELDS = {"name", "schema", "strict", "description"}  # response_format.json_schema's, as OpenAI has them
SCHEMA_EXAMPLE = '{"name": "answer", "schema": {"type": "object", ...}, "strict": true}'
MAX_AUTOMATA = 64  # compiled patterns kept (refusals too): a client sends the same schema again and again


def with_pattern(ask: Ask, body: dict) -> Ask:
    """The Ask (parse_chat's or parse_completion's) with the pattern its reply must match, read from the body."""
    ask.pattern, ask.pattern_param = pattern_of(body)
    if ask.pattern is not None and ask.ignore_eos:
        raise ApiError(f"ignore_eos cannot go with {ask.pattern_param}: a constrained reply ends where its pattern "
                       "does", param="ignore_eos")  # fmt: skip
    return ask


def pattern_of(body: dict) -> tuple[str | None, str]:
    """The regex the reply must match (None: a free reply) and the field that asked for it."""
    fmt, regex = body.get("response_format"), body.get("regex")
    fmt = {"type": "text"} if fmt is None else fmt  # (null: as if absent)
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise ApiError('response_format must be {"type": "text"}, {"type": "json_object"} or {"type": "json_schema", '
                       f'"json_schema": {SCHEMA_EXAMPLE}}}, got {preview(fmt, 80)}',
                       param="response_format")  # fmt: skip
    extra = set(fmt) - {"type"} - ({"json_schema"} if fmt["type"] == "json_schema" else set())
    if extra:
        raise ApiError(f"response_format of type {fmt['type']!r} takes no field {sorted(extra)[0]!r}",
                       param="response_format")  # fmt: skip
    if regex is not None:
        if fmt["type"] != "text":
            raise ApiError("give either regex or response_format, not both", param="regex")
        if not isinstance(regex, str) or not regex:
            raise ApiError('regex must be a non-empty string, e.g. "(yes|no)"', param="regex")
        utf8(regex, "regex")
        return regex, "regex"
    if fmt["type"] == "text":
        return None, "response_format"
    if fmt["type"] == "json_object":
        return any_object(), "response_format"
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict) or "schema" not in spec or not isinstance(spec.get("name"), str):
        raise ApiError(f"response_format.json_schema must be an object like {SCHEMA_EXAMPLE} (name and schema are "
                       "required)", param="response_format")  # fmt: skip
    if set(spec) - JSON_SCHEMA_FIELDS:
        raise ApiError(f"response_format.json_schema has no field {sorted(set(spec) - JSON_SCHEMA_FIELDS)[0]!r} (it "
                       f"takes {', '.join(sorted(JSON_SCHEMA_FIELDS))})", param="response_format")  # fmt: skip
    if spec.get("strict") not in (None, True, False):
        raise ApiError("response_format.json_schema.strict must be true or false", param="response_format")
    # strict: false is accepted, and the reply still follows the schema exactly: OpenAI's non-strict mode only does
    # not promise that it will, so a reply that does keeps the contract (and the client asked for this schema).
    try:
        return schema_regex(spec["schema"], where="response_format.json_schema.schema"), "response_format"
    except SchemaError as e:  # (its message names the keyword, and where it is: ...schema.properties' names)
        raise ApiError(str(e), param="response_format") from None


_automata: dict[str, Dfa | str] = {}  # pattern -> its automaton, or why it cannot have one (oldest first)
_compiling = threading.Lock()


def automaton(pattern: str | None, param: str = "response_format") -> Dfa | None:
    """The automaton of `pattern` (None: no constraint), or a 400 saying why it cannot be built.

    A new pattern can take seconds to compile (a big schema, or one past the state limit: that is known only once
    its automaton is built), so the app calls this on a worker thread, and one new pattern compiles at a time,
    leaving the other cores to the engine. A pattern seen before, refused or not, answers at once."""
    if pattern is None:
        return None
    found = _automata.get(pattern)
    if found is None:
        with _compiling:
            found = _automata.get(pattern)
            if found is None:
                try:
                    found = compile_regex(pattern)
                except InputError as e:
                    found = str(e)
                if len(_automata) >= MAX_AUTOMATA:
                    del _automata[next(iter(_automata))]
                _automata[pattern] = found
    if isinstance(found, str):
        what = "the schema's automaton cannot be built: " if param == "response_format" else ""
        raise ApiError(f"{param}: {what}{found}", param=param)
    return found


async def constraint_for(ask: Ask) -> Dfa | None:
    """The automaton of an Ask's pattern, from the kept ones at once, else compiled on a worker thread (never on
    the event loop: every stream would wait)."""
    if ask.pattern is None or ask.pattern in _automata:
        return automaton(ask.pattern, ask.pattern_param)
    return await asyncio.to_thread(automaton, ask.pattern, ask.pattern_param)


def warm() -> None:
    """Compile json_object's automaton now (about a second, once per process), on a thread of its own: the first
    client that asks for it does not wait."""
    threading.Thread(target=automaton, args=(any_object(),), name="minillm-warm-json-object", daemon=True).start()
