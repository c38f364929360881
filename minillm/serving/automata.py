"""Constrained requests' automata across the engine process's pipe (engine_process.py): each crosses once.

The app compiles a request's constraint (openai_structured.py: a bad pattern is a 400 before it gets here) into a
Dfa: tables (moves (S, 256), accepting (S,)) and the masks it builds, once per state, as the engine asks. The
engine process needs the same automaton. Three ways to get it there, and why this one:
  - compile the pattern again in the child: every step waits for the compile (seconds, for a big schema);
  - pickle the Dfa with each request: its masks travel too, and each request's copy builds them anew;
  - (here) send the tables once: a pattern's first request carries (slot, pattern, moves, accepting), later ones
    (slot, pattern), and the child keeps one Dfa per slot, whose masks are built once for every request using it.

Both sides number the slots alike: the HTTP side gives a pattern a slot (the least recently used one when all are
taken), the child stores what arrives in it. Only the HTTP side decides and the pipe keeps order, so they agree
(the HTTP side packs as it sends, under the pipe's lock). Pickles cross only between the server's own two
processes; nothing a client sent is ever unpickled (a client's body is JSON).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace

import numpy as np

from minillm.engine.request import Request
from minillm.grammar.automaton import Dfa

AUTOMATA_KEPT = 64  # automata the child keeps (json_object's and a few clients' schemas)


class Automata:
    """One side's books: pattern -> slot on the HTTP side (pack), slot -> Dfa in the child (unpack)."""

    def __init__(self, size: int = AUTOMATA_KEPT):
        self.size = size
        self.slots: OrderedDict[str, int] = OrderedDict()  # the HTTP side's, least recently used first
        self.kept: dict[int, Dfa] = {}  # the child's

    def pack(self, request: Request) -> Request:
        """A copy of the request to send, its constraint as (slot, pattern[, moves, accepting])."""
        dfa = request.sampling.constraint
        if dfa is None:
            return request
        slot = self.slots.pop(dfa.pattern, None)
        packed = (slot, dfa.pattern)
        if slot is None:  # new to the child: the tables, moves as int16 (states < 2,000): 512 bytes a state
            slot = len(self.slots) if len(self.slots) < self.size else self.slots.popitem(last=False)[1]
            packed = (slot, dfa.pattern, dfa.moves.astype(np.int16), dfa.accepting)
        self.slots[dfa.pattern] = slot  # (now the most recently used)
        return replace(request, sampling=replace(request.sampling, constraint=packed))

    def unpack(self, request: Request) -> Request:
        """The request as it arrived, its constraint the Dfa its slot holds (new tables first stored there)."""
        if request.sampling.constraint is not None:
            slot, pattern, *tables = request.sampling.constraint
            if tables:
                self.kept[slot] = Dfa(tables[0].astype(np.int64), tables[1], pattern)
            request.sampling = replace(request.sampling, constraint=self.kept[slot])
        return request
