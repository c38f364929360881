"""N engine processes behind one endpoint, and a router that keeps exact books of who serves which request.

    HTTP app (openai_api.py) ──> Router ──┬──> replica 0: an EngineProcess (its own engine, KV and prefix cache)
                                          └──> replica 1, ...

The router is a LoopHandle, so the app serves it as it serves one engine. For each request:
  route    a policy (routing.py) picks a replica in rotation from the router's view: each replica's load (the
           tokens its requests in flight still have to run) and the block keys its prefix cache is known to hold
  books    request id -> its flight (replica, tokens streamed, ...), from submit until its stream ends: the router
           wraps each stream and sees every event on its way to the reader
  failure  a replica whose engine failed (an "error: ..." end, its process gone) leaves the rotation for good; each
           of its requests ends with an error naming it, or, when no token was streamed yet, goes once elsewhere

What a replica's prefix cache holds, as the policy sees it (replica.py): its real keys (the allocator's, asked for
between two steps every POLL_S seconds), plus the router's own record of the prompts' full blocks it sent there
since that poll was asked or which were still waiting for their first token then (the poll cannot hold them yet;
an evicted key goes at the next poll). A replica with prefix caching off holds none: cache aware is least loaded.
"""

from __future__ import annotations

import threading
from collections import deque
from contextlib import suppress
from functools import partial

from minillm.engine.request import Request
from minillm.errors import ConfigError
from minillm.layers.service import Service
from minillm.serving.engine_process import EngineProcess
from minillm.serving.live_metrics import fleet_text
from minillm.serving.replica import Flight, Replica, RoutedAsyncStream, Tap, cache_report
from minillm.serving.routing import ROUTES, prompt_keys, shareable
from minillm.serving.serve_loop import LoopHandle
from minillm.serving.token_stream import AsyncTokenStream, Event, TokenStream

POLL_S = 0.2  # how often the router asks each replica for its prefix cache's keys (and sees that it lives)


class Router(LoopHandle):
    """Replicas behind one LoopHandle: submit, abort, ask, trace, metrics_text, start, stop, alive, error."""

    def __init__(self, replicas: list[EngineProcess], route: str = "cache-aware", poll_s: float = POLL_S):
        if route not in ROUTES:
            raise ConfigError(f"unknown route {route!r}: choose one of {', '.join(ROUTES)}")
        self.replicas = [Replica(i, loop) for i, loop in enumerate(replicas)]
        self.route, self.policy, self.poll_s = route, ROUTES[route](), poll_s
        self.flights: dict[str, Flight] = {}  # request id -> its flight, while its stream lives
        self.log: deque[tuple[str, int, str]] = deque(maxlen=10_000)  # (request id, replica, reason)
        self.retried = self.failed = 0  # requests sent again elsewhere; ended by their replica's failure
        self.lock = threading.RLock()  # streams are seen on reader threads and the event loop alike
        self.stopping = False
        self.max_len, self.config, self.block_size = 0, {}, 16
        self._stop_polling = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="minillm-router-poll", daemon=True)

    # --- life ------------------------------------------------------------------------------------------
    def start(self) -> Router:
        """Start every replica at once (their start-ups overlap); if one cannot start, stop them all and say so.
        Waiting for each here, on the caller's thread, lets a server's event loop read every replica's pipe."""
        errors: dict[int, Exception] = {}
        for step in ("launch", "wait_ready"):  # every child imports torch and loads the model at once, then: ready?
            for replica in self.replicas:
                if replica.index not in errors:
                    try:
                        getattr(replica.loop, step)()
                    except Exception as e:  # noqa: BLE001 (reported below, once every replica has had its try)
                        errors[replica.index] = e
        if errors:
            self.stop()
            first = min(errors)
            raise ConfigError(f"replica {first} of {len(self.replicas)} could not start: {errors[first]}")
        first = self.replicas[0].loop
        self.max_len, self.block_size = min(r.loop.max_len for r in self.replicas), first.config["block_size"]
        self.config = first.config | {"replicas": len(self.replicas), "route": self.route}
        for replica in self.replicas:
            replica.caching = bool(replica.loop.config.get("prefix_caching"))
        self._poller.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every replica, even when one fails to stop."""
        self.stopping = True
        self._stop_polling.set()
        for replica in self.replicas:
            with suppress(Exception):  # (the others must stop too)
                replica.loop.stop(timeout)
        if self._poller.is_alive():
            self._poller.join(timeout)

    @property
    def alive(self) -> bool:
        return not self.stopping and any(r.serving for r in self.replicas)

    @property
    def error(self) -> str | None:
        if self.alive:
            return None
        return "; ".join(f"replica {r.index}: {r.failed or r.loop.error or 'stopped'}" for r in self.replicas)

    @property
    def steps(self) -> int:
        return sum(r.loop.steps for r in self.replicas)

    # --- requests --------------------------------------------------------------------------------------
    def submit(self, request: Request, stream: TokenStream | AsyncTokenStream, service: Service | None = None,
               follows: tuple[str, int] | None = None) -> None:  # fmt: skip
        """follows (OpenAI's n): the reply goes where the first reply to its prompt went, to share its blocks (a
        retry elsewhere runs it alone)."""
        flight = Flight(request, prompt_keys(request.prompt_ids, self.block_size), reader=stream, service=service)
        wrap = RoutedAsyncStream if isinstance(stream, AsyncTokenStream) else Tap
        flight.stream = wrap(stream, lambda event: self._see(flight, event))
        with self.lock:
            if request.id in self.flights:
                return stream.put(Event("refused", status=400, detail=f"request id {request.id!r} is in use"))
            first = self.flights.get(follows[0]) if follows else None
            beside = self.replicas[first.replica] if first is not None else None
            replica = self._place(flight, beside if beside is not None and beside.serving else None)
        if replica is not None:  # (sent outside the lock: a pipe may be full, and its reader may need the lock)
            replica.loop.submit(request, flight.stream, service, follows if replica is beside else None)

    def _place(self, flight: Flight, beside: Replica | None = None) -> Replica | None:
        """(Under the lock.) Choose a replica in rotation (or the one `beside` names: a sibling reply's) and write
        the books; None: no replica serves (the reader is told so: refused, or after a retry's "accepted", an
        error)."""
        rotation = [r for r in self.replicas if r.serving]
        if not rotation:
            why = f"no replica is serving ({self.error})"
            refused = Event("refused", detail=why, status=503)
            flight.reader.put(Event("done", detail=f"error: {why}") if flight.accepted else refused)
            return None
        request, replica, reason = flight.request, beside, "sibling reply"
        if beside is None:
            keys = shareable(flight.keys, len(request.prompt_ids), self.block_size)
            cost = len(request.prompt_ids) + request.max_new_tokens
            choice = self.policy.choose(keys, cost, [r.view() for r in rotation])
            replica, reason = self.replicas[choice.replica], choice.reason
        flight.replica, replica.flights[request.id], self.flights[request.id] = replica.index, flight, flight
        replica.routed[reason] += 1
        self.log.append((request.id, replica.index, reason))
        if replica.caching:
            replica.recent.update(flight.keys)
            replica.since_ask.update(flight.keys)
        return replica

    def _see(self, flight: Flight, event: Event) -> list[Event]:
        """An event of one request on its way to the reader: the books follow it; returns what the reader gets."""
        with self.lock:
            replica = self.replicas[flight.replica]
            if event.kind == "accepted":
                first, flight.accepted = not flight.accepted, True
                return [event] if first else []
            if event.kind == "tokens":
                if flight.made == 0 and event.tokens:
                    replica.first_token(flight)
                flight.made += len(event.tokens)
                return [event]
            del replica.flights[flight.request.id], self.flights[flight.request.id]  # refused or done: it has left
            if event.kind == "refused" and flight.accepted:  # (a retry the second replica refused)
                return [Event("done", detail=f"error: replica {replica.index} refused the retry: {event.detail}")]
            if event.kind != "done" or not event.detail.startswith("error"):
                return [event]
            replica.failed = replica.failed or event.detail.removeprefix("error: ")  # out of rotation
            retry = flight.made == 0 and not flight.retried and flight.aborted is None and not self.stopping
            again = self._place(flight) if retry else None  # once, elsewhere: nothing was streamed yet
            flight.retried |= retry
            if again is None:
                self.failed += 1
                why = f"replica {replica.index} failed ({replica.failed}) after {flight.made} token(s) of this reply"
                return [] if retry else [Event("done", detail=f"error: {why}")]  # (_place told the reader, if tried)
            self.retried += 1
        again.loop.submit(flight.request, flight.stream, flight.service)
        return []

    def abort(self, request_id: str, reason: str = "aborted") -> None:
        with self.lock:
            flight = self.flights.get(request_id)
            if flight is None:
                return
            flight.aborted = reason
            replica = self.replicas[flight.replica]
        replica.loop.abort(request_id, reason)

    # --- questions -------------------------------------------------------------------------------------
    def ask(self, question, replica: int = 0):  # (of one replica)
        return self.replicas[replica].loop.ask(question)

    def trace(self, last_steps=None, since_step=None, timeout: float = 30.0, replica: int = 0):
        """One replica's recorded window (its own step numbers), its config naming it."""
        trace = self.replicas[replica].loop.trace(last_steps, since_step, timeout)
        trace.config["replica"] = replica
        return trace

    def metrics_text(self, timeout: float = 30.0) -> str:
        """Each serving replica's figures, labelled replica="i", then the router's own."""
        texts = {}
        for replica in [r for r in self.replicas if r.serving]:
            with suppress(Exception):  # (it failed meanwhile: its figures are gone with it)
                texts[replica.index] = replica.loop.metrics_text(timeout)
        with self.lock:
            states, totals = [r.state() for r in self.replicas], {"retried": self.retried, "failed": self.failed}
        return fleet_text(texts, states, totals)

    def replica_states(self) -> list[dict]:
        """For /health: each replica's state and figures."""
        with self.lock:
            return [r.state() for r in self.replicas]

    def _poll(self) -> None:
        """Every poll_s: each replica's prefix cache (cache_report); a replica whose process died leaves rotation."""
        while not self._stop_polling.wait(self.poll_s):
            for replica in self.replicas:
                if replica.failed is None and not replica.loop.alive and not self.stopping:  # (one store: no lock)
                    replica.failed = replica.loop.error or "its process exited"
                if not replica.serving:
                    continue
                with self.lock:
                    asked = replica.asking()
                keys, served = None, {}
                with suppress(Exception):  # (a busy or failing replica: the next round tells)
                    keys, served = replica.loop.ask(partial(cache_report, first_tokens=asked)).result(10)
                with self.lock:
                    replica.answered(asked, keys, served)
