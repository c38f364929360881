"""A regular expression -> a syntax tree over bytes, by hand (no `re`: its automaton is hidden inside C).

minillm's tokens are bytes (model/tokenizer.py), so a pattern is read as a set of byte strings: each character class
is a set of bytes, a literal non-ASCII character the bytes of its UTF-8. The subset (what JSON schemas need):

    literals and escapes   a  \\.  \\\\  \\n  \\t  \\xHH  \\d  \\w  \\s  (\\D \\W \\S)
    classes                [abc]  [a-z0-9_]  [^"\\\\]  and `.` (any ASCII character but a newline)
    repeats                *  +  ?  {m}  {m,}  {m,n}
    choice and groups      a|b  (ab)  (?:ab)
    anchors                ^ at the start and $ at the end are accepted: a pattern always matches a whole reply

A negated class and `.` stand for ASCII characters (bytes 0-127): a reply the tiny model writes is ASCII, and a
set of single bytes cannot describe the multi-byte characters beyond it. Anything else (lazy repeats, lookaround,
backreferences, named groups) is a RegexError naming it: a constraint is never silently weaker than its pattern.

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
EMPTY = ("seq", [])


def literal(text: str):
    """The tree matching exactly `text` (its UTF-8 bytes)."""
    return ("seq", [("set", frozenset([b])) for b in text.encode("utf-8")])


class Parser:
    def __init__(self, pattern: str):
        self.pattern, self.at = pattern, 0

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
        while self.peek() in ("*", "+", "?", "{"):
            char = self.take()
            low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}.get(char) or self.braces()
            if self.peek() in ("?", "+"):
                self.fail(f"lazy or possessive repeats ({char}{self.peek()}) are not supported: a constraint has no "
                          "preference between matches")  # fmt: skip
            tree = ("repeat", tree, low, high)
        return tree

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
            tree = self.alternation()
            if self.take() != ")":
                self.fail("a '(' is never closed")
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
        if char == "x":
            digits = self.pattern[self.at : self.at + 2]
            if len(digits) != 2 or any(c not in "0123456789abcdefABCDEF" for c in digits):
                self.fail("\\x takes two hex digits, e.g. \\x41")
            self.at += 2
            return ("set", frozenset([int(digits, 16)]))
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
            return set().union(*(byte for _, byte in tree[1]))  # a one-character escape (\n, \.): its byte
        if ord(char) > 127:
            self.fail(f"{char!r} in a class: classes hold ASCII characters (a byte each); write it outside one")
        return {ord(char)}


def parse(pattern: str):
    """The pattern's tree (module docstring); RegexError for anything outside the subset."""
    if not isinstance(pattern, str):
        raise RegexError(f"a regex is a string, got {type(pattern).__name__}")
    return Parser(pattern).parse()
