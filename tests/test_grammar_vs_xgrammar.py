"""minillm's grammar masks against xgrammar's (the grammar engine vLLM and SGLang use), state by state.

Where xgrammar and transformers are installed (neither is a minillm dependency; skipped otherwise), the shipped
model is exported (`python -m minillm export`), xgrammar reads the folder's tokenizer.json the way vLLM and SGLang
build it (`TokenizerInfo.from_huggingface(AutoTokenizer.from_pretrained(folder), vocab_size=260)`), and the same
regexes and JSON schemas are compiled by both. Seeded random walks then read many prefixes of accepted tokens (about
46,000 over 21 cases, a few seconds); at each prefix the tokens allowed next are compared: the 256 bytes, and EOS
(where the reply may end).

What is compared, and what is not, on purpose:
- The layout (docs/serving.md, "Output that obeys"): minillm writes JSON compactly with ONE OPTIONAL space after
  ':' and ','. xgrammar is configured compactly (any_whitespace=False, separators=(",", ":")), so the one difference
  left is minillm's optional space after a ':' or ',' outside a string; a walk takes that space now and then on
  minillm's side only (xgrammar reads the same text without it), and the masks after it must agree again.
- Numbers: minillm allows at most 15 digits before and after the point and 3 in the exponent (a float's precision;
  documented); xgrammar any number. A digit that only xgrammar allows past those counts is that choice.
- minillm matches an enum value or property name like "café" in either form, raw or \\u00e9 (documented); xgrammar
  only raw: a backslash inside a string that only minillm allows is that choice (walks never take it).
- A surrogate is no character: minillm refuses a lone \\ud800 escape (I-JSON, RFC 7493) and the UTF-8 bytes of one
  (0xED then 0xA0-0xBF: RFC 3629, valid UTF-8 only), both documented; xgrammar takes any four hex digits and those
  bytes. There the comparison is restricted: minillm's tokens must be a subset of xgrammar's.
- `-0` as an integer: valid JSON (and the integer 0 by JSON Schema); minillm allows it, xgrammar 0.2's integer
  grammar does not. Counted as xgrammar's narrower choice.
- Regex classes: `.`, negated classes, \\W and \\S mean ASCII characters in minillm (documented: a class is a set of
  bytes), any character in xgrammar: for the patterns that use them, a byte >= 0x80 only xgrammar allows is that
  choice. Where xgrammar differs from Python's `re` (which minillm follows), per pattern: xgrammar's `.` matches a
  newline, and its \\s lacks \\x1c-\\x1f (so its \\S has them).
- Two things that are xgrammar's, not minillm's: in a string with maxLength, xgrammar 0.2 allows raw control
  characters (0x00-0x1f, not valid in JSON) and no escapes (minillm allows the short escapes, \\n, \\" ...); and the
  special tokens <pad> <bos> <sep> (256, 257, 259): xgrammar finds no special tokens in the vocabulary and reads them
  as their text ("<pad>"), so it allows them wherever that text fits (inside a JSON string). Ids 256, 257 and 259
  are left out of the comparison; minillm never allows them.
Every other difference fails the test, with the pattern, the prefix and the tokens allowed by one side only.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter

import numpy as np
import pytest

from minillm.__main__ import main
from minillm.grammar import compile_regex, compile_schema
from minillm.model.tokenizer import BOS, EOS, PAD, SEP, VOCAB_SIZE

xgr = pytest.importorskip("xgrammar", reason="xgrammar (vLLM's grammar engine) is not a minillm dependency")
transformers = pytest.importorskip("transformers", reason="transformers is not a minillm dependency")

SEED = 40
WALKS, STEPS = 120, 80  # per case: up to 120 walks of 80 tokens (21 cases: about 50,000 prefixes, ~10 s)
SPACE, BACKSLASH, ZERO = ord(" "), ord("\\"), ord("0")
DIGITS = set(b"0123456789")
CONTROLS = set(range(0x20))
NON_ASCII = set(range(0x80, 0x100))
UTF8_SURROGATES = set(range(0xA0, 0xC0))  # after 0xED: U+D800-DFFF, no character (RFC 3629)
# bytes a walk prefers now and then, so values, strings and arrays get closed (a uniform pick stays in a string)
STRUCTURAL = set(b'"{}[],:-.eE0123456789tfnul')

PY_SPACES = set(range(0x1C, 0x20))  # \s in Python's re (str patterns) and minillm; not in xgrammar's
# (pattern, bytes only xgrammar may allow, bytes only minillm may allow: the choices in the module docstring)
ASCII_CLASSES = NON_ASCII  # minillm: `.`, negated classes, \\W, \\S are ASCII (documented); xgrammar: any character
REGEXES = [
    ("(yes|no|maybe)", set(), set()),
    ("(cat|car|cart)s?|dog", set(), set()),
    ("[0-9]{3}-[0-9]{2,4}(-[a-z]{1,3})?", set(), set()),
    ("(a+)+b", set(), set()),
    ("((ab|a)(ba|b)?){1,4}c", set(), set()),
    ("café( au lait)?|crème", set(), set()),
    (r"caf\xe9|na\u00efve|\U0001F600{1,3}", set(), set()),
    (r"\d{1,3}(\.\d{1,3}){3}", set(), set()),
    (r"[A-Za-z_]\w{0,6}( [a-z]+){0,2}", set(), set()),
    (r"[^,\n]{1,4}(,[^,\n]{1,4}){0,2}", ASCII_CLASSES, set()),
    # \S: xgrammar's \s lacks \x1c-\x1f (Python's re has them), so its \S has them
    (r"\W\S?", ASCII_CLASSES | PY_SPACES, set()),
    # xgrammar's `.` also matches a newline (Python's re: not, nor minillm's)
    (r"a.{1,3}b", ASCII_CLASSES | {ord("\n")}, set()),
    # \s: xgrammar adds Unicode spaces (minillm: ASCII) and lacks \x1c-\x1f
    (r"x\s{1,2}y", ASCII_CLASSES, PY_SPACES),
]

SCHEMAS = [
    {"type": "string"},
    {"enum": ["café", "naïve", "x", 1, None, True]},
    {"type": "integer"},
    {"type": "number"},
    {"type": ["boolean", "null"]},
    {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3},
    {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "ok": {"type": "boolean"},
            "tags": {"type": "array", "items": {"enum": ["a", "é"]}, "minItems": 0, "maxItems": 2},
            "pos": {
                "type": "object",
                "properties": {"x": {"type": "number"}, "y": {"type": ["integer", "null"]}},
                "required": ["x", "y"],
                "additionalProperties": False,
            },
        },
        "required": ["name", "ok", "tags", "pos"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"prénom": {"type": "string", "maxLength": 4}, "âge": {"type": "integer"}},
        "required": ["prénom", "âge"],
        "additionalProperties": False,
    },
]

# inside a string, a \u escape that is, or follows, a surrogate's (minillm: pairs only)
SURROGATE = re.compile(rb"\\u[dD]([0-9a-fA-F]{0,3}|[89abAB][0-9a-fA-F]{2}(\\(u([dD][0-9a-fA-F]{0,2})?)?)?)$")


def json_context(prefix: bytes) -> tuple[bool, int, bool]:
    """(inside a string, how many digits end the prefix outside one, whether they are an exponent's)."""
    in_string = escaped = False
    for b in prefix:
        if in_string:
            if escaped:
                escaped = False
            elif b == BACKSLASH:
                escaped = True
            elif b == ord('"'):
                in_string = False
        elif b == ord('"'):
            in_string = True
    if in_string:
        return True, 0, False
    run = len(prefix) - len(prefix.rstrip(b"0123456789"))
    before = prefix[: len(prefix) - run].rstrip(b"+-")
    return False, run, before[-1:] in (b"e", b"E")


def classify(
    prefix: bytes, x_only: set[int], m_only: set[int], is_json: bool, x_extra=frozenset(), m_extra=frozenset()
) -> str | None:
    """The documented reason for a difference (module docstring), or None: a disagreement."""
    if is_json:
        in_string, run, exponent = json_context(prefix)
        if in_string:
            if SURROGATE.search(prefix) and not m_only:
                return "lone surrogate escape refused (minillm)"
            if prefix.endswith(b"\xed") and not m_only and x_only <= UTF8_SURROGATES:
                return "UTF-8 of a surrogate refused (minillm)"
            if not x_only and m_only == {BACKSLASH}:
                return "enum or name: the escaped form (minillm)"
            if x_only <= CONTROLS and m_only <= {BACKSLASH}:
                return "maxLength: raw controls, no escapes (xgrammar)"
            return None
        if not x_only and m_only == {SPACE} and prefix[-1:] in (b":", b","):
            return "layout: optional space"
        if not m_only and x_only <= DIGITS and run >= (3 if exponent else 15):
            return "numbers: at most 15 digits (3 in an exponent)"
        if not x_only and m_only == {ZERO} and prefix.endswith(b"-"):
            return "-0 (xgrammar's integer refuses it)"
        return None
    if x_only <= x_extra and m_only <= m_extra:
        return "regex: classes are ASCII (minillm) / `.` and \\s as in Python's re"
    return None


@pytest.fixture(scope="module")
def compiler(tmp_path_factory):
    folder = tmp_path_factory.mktemp("export")
    assert main(["export", "--out", str(folder)]) in (None, 0)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=VOCAB_SIZE)
    # xgrammar reads the export as minillm means it: byte-level, token b is the byte b, EOS stops
    assert info.vocab_type == xgr.VocabType.BYTE_LEVEL and info.vocab_size == VOCAB_SIZE
    assert info.decoded_vocab[:256] == [bytes([b]) for b in range(256)]
    assert info.stop_token_ids == [EOS]
    return xgr.GrammarCompiler(info, cache_enabled=False)


def xgrammar_allowed(matcher, bitmask) -> np.ndarray:
    """(VOCAB_SIZE,) bool from xgrammar's packed int32 bitmask (bit i of word w: token 32 w + i)."""
    matcher.fill_next_token_bitmask(bitmask)
    words = bitmask[0].numpy().view(np.uint32)
    return (((words[:, None] >> np.arange(32, dtype=np.uint32)) & 1).reshape(-1)[:VOCAB_SIZE]).astype(bool)


def compare(name: str, dfa, compiled, is_json: bool, counts: Counter, x_extra=frozenset(), m_extra=frozenset()) -> dict:
    """Random walks over the tokens both allow; a difference at any prefix is classified or reported (the shortest
    prefix of each kind: {(name, only xgrammar's, only minillm's): message})."""
    rng = random.Random(f"{SEED}:{name}")
    compared = [*range(256), EOS]
    problems = {}
    for _ in range(WALKS):
        matcher = xgr.GrammarMatcher(compiled)
        bitmask = xgr.allocate_token_bitmask(1, VOCAB_SIZE)
        bias = rng.uniform(0.1, 0.9)  # (how often this walk prefers a structural byte: short or long strings)
        state, mine, theirs = 0, b"", b""  # minillm's text may hold layout spaces that xgrammar's lacks
        for _ in range(STEPS):
            m = dfa.allowed(state)
            x = xgrammar_allowed(matcher, bitmask)
            assert not m[[PAD, BOS, SEP]].any(), (name, mine)  # (xgrammar reads them as text: not compared)
            m_set = {t for t in compared if m[t]}
            x_set = {t for t in compared if x[t]}
            counts[name, "prefixes"] += 1
            counts[name, "both allow EOS"] += bool(m[EOS] and x[EOS])
            if m_set != x_set:
                reason = classify(mine, x_set - m_set, m_set - x_set, is_json, x_extra, m_extra)
                if reason is None:
                    key = (name, tuple(sorted(x_set - m_set)), tuple(sorted(m_set - x_set)))
                    if key not in problems or len(mine) < problems[key][0]:
                        problems[key] = (len(mine), f"{name}: after {mine!r} (xgrammar read {theirs!r}): only xgrammar "
                                         f"allows {list(key[1])}, only minillm {list(key[2])}")  # fmt: skip
                    break
                counts[name, reason] += 1
                if reason == "layout: optional space" and rng.random() < 0.5:
                    state, mine = dfa.step(state, SPACE), mine + b" "  # minillm's side only
                    continue
            both = sorted((m_set & x_set) - {EOS})
            if not both:
                break
            structural = [t for t in both if t in STRUCTURAL]
            token = rng.choice(structural if structural and rng.random() < bias else both)
            assert matcher.accept_token(token), (name, theirs, token)
            state, mine, theirs = dfa.step(state, token), mine + bytes([token]), theirs + bytes([token])
    return {key: message for key, (_, message) in problems.items()}


def test_masks_agree_with_xgrammar_on_every_prefix(compiler):
    counts: Counter = Counter()
    problems = {}
    for pattern, x_extra, m_extra in REGEXES:
        compiled = compiler.compile_regex(pattern)
        problems |= compare(f"regex {pattern!r}", compile_regex(pattern), compiled, False, counts, x_extra, m_extra)
    for schema in SCHEMAS:
        text = json.dumps(schema, ensure_ascii=False)
        compiled = compiler.compile_json_schema(text, any_whitespace=False, separators=(",", ":"), strict_mode=True)
        problems |= compare(f"schema {text}", compile_schema(schema), compiled, True, counts)
    for name in dict.fromkeys(name for name, _ in counts):  # (pytest -s shows what was compared)
        print(name[:100], ", ".join(f"{what}: {n}" for (case, what), n in counts.items() if case == name), sep="\n  ")
    assert not problems, "\n".join(problems.values())
    totals = Counter()
    for (_, what), n in counts.items():
        totals[what] += n
    assert totals["prefixes"] > 20_000 and totals["both allow EOS"] > 1_000
    assert totals["layout: optional space"] > 0  # (the comparison did meet the layout, and took the space)
