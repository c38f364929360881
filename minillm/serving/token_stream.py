"""Token streams: how the engine thread hands each request's tokens to whoever waits for them.

The engine thread must never wait for a reader, and a reader must never touch the engine. So each
request gets a stream: the engine thread puts events in (accepted or refused, then its tokens as
steps make them, then done), and one reader takes them out, at its own pace.

  TokenStream       for a reader on an ordinary thread (a test, a notebook): get() blocks
  AsyncTokenStream  for a reader on an asyncio event loop (the HTTP server): `await next()`

An asyncio queue may only be touched on its event loop's thread, so the engine thread asks the
loop to do the put (call_soon_threadsafe). deliver() does that once per step for all of a step's
events: each such call is a system call that wakes the loop, and a moment when the HTTP thread may
take Python's interpreter lock (the GIL) from the engine thread.
"""

from __future__ import annotations

import asyncio
import queue
from dataclasses import dataclass, field


@dataclass
class Event:
    """What the engine thread tells one request's reader."""

    kind: str  # "accepted" | "refused" | "tokens" | "done"
    tokens: list[int] = field(default_factory=list)  # tokens: the new ones, in order
    detail: str = (
        ""  # refused: why; done: the finish reason ("eos", "length", "aborted", "stop", "abort", "error: ...")
    )
    status: int = 0  # refused: the HTTP status it deserves (400: can never be served, 429: queue full)
    logprobs: list[tuple] | None = None  # tokens, when asked: (logprob, top ids, top logprobs) for each token


class TokenStream:
    """One request's events, from the engine thread to one reader that blocks on get() (a test, a notebook).

    put() never blocks: the engine thread must not wait for a slow reader."""

    def __init__(self):
        self._events: queue.SimpleQueue[Event] = queue.SimpleQueue()

    def put(self, event: Event) -> None:
        self._events.put(event)

    def get(self, timeout: float | None = None) -> Event:
        return self._events.get(timeout=timeout)


class AsyncTokenStream:
    """The same, for a reader on an asyncio event loop (the HTTP server): `await stream.next()`.

    An asyncio.Queue is not thread-safe, so the engine thread does not touch it: it asks the event
    loop to do the put (call_soon_threadsafe), which also wakes the loop if it is asleep."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop, self._events = loop, asyncio.Queue()

    def put(self, event: Event) -> None:
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, event)
        except RuntimeError:  # the event loop has closed (the server is shutting down): nobody is listening
            pass

    async def next(self) -> Event:
        return await self._events.get()

    async def next_batch(self) -> list[Event]:
        """The next event and every other one already waiting (without waiting for more)."""
        events = [await self._events.get()]
        while not self._events.empty():
            events.append(self._events.get_nowait())
        return events


def deliver(outbox: list[tuple[TokenStream | AsyncTokenStream, Event]], here=None) -> None:
    """Hand one step's events to their streams, waking each event loop once, not once per event: every wake-up
    is a system call, during which the HTTP thread may take Python's interpreter lock (the GIL) from the engine.
    here: the event loop this runs on, if any: its streams get their events directly."""
    by_loop: dict[asyncio.AbstractEventLoop, list] = {}
    for stream, event in outbox:
        if isinstance(stream, AsyncTokenStream):
            by_loop.setdefault(stream._loop, []).append((stream, event))
        else:
            stream.put(event)
    for loop, items in by_loop.items():
        try:
            put_each(items) if loop is here else loop.call_soon_threadsafe(put_each, items)
        except RuntimeError:  # the event loop has closed (the server is shutting down): nobody is listening
            pass


def put_each(items: list[tuple[AsyncTokenStream, Event]]) -> None:
    """(On the event loop's thread, where its queues may be touched.)"""
    for stream, event in items:
        stream._events.put_nowait(event)
