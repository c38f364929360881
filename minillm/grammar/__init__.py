"""Constraints on a reply, compiled by hand: a regex (regex.py) or a JSON schema (json_schema.py, via a regex)
becomes a finite automaton over bytes (automaton.py), whose states say which tokens may come next.

    from minillm.grammar import compile_regex, compile_schema
    dfa = compile_regex(r"(yes|no)")  # Request(..., sampling=Sampling(constraint=dfa)): LayeredEngine does the rest
"""

from __future__ import annotations

import functools
import json

from minillm.grammar.automaton import Dfa
from minillm.grammar.json_schema import MAX_DEPTH, SchemaError, any_object, schema_regex
from minillm.grammar.regex import MAX_PATTERN

__all__ = ["MAX_PATTERN", "Dfa", "compile_json_object", "compile_regex", "compile_schema"]


@functools.lru_cache(maxsize=64)
def compile_regex(pattern: str) -> Dfa:
    """The automaton of `pattern` (kept: the same pattern twice is compiled once); RegexError past a limit
    (regex.parse checks the length first)."""
    return Dfa.from_regex(pattern)


def compile_schema(schema: dict) -> Dfa:
    """The automaton of the JSON texts `schema` allows (json_schema.py says which schemas)."""
    try:
        key = json.dumps(schema)  # (the key keeps the order: properties come in it)
    except RecursionError:  # (nested thousands deep: schema_regex would refuse it at MAX_DEPTH)
        raise SchemaError(f"the schema is nested more than {MAX_DEPTH} levels deep, the limit is {MAX_DEPTH}") from None
    return _compiled_schema(key)


@functools.lru_cache(maxsize=64)
def _compiled_schema(text: str) -> Dfa:
    return compile_regex(schema_regex(json.loads(text)))


def compile_json_object() -> Dfa:
    """Any JSON object, nested a few levels (response_format {"type": "json_object"})."""
    return compile_regex(any_object())
