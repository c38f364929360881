"""A regular expression -> a syntax tree over bytes, by hand (no `re`: its automaton is hidden inside C).

minillm's tokens are bytes (model/tokenizer.py), so a pattern is read as a set of byte strings: each character class
is a set of bytes, a character beyond ASCII the bytes of its UTF-8. The subset (what JSON schemas need):

    literals and escapes   a  é  \\.  \\\\  \\n  \\t  \\d  \\w  \\s  (\\D \\W \\S)
    characters by number   \\xHH  \\uXXXX  \\UXXXXXXXX   (as in Python's re: \\xe9 is é, written as its UTF-8 bytes)
    any non-ASCII char     \\P{ASCII}   (any character beyond ASCII, as valid UTF-8 only; Python's `regex` module
                           reads it alike, `re` has no such escape: minillm's extension, which JSON strings use)
    classes                [abc]  [a-z0-9_]  [^"\\\\]  and `.` (any ASCII character but a newline)
    repeats                *  +  ?  {m}  {m,}  {m,n}
    choice and groups      a|b  (ab)  (?:ab)
    anchors                ^ at the start and $ at the end are accepted: a pattern always matches a whole reply

A class is a set of single bytes, so it holds ASCII characters only; a negated class and `.` stand for ASCII
characters (bytes 0-127): a reply the tiny model writes is mostly ASCII; write \\P{ASCII} (or the character itself,
outside a class) for the others. Anything else (lazy repeats, lookaround, backreferences, named groups, a repeat of
a repeat) is a RegexError naming it: a constraint is never silently weaker than its pattern.

Limits, each checked as the pattern is read (so a pattern costs no more than they allow): MAX_PATTERN characters,
MAX_REPEAT copies in {m,n}, MAX_NESTING groups inside one another (the parser and the automaton's
construction recurse once per level: a deeper pattern would exhaust Python's stack, a 500 instead of a 400).

The tree: ("set", frozenset of bytes) | ("seq", [trees]) | ("alt", [trees]) | ("repeat", tree, low, high or None).
"""

from __future__ import annotations

from minillm.errors import InputError


class RegexError(InputError):
    """A pattern outside the subset above, or not a pattern at all: the message says what and where."""


ASCII = frozenset(range(128))
DIGITS = frozenset(b"0123456789")
WORD = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
SPACE = frozenset(b" \t\n\r\f\v\x1c\x1d\x1e\x1f")  # (as Python's str patterns read \s, within ASCII)
CLASS_ESCAPES = {"d": DIGITS, "w": WORD, "s": SPACE, "D": ASCII - DIGITS, "W": ASCII - WORD, "S": ASCII - SPACE}
CHAR_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "0": "\0"}
MAX_REPEAT = 256  # the largest m or n in {m,n}: each copy is states in the automaton
MAX_PATTERN = 20_000  # characters of a pattern (a schema's regex included): beyond it, refused with the limit
# groups inside one another. Each level is a few frames of recursion here and in the automaton's
# construction (Nfa.build): 64 levels stay far below Python's 1,000 frames, from any thread; a JSON schema nested
# json_schema.MAX_DEPTH (32) deep needs fewer (an object adds no group, an array two, its doubling stops it sooner).
MAX_NESTING = 64
EMPTY = ("seq", [])
HEX = "0123456789abcdefABCDEF"


def non_ascii():
    """Any character beyond ASCII, as its UTF-8 bytes: exactly the valid sequences (RFC 3629: no overlong forms,
    no surrogates, nothing past U+10FFFF), so a reply held to it is always valid UTF-8."""

    def span(low, high):
        return ("set", frozenset(range(low, high + 1)))

    tail = span(0x80, 0xBF)
    return ("alt", [
        ("seq", [span(0xC2, 0xDF), tail]),
        ("seq", [span(0xE0, 0xE0), span(0xA0, 0xBF), tail]),
        ("seq", [span(0xE1, 0xEC), tail, tail]),
        ("seq", [span(0xED, 0xED), span(0x80, 0x9F), tail]),
        ("seq", [span(0xEE, 0xEF), tail, tail]),
        ("seq", [span(0xF0, 0xF0), span(0x90, 0xBF), tail, tail]),
        ("seq", [span(0xF1, 0xF3), tail, tail, tail]),
        ("seq", [span(0xF4, 0xF4), span(0x80, 0x8F), tail, tail]),
    ])  # fmt: skip


def literal(text: str):
    """The tree matching exactly `text` (its UTF-8 bytes)."""
    return ("seq", [("set", frozenset([b])) for b in text.encode("utf-8")])


class Parser:
    def __init__(self, pattern: str):
        self.pattern, self.at, self.depth = pattern, 0, 0

    def deeper(self):
        self.depth += 1
        if self.depth > MAX_NESTING:
            self.fail(f"groups are nested more than {MAX_NESTING} deep, the limit is {MAX_NESTING}")

    def fail(self, what: str):
        raise RegexError(f"regex {self.pattern!r}, at position {self.at}: {what}")

    def peek(self) -> str:
        return self.pattern[self.at] if self.at < len(self.pattern) else ""

    def take(self) -> str:
        char = self.peek()
        self.at += 1
        return char

    def parse(self):
        if self.peek() == "^":
            self.at += 1
        tree = self.alternation()
        if self.peek() == "$" and self.at == len(self.pattern) - 1:
            self.at += 1
        if self.at < len(self.pattern):
            self.fail(f"unexpected {self.peek()!r}" + (" (an unmatched ')')" if self.peek() == ")" else ""))
        return tree

    def alternation(self):
        branches = [self.sequence()]
        while self.peek() == "|":
            self.at += 1
            branches.append(self.sequence())
        return branches[0] if len(branches) == 1 else ("alt", branches)

    def sequence(self):
        items = []
        while self.peek() not in ("", "|", ")") and not (self.peek() == "$" and self.at == len(self.pattern) - 1):
            items.append(self.repeat(self.atom()))
        return items[0] if len(items) == 1 else ("seq", items)

    def repeat(self, tree):
        if self.peek() not in ("*", "+", "?", "{"):
            return tree
        char = self.take()
        low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}.get(char) or self.braces()
        if self.peek() in ("?", "+"):
            self.fail(f"lazy or possessive repeats ({char}{self.peek()}) are not supported: a constraint has no "
                      "preference between matches")  # fmt: skip
        if self.peek() in ("*", "{"):
            self.fail("a repeat of a repeat (multiple repeat, as Python's re says): put the first in a group, (a*)*")
        return ("repeat", tree, low, high)

    def braces(self) -> tuple[int, int | None]:
        """{m}, {m,} or {m,n}, the opening brace already taken."""
        end = self.pattern.find("}", self.at)
        body = self.pattern[self.at : end] if end >= 0 else ""
        low, comma, high = body.partition(",")
        if end < 0 or not low.isdigit() or (high and not high.isdigit()):
            self.fail("a repeat in braces is {m}, {m,} or {m,n} with whole numbers (write \\{ for a brace)")
        self.at = end + 1
        low, high = int(low), (int(high) if high else None if comma else int(low))
        if high is not None and high < low:
            self.fail(f"{{{body}}}: the most repeats is fewer than the least")
        if max(low, high or 0) > MAX_REPEAT:
            self.fail(f"{{{body}}}: at most {MAX_REPEAT} repeats (each one is states of the automaton)")
        return low, high

    def atom(self):
        char = self.take()
        if char == "(":
            if self.pattern.startswith("?:", self.at):
                self.at += 2
            elif self.peek() == "?":
                self.fail("only (?:...) groups are supported (no lookaround, flags or named groups)")
            self.deeper()
            tree = self.alternation()
            if self.take() != ")":
                self.fail("a '(' is never closed")
            self.depth -= 1
            return tree
        if char == "[":
            return ("set", self.char_class())
        if char == ".":
            return ("set", ASCII - {ord("\n")})
        if char == "\\":
            return self.escape(in_class=False)
        if char in ("*", "+", "?", "{"):
            self.at -= 1
            self.fail(f"{char!r} repeats nothing (write \\{char} for the character itself)")
        if char in ("^", "$"):
            self.at -= 1
            self.fail(f"{char!r} is only supported at the very start (^) or end ($): a pattern matches a whole reply")
        return literal(char)

    def escape(self, in_class: bool):
        """After a backslash: a class (\\d), a character (\\n, \\xHH) or a character taken literally (\\.)."""
        char = self.take()
        if not char:
            self.fail("the pattern ends in a lone backslash")
        if char in CLASS_ESCAPES:
            return ("set", CLASS_ESCAPES[char])
        if char in ("x", "u", "U"):  # a character by its number, as in Python's re (\\xe9 is é: its UTF-8)
            size = {"x": 2, "u": 4, "U": 8}[char]
            digits = self.pattern[self.at : self.at + size]
            if len(digits) != size or any(c not in HEX for c in digits):
                self.fail(f"\\{char} takes {size} hex digits, e.g. \\{char}{'41'.zfill(size)}")
            self.at += size
            code = int(digits, 16)
            if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
                self.fail(f"\\{char}{digits} is no character UTF-8 can write (a surrogate, or past U+10FFFF)")
            return literal(chr(code))
        if char == "P" and self.pattern.startswith("{ASCII}", self.at):
            if in_class:
                self.fail("\\P{ASCII} inside a class: classes hold ASCII characters; write (\\P{ASCII}|[...])")
            self.at += len("{ASCII}")
            return non_ascii()
        if char in CHAR_ESCAPES:
            return literal(CHAR_ESCAPES[char])
        if char.isalnum():
            self.fail(f"\\{char} is not supported (backreferences, \\b and \\A/\\Z are not regular or not needed)")
        return literal(char)

    def char_class(self) -> frozenset[int]:
        """[...] after its '[': a set of bytes, negated with a leading ^ (within ASCII)."""
        negated = self.peek() == "^"
        self.at += negated
        members: set[int] = set()
        first = True
        while first or self.peek() != "]":
            if not self.peek():
                self.fail("a '[' is never closed")
            low = self.class_member()
            if self.peek() == "-" and self.pattern[self.at + 1 : self.at + 2] not in ("]", ""):
                self.at += 1
                high = self.class_member()
                if len(low) != 1 or len(high) != 1 or max(low) > max(high):
                    self.fail("a range in a class runs from one character to a later one, e.g. [a-z]")
                low = set(range(min(low), max(high) + 1))
            members |= low
            first = False
        self.at += 1
        return frozenset(ASCII - members) if negated else frozenset(members)

    def class_member(self) -> set[int]:
        char = self.take()
        if char == "\\":
            tree = self.escape(in_class=True)
            if tree[0] == "set":
                return set(tree[1])
            if len(tree[1]) != 1:  # (\xe9, \u00e9: a character beyond ASCII, two bytes or more)
                self.fail("a character beyond ASCII in a class: classes hold ASCII characters (a byte each); write "
                          "it outside one, or \\P{ASCII} for any of them")  # fmt: skip
            return set(tree[1][0][1])  # a one-character escape (\n, \.): its byte
        if ord(char) > 127:
            self.fail(f"{char!r} in a class: classes hold ASCII characters (a byte each); write it outside one")
        return {ord(char)}


def parse(pattern: str):
    """The pattern's tree (module docstring); RegexError for anything outside the subset."""
    if not isinstance(pattern, str):
        raise RegexError(f"a regex is a string, got {type(pattern).__name__}")
    if len(pattern) > MAX_PATTERN:
        raise RegexError(f"the pattern is {len(pattern):,} characters; the limit is {MAX_PATTERN:,}")
    return Parser(pattern).parse()
