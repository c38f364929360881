"""A JSON schema (a subset) -> a regular expression for the JSON texts it allows (automaton.py compiles it).

What a client asks for with `response_format` (the OpenAI API's "json_schema", its strict mode's rules):

    {"type": "object", "properties": {...}, "required": [every property], "additionalProperties": false}
    {"type": "string"}  (minLength, maxLength; or "enum": [...])     {"type": "integer"}    {"type": "number"}
    {"type": "boolean"}    {"type": "null"}    {"type": "array", "items": {...}}  (minItems, maxItems)
    {"enum": [any JSON values]}    {"const": value}    "type": [several of the above]

Properties come in the schema's order with every one present, as OpenAI's strict mode requires ("all fields must
be required"): an optional property would multiply the pattern by two per property. A keyword this subset cannot
keep (pattern, format, minimum, anyOf, $ref, ...) is a SchemaError naming it, never ignored: a client that asked for
a minimum must not get a reply that only looks right. Words that constrain nothing (title, description, $schema,
default, examples) are allowed.

The layout is one way to write each value: no whitespace but one optional space after ':' and ','. Numbers have at
most 15 digits before and after the point (a float's precision). Every state of the automaton can still reach an end
(automaton.prune), so a reply cut at any token can be finished; max_new_tokens bounds how long it may take.
`{"type": "json_object"}` (any JSON object) is not regular: JSON nests without bound. ANY_OBJECT allows objects
nested JSON_OBJECT_DEPTH deep, which every reply of the tiny model and most tools' replies fit.
"""

from __future__ import annotations

import json

from minillm.errors import InputError


class SchemaError(InputError):
    """A schema outside the subset above: the message names the keyword and where it is."""


JSON_OBJECT_DEPTH = 3  # objects and arrays inside an {"type": "json_object"} reply, at most this deep
IGNORED = {"title", "description", "$schema", "$id", "default", "examples", "$comment"}
ALLOWED = {  # per type: the keywords this subset keeps
    "object": {"type", "properties", "required", "additionalProperties"},
    "array": {"type", "items", "minItems", "maxItems"},
    "string": {"type", "minLength", "maxLength", "enum"},
    "integer": {"type", "enum"},
    "number": {"type", "enum"},
    "boolean": {"type", "enum"},
    "null": {"type"},
}

SPECIALS = set(".^$*+?()[]{}|\\/")
CHAR = r'([^"\\\x00-\x1f]|\\["\\/bfnrt])'  # a character inside a JSON string: plain, or escaped
INTEGER = r"-?(0|[1-9][0-9]{0,14})"
NUMBER = INTEGER + r"(\.[0-9]{1,15})?([eE][+-]?[0-9]{1,3})?"
COLON, COMMA = ": ?", ", ?"


def escape(text: str) -> str:
    """`text` as a regex matching exactly it."""
    return "".join("\\" + c if c in SPECIALS else c for c in text)


def literal(value) -> str:
    """A JSON value written exactly as json.dumps writes it, as a regex."""
    try:
        return escape(json.dumps(value, ensure_ascii=True, allow_nan=False))
    except ValueError:  # (NaN and Infinity: Python's json reads them, but they are not JSON)
        raise SchemaError(f"{value!r} is not a JSON value (NaN and Infinity are not JSON)") from None


def string(low: int = 0, high: int | None = None) -> str:
    return f'"{CHAR}*"' if (low, high) == (0, None) else f'"{CHAR}{{{low},{"" if high is None else high}}}"'


def schema_regex(schema, where: str = "the schema") -> str:
    """The regex of the JSON texts `schema` allows (module docstring); SchemaError for what the subset cannot keep."""
    if not isinstance(schema, dict):
        raise SchemaError(f"{where} must be an object (a JSON schema), got {json.dumps(schema)[:60]}")
    if "enum" in schema or "const" in schema:
        values = schema["enum"] if "enum" in schema else [schema["const"]]
        if not isinstance(values, list) or not values:
            raise SchemaError(f"{where}: enum must be a non-empty list of values")
        unknown = set(schema) - {"enum", "const", "type"} - IGNORED
        if unknown:
            raise SchemaError(f"{where}: {sorted(unknown)[0]!r} beside enum is not supported")
        return "(" + "|".join(literal(v) for v in values) + ")"
    kinds = schema.get("type")
    if kinds is None:
        unknown = sorted(set(schema) - IGNORED - {"type"})
        if unknown:  # (anyOf, $ref, ...: name the keyword the subset cannot keep, not the missing type)
            raise SchemaError(f"{where}: the keyword {unknown[0]!r} is not supported (give a 'type' or an enum)")
        raise SchemaError(f"{where} has no 'type' (give one of {sorted(ALLOWED)}, or an enum)")
    if isinstance(kinds, list):
        if not kinds:
            raise SchemaError(f"{where}: 'type' is an empty list")
        return "(" + "|".join(schema_regex(schema | {"type": kind}, where) for kind in kinds) + ")"
    if not isinstance(kinds, str) or kinds not in ALLOWED:
        raise SchemaError(f"{where}: type {kinds!r} is not supported (supported: {', '.join(sorted(ALLOWED))})")
    unsupported = set(schema) - ALLOWED[kinds] - IGNORED
    if unsupported:
        keyword = sorted(unsupported)[0]
        raise SchemaError(f"{where}: the keyword {keyword!r} is not supported for type {kinds!r} (minillm keeps "
                          f"{', '.join(sorted(ALLOWED[kinds] - {'type'})) or 'no other keywords'} there)")  # fmt: skip
    return {"object": object_regex, "array": array_regex, "string": string_regex}.get(kinds, scalar_regex)(
        schema, where
    )


def scalar_regex(schema: dict, where: str) -> str:
    return {"integer": INTEGER, "number": NUMBER, "boolean": "(true|false)", "null": "null"}[schema["type"]]


def string_regex(schema: dict, where: str) -> str:
    low, high = schema.get("minLength", 0), schema.get("maxLength")
    if not (isinstance(low, int) and 0 <= low and (high is None or isinstance(high, int) and low <= high)):
        raise SchemaError(f"{where}: minLength and maxLength must be whole numbers, the least first")
    return string(low, high)


def array_regex(schema: dict, where: str) -> str:
    if "items" not in schema:
        raise SchemaError(f"{where}: an array needs 'items' (the schema of its elements)")
    item = schema_regex(schema["items"], f"{where}.items")
    low, high = schema.get("minItems", 0), schema.get("maxItems")
    if not isinstance(low, int) or low < 0 or (high is not None and (not isinstance(high, int) or high < low)):
        raise SchemaError(f"{where}: minItems and maxItems must be whole numbers, the least first")
    if high == 0:
        return r"\[\]"
    more = f"({COMMA}{item}){{{max(low - 1, 0)},{'' if high is None else high - 1}}}"
    items = f"{item}{more}"
    return rf"\[{items}\]" if low > 0 else rf"\[({items})?\]"


def object_regex(schema: dict, where: str) -> str:
    properties = schema.get("properties", {})
    if not isinstance(properties, dict):
        raise SchemaError(f"{where}: 'properties' must map names to schemas")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(name, str) for name in required):
        raise SchemaError(f"{where}: 'required' must be a list of property names")
    missing = [name for name in properties if name not in required]
    if missing:
        raise SchemaError(f"{where}: property {missing[0]!r} is not in 'required': list every property there (optional "
                          "properties are not supported, as in OpenAI's strict mode)")  # fmt: skip
    strangers = [name for name in required if name not in properties]
    if strangers:
        raise SchemaError(f"{where}: {strangers[0]!r} is required but not among the properties")
    if schema.get("additionalProperties", False) is not False:
        raise SchemaError(f"{where}: additionalProperties must be false (only the listed properties can be written)")
    fields = [f"{literal(name)}{COLON}{schema_regex(sub, f'{where}.{name}')}" for name, sub in properties.items()]
    return r"\{" + COMMA.join(fields) + r"\}"


def any_value(depth: int) -> str:
    """Any JSON value, with objects and arrays nested at most `depth` deep (strings, numbers, literals at 0)."""
    scalar = f"({string()}|{NUMBER}|true|false|null)"
    if depth == 0:
        return scalar
    inner = any_value(depth - 1)
    member = f"{string()}{COLON}{inner}"
    obj = rf"\{{({member}({COMMA}{member})*)?\}}"
    arr = rf"\[({inner}({COMMA}{inner})*)?\]"
    return f"({scalar}|{obj}|{arr})"


def any_object(depth: int = JSON_OBJECT_DEPTH) -> str:
    """Any JSON object (response_format {"type": "json_object"}), nested at most `depth` deep."""
    member = f"{string()}{COLON}{any_value(depth - 1)}"
    return rf"\{{({member}({COMMA}{member})*)?\}}"
