"""The engine on a thread of its own: how a step loop becomes a server.

A web server answers many connections at once; the engine must take one step after another, and
only one piece of code may touch it (its queues, its seats, the KV cache and the model are not
thread-safe). So the engine gets a thread of its own (or a process: engine_process.py runs this same
loop there), and everyone else talks to it through two one-way channels:

    inbox        any thread -> the engine thread:  submit a request, abort one, ask a question
    TokenStream  the engine thread -> one reader:  accepted (or refused), tokens as steps make them, done

The loop, on the engine thread:

    while serving:
        take everything in the inbox     (a request arrives now: arrival_s is the engine clock's now)
        if the engine has work: one step, then hand each request the tokens the step made
        else: sleep until the inbox has something (no busy spinning)

Handing a request over is a put on a queue, and reading a stream never waits for the engine
thread, so nothing the HTTP side does can hold up a step. A client that hangs up sends an abort:
its request leaves the queue or its seat, and its KV blocks are free before the next step runs.
An abort carries a reason: "aborted" (a hang-up), "stop" (the reply reached a stop string, which the
HTTP side finds in the text), "abort" (the server is shutting down).

A server runs for hours while the engine records every step: this loop keeps only the last `keep_steps` steps (and
the requests they mention, with their services), and `trace()` gives that window as a trace (trace_window.py).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from minillm.engine.engine import Engine
from minillm.engine.request import Request
from minillm.errors import InputError
from minillm.layers.service import Service
from minillm.layers.trace import Trace, request_record
from minillm.serving.live_metrics import LiveStats, gauges, prometheus_text
from minillm.serving.token_stream import AsyncTokenStream, Event, TokenStream, deliver
from minillm.serving.trace_window import window

RETRY_AFTER_S = 1  # what a client refused for a full queue is told to wait (a hint: the queue drains in seconds)


class LoopHandle:
    """What any thread may ask of a serve loop, by message: ServeLoop (the engine on a thread of this process) and
    EngineProcess (the engine in a process of its own) both answer it, so the HTTP app works with either. Both
    also have start(), stop(), `alive` and `error` (what stopped the engine, if anything did)."""

    max_len: int  # the context: fixed, so handlers may read it
    steps: int  # steps taken so far (as last heard)

    def _send(self, message: tuple) -> None:
        raise NotImplementedError

    def submit(self, request: Request, stream: TokenStream | AsyncTokenStream, service: Service | None = None,
               follows: tuple[str, int] | None = None) -> None:  # fmt: skip
        """Hand a request to the engine, with its service (priority, ...) and for OpenAI's n whom it follows (the first
        reply's id, i: LayeredEngine.submit); its stream says first "accepted" or "refused"."""
        self._send(("submit", request, stream, service, follows))

    def abort(self, request_id: str, reason: str = "aborted") -> None:
        """Stop a request wherever it is (a client hung up, ...). Aborting a finished request does nothing."""
        self._send(("abort", request_id, reason))

    def ask(self, question: Callable[[Engine], object]) -> Future:
        """Run question(engine) on the engine's side between two steps; the future holds the answer."""
        answer: Future = Future()
        self._send(("ask", question, answer))
        return answer

    def trace(self, last_steps: int | None = None, since_step: int | None = None, timeout: float = 30.0) -> Trace:
        """The recorded window (or its last `last_steps` steps, or the steps after `since_step`) as a trace."""
        answer: Future = Future()
        self._send(("snapshot", last_steps, since_step, answer))
        return window(*answer.result(timeout))

    def metrics_text(self, timeout: float = 30.0) -> str:
        """The Prometheus text for /metrics: gauges read between two steps, so they agree with each other."""
        answer: Future = Future()
        self._send(("metrics", answer))
        return answer.result(timeout)


@dataclass
class Listener:
    request: Request
    stream: TokenStream | AsyncTokenStream
    sent: int = 0  # output tokens already handed to the stream
    last_token_s: float | None = None  # when it last made a token (engine clock), for the inter-token gaps


class ServeLoop(LoopHandle):
    """Runs `engine` on its own thread; submit(), abort(), ask() and trace() may be called from any thread."""

    def __init__(self, engine: Engine, max_waiting: int = 256, keep_steps: int = 10_000, stream_interval: int = 1,
                 inbox=None, deliver: Callable[[list], None] = deliver):  # fmt: skip
        """stream_interval: send a request's tokens once this many have piled up (its first token and its last
        always go at once). 1: every token as it is made; more: fewer, larger chunks, less work per token for
        the HTTP side and the client (vLLM's and SGLang's --stream-interval).
        inbox (get() and get_nowait(), as a queue) and deliver (one step's events to their streams): where messages
        come from and events go; by default a queue any thread puts in, and the streams of this process."""
        self.engine, self.max_waiting, self.keep_steps = engine, max_waiting, keep_steps
        self.stream_interval = stream_interval
        self.max_len = engine.max_len
        self.config = engine.trace().config | {"workload": "live"}  # fixed for the engine's life
        self.stats = LiveStats()  # counters and histograms for /metrics (written by the engine thread only)
        self.inbox = inbox or queue.SimpleQueue()
        self.deliver = deliver
        self.listeners: dict[str, Listener] = {}  # request id -> who reads its tokens, while it lives
        self.error: BaseException | None = None  # what stopped the engine thread, if anything did
        self.unseated = 0  # requests kept that ended without a seat (see _ended_unseated)
        self.outbox: list[tuple[TokenStream | AsyncTokenStream, Event]] = []  # events to deliver (see deliver)
        self.after_step: Callable[[], None] | None = None  # (a prefill engine: hand requests over: disaggregate.py)
        self.on_accept: Callable[[Request], None] | None = None  # (a prefill engine: mark each for hand-over)
        self.receiver: Callable[[Request], None] | None = None  # (a decode engine: take a handed-over request)
        self._thread = threading.Thread(target=self.serve, name="minillm-engine", daemon=True)

    # --- any thread --------------------------------------------------------------------------------
    def start(self) -> ServeLoop:
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self.inbox.put(("stop",))
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def steps(self) -> int:
        return self.engine.step_no  # (an int: safe to read from any thread)

    def _send(self, message: tuple) -> None:
        self.inbox.put(message)

    # --- the engine thread ---------------------------------------------------------------------------
    def serve(self) -> None:
        """The loop (start() runs it on a thread of its own), until a "stop" message."""
        try:
            while self._take_inbox(wait=not self.engine.has_work()):
                self._deliver()  # "accepted" goes out now: the HTTP side answers while the step runs
                if self.engine.has_work():
                    record = self.engine.step()
                    self.stats.on_step(record)
                    self._hand_out(record)
                    self._forget_old_steps()
                    self._deliver()
                    if self.after_step is not None:  # (after the step's tokens went out: a hand-over's first one)
                        self.after_step()
        except BaseException as e:  # noqa: BLE001 (a bug must not leave clients waiting forever)
            self.error = e
            self.outbox = [
                (listener.stream, Event("done", detail=f"error: {e!r}")) for listener in self.listeners.values()
            ]
            self._deliver()
            raise

    def _deliver(self) -> None:
        if self.outbox:
            self.deliver(self.outbox)
            self.outbox = []

    def _take_inbox(self, wait: bool) -> bool:
        """Carry out everything in the inbox; with `wait`, sleep until something comes. False: stop serving."""
        try:
            message = self.inbox.get() if wait else self.inbox.get_nowait()
        except queue.Empty:
            return True
        while True:
            kind, *args = message
            if kind == "stop":
                return False
            getattr(self, f"_{kind}")(*args)
            try:
                message = self.inbox.get_nowait()
            except queue.Empty:
                return True

    def _submit(self, request: Request, stream, service: Service | None = None, follows=None) -> None:
        engine = self.engine
        queued = len(engine.pending) + len(engine.waiting)
        if queued >= self.max_waiting:  # backpressure: refuse now rather than queue without end
            self.stats.count("refused")
            detail = f"the queue is full ({queued} waiting, this server's --max-waiting): try again shortly"
            self.outbox.append((stream, Event("refused", status=429, detail=detail)))
            return
        request.arrival_s, request.arrival_step = engine.clock.now(), engine.step_no  # it arrives now
        try:
            accepted = engine.submit(request, service=service, follows=follows)
        except InputError as e:  # an id still in use (the server's own ids never are): refuse it, serve the rest
            self.stats.count("rejected")
            self.outbox.append((stream, Event("refused", status=400, detail=str(e))))
            return
        if not accepted:
            request.finish_step = engine.step_no  # (so the trace's window knows when it left)
            self.stats.count("rejected")
            reason = request.finish_reason.removeprefix("rejected: ")
            self.outbox.append((stream, Event("refused", status=400, detail=reason)))
            self._ended_unseated()
            return
        if self.on_accept is not None:
            self.on_accept(request)
        self.listeners[request.id] = Listener(request, stream)
        self.outbox.append((stream, Event("accepted")))

    def _abort(self, request_id: str, reason: str) -> None:
        listener = self.listeners.pop(request_id, None)
        self.engine.sampler.logprobs.pop(request_id, None)  # (no more tokens will be sent: its logprobs may go)
        self.engine.handover.marked.discard(request_id)  # (a prefill engine's: it will never be handed over)
        if self.engine.abort(request_id, reason):  # it was queued or running: its seat and KV blocks are free now
            self.stats.count(reason)
            if listener is not None and listener.request.admit_step is None:
                self._ended_unseated()
        if listener is not None:
            self.outbox.append((listener.stream, Event("done", detail=reason)))

    def _receive(self, request: Request, logprobs: list | None = None, service: Service | None = None) -> None:
        self.receiver(request, logprobs, service)  # (a decode engine: disaggregate.py)

    def _ask(self, question: Callable[[Engine], object], answer: Future) -> None:
        try:
            answer.set_result(question(self.engine))
        except Exception as e:  # noqa: BLE001 (the asker gets the error, the engine keeps serving)
            answer.set_exception(e)

    def _snapshot(self, last_steps: int | None, since_step: int | None, answer: Future) -> None:
        """Copies of what a trace needs, taken between two steps (serializing them is the asker's work)."""
        steps = self.engine.records[-last_steps:] if last_steps else list(self.engine.records)
        if since_step is not None:
            steps = [s for s in steps if s.step > since_step]
        first = steps[0].step if steps else self.engine.step_no
        kept, services = [r for r in self.engine.requests if not finished_before(r, first)], self.engine.services
        requests = [request_record(r, services.get(r.id)) for r in kept]
        answer.set_result((dict(self.config), requests, steps, first))  # step records never change once made

    def _metrics(self, answer: Future) -> None:
        answer.set_result(prometheus_text(self.stats, gauges(self.engine)))

    def _hand_out(self, record) -> None:
        """Give every request that made a token this step (or finished) its new tokens, and their logprobs when
        asked (the sampler keeps them by request id, one per token of the reply, a handed-over one's included)."""
        made, kept = [entry[1] for entry in record.seats if entry[4]], self.engine.sampler.logprobs
        for request_id in dict.fromkeys(made + record.finished):
            listener = self.listeners.get(request_id)
            if listener is None:
                continue
            request = listener.request
            if listener.last_token_s is None:
                self.stats.ttft.observe(request.first_token_s - request.arrival_s)
            else:
                self.stats.itl.observe(record.time_s - listener.last_token_s)
            listener.last_token_s = record.time_s
            new = request.output_ids[listener.sent :]
            due = listener.sent == 0 or len(new) >= self.stream_interval or request.is_finished
            if new and due:
                logprobs = kept.get(request.id, [])[listener.sent : listener.sent + len(new)] or None
                self.outbox.append((listener.stream, Event("tokens", tokens=new, logprobs=logprobs)))
                listener.sent += len(new)
            if request.is_finished and request.finish_reason != "handed-over":  # (its stream goes on elsewhere)
                self.stats.count(request.finish_reason)
                self.outbox.append((listener.stream, Event("done", detail=request.finish_reason)))
                del self.listeners[request_id]
                kept.pop(request_id, None)  # (all sent: a server running for days keeps no finished reply's)

    def _forget_old_steps(self) -> None:
        """Keep the last keep_steps steps, and the requests still alive or finished within them (trimmed in
        batches: deleting the head of a list costs its length, so do it once per keep_steps steps)."""
        records = self.engine.records
        if len(records) <= 2 * self.keep_steps:
            return
        del records[: len(records) - self.keep_steps]
        first = records[0].step
        self._keep([r for r in self.engine.requests if not finished_before(r, first)])

    def _ended_unseated(self) -> None:
        """A request ended without ever having a seat (refused by the engine, or aborted in the queue). No step
        names it, so the step window does not bound them: keep the last keep_steps of them."""
        self.unseated += 1
        if self.unseated > 2 * self.keep_steps:
            gone = [r for r in self.engine.requests if r.is_finished and r.admit_step is None]
            drop = {id(r) for r in gone[: len(gone) - self.keep_steps]}
            self._keep([r for r in self.engine.requests if id(r) not in drop])
            self.unseated = self.keep_steps

    def _keep(self, requests: list[Request]) -> None:
        """Keep these requests, and the services of these only (a Service per request ever served would grow
        without end). In place: the policy reads the same dict (RankedPolicy.attach)."""
        self.engine.requests, ids = requests, {r.id for r in requests}
        for rid in [rid for rid in self.engine.services if rid not in ids]:
            del self.engine.services[rid]


def finished_before(r: Request, step: int) -> bool:
    return r.is_finished and r.finish_step is not None and r.finish_step < step
