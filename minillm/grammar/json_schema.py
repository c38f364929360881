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

Strings hold any Unicode character, as JSON allows: raw (UTF-8, valid sequences only) or escaped (\\uXXXX, a
surrogate pair for a character past U+FFFF; a lone surrogate is no character and is refused, as I-JSON, RFC 7493,
asks). minLength and maxLength count characters, as JSON Schema does; such a string writes its characters raw
(COUNTED_CHAR: fewer states per counted position). An enum or const string, and a property name, is matched with
each non-ASCII character in either form (raw, or \\uXXXX with hex digits in either case) and its ASCII characters
as json.dumps writes them (a string inside an enum's array or object value: as json.dumps writes it).

Limits, checked as the pattern grows (never after it is built, so no schema costs more than they allow): a schema
nested more than MAX_DEPTH deep, or a pattern past MAX_PATTERN characters (an array's items appear twice in its
pattern: nested arrays double it at every level), is a SchemaError naming the limit.

The layout is one way to write each value: no whitespace but one optional space after ':' and ','. Numbers have at
most 15 digits before and after the point (a float's precision). Every state of the automaton can still reach an end
(automaton.prune), so a reply cut at any token can be finished; max_new_tokens bounds how long it may take.
`{"type": "json_object"}` (any JSON object) is not regular: JSON nests without bound. ANY_OBJECT allows objects
nested JSON_OBJECT_DEPTH deep, which every reply of the tiny model and most tools' replies fit.
"""

from __future__ import annotations

import json

from minillm.errors import InputError
from minillm.grammar.regex import MAX_PATTERN


class SchemaError(InputError):
    """A schema outside the subset above: the message names the keyword and where it is."""


# Schemas nested deeper than this are refused. Real schemas (tools' arguments, extraction forms) are a few levels
# deep, rarely ten; 32 leaves room for those, and bounds the recursion here (two frames a level) and the groups of
# the pattern (regex.MAX_NESTING): a request cannot exhaust the stack (330 levels did: a RecursionError, a 500).
MAX_DEPTH = 32
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
# \uXXXX's four digits: a character of the basic plane, or a surrogate pair (a high \uD800-\uDBFF, then a low one)
UNICODE_ESCAPE = (
    r"([0-9a-cA-CefEF][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2}|[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2})"
)
# a character inside a JSON string: plain ASCII but '"', '\' and controls, any other character as UTF-8, or escaped
CHAR = r'([^"\\\x00-\x1f]|\P{ASCII}|\\(["\\/bfnrt]|u' + UNICODE_ESCAPE + "))"
# in a string with minLength or maxLength, each counted position is a copy of its character's states: CHAR's are
# 20 (UTF-8's continuations, \u's digits and surrogates), this one's 9, so maxLength can reach about 200 (a layout
# choice: such a string writes its characters raw, never \uXXXX, and the reply is still valid JSON of the schema)
COUNTED_CHAR = r'([^"\\\x00-\x1f]|\P{ASCII}|\\["\\/bfnrt])'
INTEGER = r"-?(0|[1-9][0-9]{0,14})"
NUMBER = INTEGER + r"(\.[0-9]{1,15})?([eE][+-]?[0-9]{1,3})?"
COLON, COMMA = ": ?", ", ?"


def escape(text: str) -> str:
    """`text` as a regex matching exactly it."""
    return "".join("\\" + c if c in SPECIALS else c for c in text)


def too_long(where: str) -> SchemaError:
    return SchemaError(f"{where}: the schema's pattern grows past {MAX_PATTERN:,} characters, the limit is "
                       f"{MAX_PATTERN:,} (fewer, shorter or less nested fields: array items count twice)")  # fmt: skip


def fits(text: str, where: str) -> str:
    """`text` (a piece of the pattern as it grows: at most twice a piece that fitted), or the limit's SchemaError."""
    if len(text) > MAX_PATTERN:
        raise too_long(where)
    return text


def joined(pieces, separator: str, where: str) -> str:
    """separator.join(pieces), each piece made only while the total so far fits."""
    parts, total = [], 0
    for piece in pieces:
        total += len(piece) + len(separator)
        if total > MAX_PATTERN:
            raise too_long(where)
        parts.append(piece)
    return separator.join(parts)


def unicode_escape(char: str) -> str:
    """The regex of `char` written as \\uXXXX (two of them past U+FFFF), its hex digits in either case."""
    units = json.dumps(char, ensure_ascii=True)[1:-1].split("\\u")[1:]
    return "".join(r"\\u" + "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else c for c in unit) for unit in units)


def string_literal(text: str, where: str) -> str:
    """The regex of the JSON string `text`: ASCII as json.dumps writes it, other characters raw or escaped."""
    pieces, total = ['"'], 2
    for char in text:
        piece = escape(json.dumps(char)[1:-1]) if char.isascii() else f"({char}|{unicode_escape(char)})"
        total += len(piece)
        if total > MAX_PATTERN:
            raise too_long(where)
        pieces.append(piece)
    return "".join(pieces) + '"'


def literal(value, where: str = "the schema") -> str:
    """A JSON value as a regex: a string in either form (string_literal), anything else as json.dumps writes it."""
    if isinstance(value, str):
        return string_literal(value, where)
    try:
        return fits(escape(json.dumps(value, ensure_ascii=True, allow_nan=False)), where)
    except ValueError:  # (NaN and Infinity: Python's json reads them, but they are not JSON)
        raise SchemaError(f"{value!r} is not a JSON value (NaN and Infinity are not JSON)") from None
    except RecursionError:  # (a value nested thousands deep)
        raise SchemaError(f"{where}: a value nested more than {MAX_DEPTH} deep, the limit is {MAX_DEPTH}") from None


def string(low: int = 0, high: int | None = None) -> str:
    return f'"{CHAR}*"' if (low, high) == (0, None) else f'"{COUNTED_CHAR}{{{low},{"" if high is None else high}}}"'


def preview(value, size: int = 60) -> str:
    """The start of `value` as JSON, for a message (never an error of its own: a value may nest thousands deep)."""
    try:
        return json.dumps(value, default=repr)[:size]
    except (ValueError, RecursionError):
        return repr(type(value).__name__)


def schema_regex(schema, where: str = "the schema", depth: int = 0) -> str:
    """The regex of the JSON texts `schema` allows (module docstring); SchemaError for what the subset cannot keep.
    `depth`: how deep `schema` sits in the client's (MAX_DEPTH)."""
    if depth > MAX_DEPTH:
        raise SchemaError(f"{where}: the schema is nested more than {MAX_DEPTH} levels deep, the limit is {MAX_DEPTH}")
    if not isinstance(schema, dict):
        raise SchemaError(f"{where} must be an object (a JSON schema), got {preview(schema)}")
    if "enum" in schema or "const" in schema:
        values = schema["enum"] if "enum" in schema else [schema["const"]]
        if not isinstance(values, list) or not values:
            raise SchemaError(f"{where}: enum must be a non-empty list of values")
        unknown = set(schema) - {"enum", "const", "type"} - IGNORED
        if unknown:
            raise SchemaError(f"{where}: {sorted(unknown)[0]!r} beside enum is not supported")
        return "(" + joined((literal(v, where) for v in values), "|", where) + ")"
    kinds = schema.get("type")
    if kinds is None:
        unknown = sorted(set(schema) - IGNORED - {"type"})
        if unknown:  # (anyOf, $ref, ...: name the keyword the subset cannot keep, not the missing type)
            raise SchemaError(f"{where}: the keyword {unknown[0]!r} is not supported (give a 'type' or an enum)")
        raise SchemaError(f"{where} has no 'type' (give one of {sorted(ALLOWED)}, or an enum)")
    if isinstance(kinds, list):
        if not kinds:
            raise SchemaError(f"{where}: 'type' is an empty list")
        return "(" + joined((schema_regex(schema | {"type": kind}, where, depth) for kind in kinds), "|", where) + ")"
    if not isinstance(kinds, str) or kinds not in ALLOWED:
        raise SchemaError(f"{where}: type {kinds!r} is not supported (supported: {', '.join(sorted(ALLOWED))})")
    unsupported = set(schema) - ALLOWED[kinds] - IGNORED
    if unsupported:
        keyword = sorted(unsupported)[0]
        raise SchemaError(f"{where}: the keyword {keyword!r} is not supported for type {kinds!r} (minillm keeps "
                          f"{', '.join(sorted(ALLOWED[kinds] - {'type'})) or 'no other keywords'} there)")  # fmt: skip
    build = {"object": object_regex, "array": array_regex, "string": string_regex}.get(kinds, scalar_regex)
    return fits(build(schema, where, depth), where)


def scalar_regex(schema: dict, where: str, depth: int) -> str:
    return {"integer": INTEGER, "number": NUMBER, "boolean": "(true|false)", "null": "null"}[schema["type"]]


def string_regex(schema: dict, where: str, depth: int) -> str:
    low, high = schema.get("minLength", 0), schema.get("maxLength")
    if not (isinstance(low, int) and 0 <= low and (high is None or isinstance(high, int) and low <= high)):
        raise SchemaError(f"{where}: minLength and maxLength must be whole numbers, the least first")
    return string(low, high)


def array_regex(schema: dict, where: str, depth: int) -> str:
    if "items" not in schema:
        raise SchemaError(f"{where}: an array needs 'items' (the schema of its elements)")
    item = schema_regex(schema["items"], f"{where}.items", depth + 1)  # (at most MAX_PATTERN: twice that below)
    low, high = schema.get("minItems", 0), schema.get("maxItems")
    if not isinstance(low, int) or low < 0 or (high is not None and (not isinstance(high, int) or high < low)):
        raise SchemaError(f"{where}: minItems and maxItems must be whole numbers, the least first")
    if high == 0:
        return r"\[\]"
    more = f"({COMMA}{item}){{{max(low - 1, 0)},{'' if high is None else high - 1}}}"
    items = f"{item}{more}"
    return rf"\[{items}\]" if low > 0 else rf"\[({items})?\]"


def object_regex(schema: dict, where: str, depth: int) -> str:
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
    fields = (field(name, sub, where, depth) for name, sub in properties.items())
    return r"\{" + joined(fields, COMMA, where) + r"\}"


def field(name: str, sub, where: str, depth: int) -> str:
    """'"name": value' as a regex (the name first checked: a long one would lengthen every message below it)."""
    name_regex = literal(name, where)
    return f"{name_regex}{COLON}{schema_regex(sub, f'{where}.{name}', depth + 1)}"


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
