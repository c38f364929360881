"""The router's books on one replica (router.py), and the streams through which it sees each request's events.

A Flight is one request from submit until its stream ends: the replica it is on, the tokens streamed to its reader,
its prompt's block keys. A Replica holds the flights on one engine process and what the router knows of its prefix
cache: the keys its allocator held at the last poll (cache_report, asked between two steps), and the keys of the
prompts sent to it since that poll was asked, or still waiting for their first token then (the poll cannot hold
them yet). Its prefix-cache figures count tokens, per request at its first token: queries (the prompt's tokens)
and hits (those its first admission took from the cache, the engine's prompt_tokens_from_cache), as metrics.py's
prefix hit rate counts them (a re-admission after preemption finds mostly its own blocks: not counted).

The router sees a request's events by standing between the replica and the reader's stream (Tap): an async
reader's queue is tapped inside a stream on the reader's own event loop, so deliver() still wakes it once a step.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from minillm.engine.engine import Engine
from minillm.engine.request import Request
from minillm.layers.service import Service
from minillm.serving.engine_process import EngineProcess
from minillm.serving.routing import ReplicaView
from minillm.serving.token_stream import AsyncTokenStream, Event, TokenStream


def cache_report(engine: Engine, first_tokens: tuple[str, ...] = ()) -> tuple[list[bytes], dict[str, int]]:
    """A replica's prefix cache: the keys it holds, and for each request named (its first token is out, so its
    prompt is done) the prompt tokens its first admission took from the cache. (Asked between two steps: a
    module-level function, so it crosses the pipe.)"""
    allocator = getattr(engine.cache, "allocator", None)  # (the contiguous layout has none)
    if allocator is None or not allocator.prefix_caching:
        return [], {}
    wanted = set(first_tokens)
    served = {r.id: r.prompt_tokens_from_cache for r in engine.requests if r.id in wanted}
    return list(allocator.key_of.values()), served


@dataclass
class Flight:
    request: Request
    keys: list[bytes]  # its prompt's full blocks' keys
    reader: TokenStream | AsyncTokenStream | None = None  # the reader's own stream
    stream: Tap | RoutedAsyncStream | None = None  # the same, wrapped: what the replica puts events in
    replica: int = -1
    made: int = 0  # output tokens streamed to its reader
    accepted: bool = False  # its reader heard "accepted" (a retry's second one is not passed on)
    retried: bool = False  # sent once elsewhere (its first replica failed before its first token)
    aborted: str | None = None  # an abort's reason, so a request between replicas is not sent again
    service: Service | None = None  # its priority, ... (sent with it, to a retry's replica too)

    @property
    def remaining(self) -> int:
        """Tokens it still has to run: its prompt until its first token, and the output it may still make."""
        return (len(self.request.prompt_ids) if self.made == 0 else 0) + self.request.max_new_tokens - self.made


@dataclass
class Replica:
    """The router's books on one engine process."""

    index: int
    loop: EngineProcess
    flights: dict[str, Flight] = field(default_factory=dict)
    polled: frozenset[bytes] = frozenset()  # its real keys, as of the last poll
    recent: set[bytes] = field(default_factory=set)  # keys sent since the last poll was asked (or still waiting)
    since_ask: set[bytes] = field(default_factory=set)  # ... since the poll in progress was asked
    caching: bool = False
    failed: str | None = None  # why it left the rotation
    routed: Counter = field(default_factory=Counter)  # reason -> requests routed here
    prompt_tokens: int = 0  # prompt tokens of its requests with a first token (its prefix cache's queries)
    hit_tokens: int = 0  # ... of those, the tokens its prefix cache served (as of the last poll)
    uncounted: list[str] = field(default_factory=list)  # requests whose hits the next poll asks for

    @property
    def serving(self) -> bool:
        return self.failed is None and self.loop.alive

    def __contains__(self, key: bytes) -> bool:
        return key in self.polled or key in self.recent

    def view(self) -> ReplicaView:
        return ReplicaView(self.index, sum(f.remaining for f in self.flights.values()), self if self.caching else ())

    def first_token(self, flight: Flight) -> None:
        self.prompt_tokens += len(flight.request.prompt_ids)
        if self.caching:
            self.uncounted.append(flight.request.id)

    def asking(self) -> tuple[str, ...]:
        """A poll is asked now: keys sent from now on count until its answer; the requests whose hits it asks for."""
        self.since_ask = set().union(*(f.keys for f in self.flights.values() if f.made == 0))
        asked, self.uncounted = tuple(self.uncounted), []
        return asked

    def answered(self, asked: tuple[str, ...], keys: list[bytes] | None, served: dict[str, int]) -> None:
        """The poll's answer (keys None: it failed, and the next poll asks again)."""
        if keys is None:
            self.uncounted[:0] = asked
            return
        self.polled, self.recent = frozenset(keys), self.since_ask
        self.hit_tokens += sum(served.values())

    def state(self) -> dict:
        figures = {"replica": self.index, "state": "ok" if self.serving else "failed", "steps": self.loop.steps,
                   "in_flight": len(self.flights), "load_tokens": self.view().load, "routed": dict(self.routed),
                   "prompt_tokens": self.prompt_tokens, "hit_tokens": self.hit_tokens}  # fmt: skip
        return figures | ({} if self.serving else {"error": self.failed or self.loop.error})


class Tap:
    """A reader's stream (or an async stream's queue), as a replica sees it: each event goes through the router
    first, which says what passes on (`see`)."""

    def __init__(self, target, see):
        self.target, self.see = target, see

    def put(self, event: Event) -> None:
        for passed in self.see(event):
            self.target.put(passed)

    def put_nowait(self, event: Event) -> None:
        for passed in self.see(event):
            self.target.put_nowait(passed)


class RoutedAsyncStream(AsyncTokenStream):
    """An async reader's stream as a replica sees it: the reader's event loop (so deliver() still wakes it once a
    step, not once an event), its queue tapped."""

    def __init__(self, reader: AsyncTokenStream, see):
        self._loop, self._events = reader._loop, Tap(reader._events, see)
