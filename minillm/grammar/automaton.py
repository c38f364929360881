"""A pattern's tree (regex.py) -> a finite automaton over bytes, and each state's mask over the vocabulary.

Three classic steps, each a few lines:
  1. Thompson's construction: every piece of the tree becomes a small NFA (states joined by empty moves);
  2. the subset construction: a DFA state is the set of NFA states the bytes so far can reach;
  3. pruning and minimizing: states from which no accepting state can be reached are dropped (so a constrained
     reply can always be finished), and states with the same future are merged (Moore's refinement).

A Dfa is then what the engine needs each step (layers/constrain.py): from a state, which tokens may come next
(`mask`: a byte with a move, EOS where the state accepts), and where a token leads (`step`).
"""

from __future__ import annotations

import numpy as np
import torch

from minillm.grammar.regex import RegexError, parse
from minillm.model.tokenizer import EOS, VOCAB_SIZE

MAX_STATES = 2_000  # a DFA this big is a pattern written to hurt: refused with the limit (a JSON schema's is < 600)
# The subset construction's work: positions of the pattern (NFA states) visited, summed over the DFA states it
# builds. A DFA state can hold thousands of positions at once ((a?){100} nested twice: 116 s and 11 GB before this
# limit), so the count of states alone does not bound the time or memory. json_object, the largest pattern minillm
# writes itself, needs about 0.3 million; this many is about a second of a loaded core.
MAX_WORK = 2_000_000
DEAD = -1  # no move: the byte is not allowed here


def too_much_work() -> RegexError:
    return RegexError(f"the pattern is too large: building its automaton takes more than {MAX_WORK:,} steps, the "
                      f"limit is {MAX_WORK:,} (optional repeats inside repeats multiply them)")  # fmt: skip


def too_large() -> RegexError:
    return RegexError(f"the pattern is too large: its automaton needs more than {MAX_STATES} states, the limit is "
                      f"{MAX_STATES} (a simpler pattern, or a schema with fewer or shorter fields)")  # fmt: skip


class Nfa:
    """States 0..n-1; `moves[s]` lists (bytes, target); `empty[s]` the targets reached without reading a byte."""

    def __init__(self):
        self.moves: list[list[tuple[frozenset[int], int]]] = []
        self.empty: list[list[int]] = []

    def state(self) -> int:
        if len(self.moves) > 50 * MAX_STATES:
            raise too_large()
        self.moves.append([])
        self.empty.append([])
        return len(self.moves) - 1

    def build(self, tree) -> tuple[int, int]:
        """The (start, end) of a fragment matching `tree` (Thompson's construction)."""
        kind = tree[0]
        if kind == "set":
            start, end = self.state(), self.state()
            if tree[1]:  # (an empty class matches nothing: no move)
                self.moves[start].append((tree[1], end))
            return start, end
        if kind == "seq":
            start = end = self.state()
            for item in tree[1]:
                first, last = self.build(item)
                self.empty[end].append(first)
                end = last
            return start, end
        if kind == "alt":
            start, end = self.state(), self.state()
            for branch in tree[1]:
                first, last = self.build(branch)
                self.empty[start].append(first)
                self.empty[last].append(end)
            return start, end
        _, item, low, high = tree  # repeat: `low` copies, then up to high - low optional ones (or a loop)
        start = end = self.state()
        for _ in range(low):
            first, last = self.build(item)
            self.empty[end].append(first)
            end = last
        if high is None:  # a loop: back to the copy's start, or out
            first, last = self.build(item)
            self.empty[end].append(first)
            self.empty[last].append(first)
            out = self.state()
            self.empty[end].append(out)
            self.empty[last].append(out)
            return start, out
        out = self.state()
        for _ in range(high - low):
            first, last = self.build(item)
            self.empty[end].append(first)
            self.empty[end].append(out)
            end = last
        self.empty[end].append(out)
        return start, out

    def closure(self, states) -> set[int]:
        seen, todo = set(states), list(states)
        while todo:
            for target in self.empty[todo.pop()]:
                if target not in seen:
                    seen.add(target)
                    todo.append(target)
        return seen


def byte_classes(nfa: Nfa) -> list[list[int]]:
    """The bytes split into classes that every move treats alike (for JSON: quotes, digits, letters, ...): the
    subset construction then follows one byte per class instead of all 256 (about 10x faster)."""
    sets = list({byte_set for moves in nfa.moves for byte_set, _ in moves})
    groups: dict[tuple[bool, ...], list[int]] = {}
    for b in range(256):
        groups.setdefault(tuple(b in byte_set for byte_set in sets), []).append(b)
    return list(groups.values())


def subsets(nfa: Nfa, start: int, accept: int) -> tuple[np.ndarray, np.ndarray]:
    """The subset construction: (moves (S, 256) int, DEAD for none; accepting (S,) bool), state 0 the start.

    A DFA state is kept as the NFA states in it that matter: those with a move, and the accepting one (the others,
    reached only to pass their empty moves on, change nothing about its future). The work (MAX_WORK) and the count
    of states (five times MAX_STATES: minimizing merges many) are checked as it grows."""
    classes = byte_classes(nfa)
    class_of = {b: c for c, members in enumerate(classes) for b in members}
    of_set = {byte_set: sorted({class_of[b] for b in byte_set}) for moves in nfa.moves for byte_set, _ in moves}
    table = [[(c, target) for byte_set, target in moves for c in of_set[byte_set]] for moves in nfa.moves]
    # (per NFA state: (byte class, target) for each of its moves)
    work = 0

    def kept(states) -> frozenset[int]:
        nonlocal work
        members = nfa.closure(states)
        work += len(members)
        if work > MAX_WORK:
            raise too_much_work()
        return frozenset(s for s in members if table[s] or s == accept)

    first = kept([start])
    index, order, rows = {first: 0}, [first], []
    while len(rows) < len(order):
        reached: dict[int, set[int]] = {}
        for s in order[len(rows)]:
            for c, target in table[s]:
                reached.setdefault(c, set()).add(target)
        row = np.full(256, DEAD, dtype=np.int64)
        for c, targets in sorted(reached.items()):  # (in byte-class order: states numbered as they always were)
            state = kept(targets)
            if state not in index:
                if len(order) >= 5 * MAX_STATES:
                    raise too_large()
                index[state] = len(order)
                order.append(state)
            row[classes[c]] = index[state]
        rows.append(row)
    return np.stack(rows), np.array([accept in s for s in order])


def prune(moves: np.ndarray, accepting: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drop the states no accepting state can be reached from (and every move into them); the start stays 0."""
    live = accepting.copy()
    while True:
        grown = live | ((moves >= 0) & live[np.maximum(moves, 0)]).any(axis=1)
        if (grown == live).all():
            break
        live = grown
    if not live[0]:
        raise RegexError("the pattern matches nothing (an empty class, or a branch that can never end)")
    moves = np.where((moves >= 0) & live[np.maximum(moves, 0)], moves, DEAD)
    keep = np.flatnonzero(live)
    renumber = np.full(len(live) + 1, DEAD)
    renumber[keep] = np.arange(len(keep))
    return renumber[moves[keep]], accepting[keep]  # (DEAD indexes the spare last entry: DEAD again)


def minimize(moves: np.ndarray, accepting: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge states with the same future (Moore): refine classes by (class, the classes each byte leads to) until
    no class splits. Bytes that every state treats alike are one column. Classes only ever split, so a count past
    MAX_STATES is refused at once. Classes are numbered by their first state, so the start (state 0) stays 0."""
    columns = np.unique(moves, axis=1)  # (S, C): a column per byte class (their order does not matter here)
    classes, count = accepting.astype(np.int64), -1
    while True:
        targets = np.where(columns >= 0, classes[np.maximum(columns, 0)], DEAD)  # (S, C)
        signature = np.concatenate([classes[:, None], targets], axis=1)
        _, first, refined = np.unique(signature, axis=0, return_index=True, return_inverse=True)
        refined = np.argsort(np.argsort(first))[refined.reshape(-1)]  # renumbered by first state: the start is 0
        if refined.max() + 1 > MAX_STATES:
            raise too_large()
        if refined.max() + 1 == count:
            break
        classes, count = refined, refined.max() + 1
    first = np.unique(classes, return_index=True)[1]  # the first state of each class, in class order
    merged = np.where(moves[first] >= 0, classes[np.maximum(moves[first], 0)], DEAD)
    return merged, accepting[first]


class Dfa:
    """A deterministic automaton over bytes that reads a reply token by token. State 0 is the start."""

    def __init__(self, moves: np.ndarray, accepting: np.ndarray, pattern: str = ""):
        if len(moves) > MAX_STATES:
            raise too_large()
        self.moves, self.accepting, self.pattern = moves, accepting, pattern  # (S, 256), (S,)
        self._masks: dict[tuple[int, str], torch.Tensor] = {}  # (state, device) -> mask, built once per state
        self._counts: dict[int, int] = {}

    @classmethod
    def from_regex(cls, pattern: str) -> Dfa:
        nfa = Nfa()
        start, end = nfa.build(parse(pattern))
        return cls(*minimize(*prune(*subsets(nfa, start, end))), pattern=pattern)

    @property
    def num_states(self) -> int:
        return len(self.moves)

    def step(self, state: int, token: int) -> int:
        """Where `token` leads from `state`: DEAD if it is not allowed there (EOS leads nowhere: the reply ends)."""
        if state == DEAD or not 0 <= token < 256:
            return DEAD
        return int(self.moves[state, token])

    def walk(self, state: int, tokens) -> int:
        for token in tokens:
            state = self.step(state, token)
        return state

    def accepts(self, state: int) -> bool:
        return state != DEAD and bool(self.accepting[state])

    def allowed(self, state: int) -> np.ndarray:
        """(VOCAB_SIZE,) bool: the bytes with a move from `state`, and EOS where the reply may end here."""
        allowed = np.zeros(VOCAB_SIZE, dtype=bool)
        if state != DEAD:
            allowed[:256] = self.moves[state] >= 0
            allowed[EOS] = self.accepting[state]
        return allowed

    def allowed_count(self, state: int) -> int:
        """How many tokens may come next from `state` (the trace records it per step: kept per state)."""
        if state not in self._counts:
            self._counts[state] = int(self.allowed(state).sum())
        return self._counts[state]

    def mask(self, state: int, device="cpu") -> torch.Tensor:
        """allowed(state) as a torch bool tensor on `device`, built on the CPU once per state and kept."""
        key = (state, str(device))
        if key not in self._masks:
            self._masks[key] = torch.from_numpy(self.allowed(state)).to(device)
        return self._masks[key]

    def matches(self, text: str) -> bool:
        """Whether the whole of `text` is in the pattern's language (a test's and a lesson's check)."""
        return self.accepts(self.walk(0, text.encode("utf-8")))
