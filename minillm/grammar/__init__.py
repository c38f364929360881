"""Constraints on a reply, compiled by hand: a regex (regex.py) or a JSON schema (json_schema.py, via a regex)
becomes a finite automaton over bytes (automaton.py), whose states say which tokens may come next.

    from minillm.grammar import compile_regex, compile_schema
    dfa = compile_regex(r"(yes|no)")  # Request(..., sampling=Sampling(constraint=dfa)): LayeredEngine does the rest
"""

from __future__ import annotations

import functools
import json

from minillm.grammar.automaton import Dfa
from minillm.grammar.json_schema import any_object, schema_regex

MAX_PATTERN = 20_000  # characters of a pattern (a schema's regex included): beyond it, refused with the limit


@functools.lru_cache(maxsize=64)
def compile_regex(pattern: str) -> Dfa:
    """The automaton of `pattern` (kept: the same pattern twice is compiled once)."""
    from minillm.grammar.regex import RegexError

    if len(pattern) > MAX_PATTERN:
        raise RegexError(f"the pattern is {len(pattern):,} characters; the limit is {MAX_PATTERN:,}")
    return Dfa.from_regex(pattern)


def compile_schema(schema: dict) -> Dfa:
    """The automaton of the JSON texts `schema` allows (json_schema.py says which schemas)."""
    return _compiled_schema(json.dumps(schema))  # (the key keeps the order: properties come in it)


@functools.lru_cache(maxsize=64)
def _compiled_schema(text: str) -> Dfa:
    return compile_regex(schema_regex(json.loads(text)))


def compile_json_object() -> Dfa:
    """Any JSON object, nested a few levels (response_format {"type": "json_object"})."""
    return compile_regex(any_object())
