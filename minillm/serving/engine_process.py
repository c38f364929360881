"""The engine in a process of its own, so the HTTP side never waits on a step (as vLLM V1's engine core).

Python runs one thread at a time per process (the GIL). With the engine on a thread of the server's process,
every token's JSON and socket work is taken from the engine's steps, and a step holds up the HTTP side. Here
the serve loop (serve_loop.py, unchanged) runs in a child process, and the two talk through one pipe:

    HTTP process -> engine      ("submit", request, service)  ("abort", id, reason)
                                ("ask" | "snapshot" | "metrics", ..., n)
    engine -> HTTP process      ("events", step, [(id, kind, tokens, detail, status, logprobs), ...])  once a step
                                ("answer", n, ok, value)   ("died", why)

Each message is a small tuple, pickled (a constrained request's automaton crosses once per pattern: automata.py).
On the HTTP side the server's event loop itself reads the pipe when it has something (no thread in between: one
wake-up per step) and hands each step's events to their streams; started outside an event loop (a test, a
notebook), a reader thread does the same. A question
asked of the engine (ask) must be picklable: a module-level function, not a lambda. The child ignores Ctrl-C
(the terminal sends it to every process of the server): the HTTP side decides when to stop, and the child ends
when told to, or when its pipe closes because the server is gone.
"""

from __future__ import annotations

import asyncio
import atexit
import multiprocessing
import os
import queue
import signal
import threading
from concurrent.futures import Future
from multiprocessing.connection import Connection

import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from minillm.config import EngineConfig
from minillm.errors import ConfigError, MinillmError
from minillm.layers import LayeredEngine
from minillm.serving.automata import Automata
from minillm.serving.serve_loop import LoopHandle
from minillm.serving.token_stream import Event, deliver

START_TIMEOUT_S = 120.0  # a fresh process imports torch and loads the model: seconds on a slow, busy laptop


class EngineProcess(LoopHandle):
    """A serve loop in a child process; the same methods as ServeLoop (LoopHandle), callable from any thread."""

    def __init__(self, model: torch.nn.Module, scheduler: str, token_budget: int, cfg: EngineConfig, tp: int = 1,
                 role: str = "both", link: str | None = None, victim: str | None = None, **loop_args):  # fmt: skip
        """model: the Transformer to serve (its weights travel to the child once, as safetensors bytes);
        tp: split it across that many processes (the engine's own and tp - 1 workers it starts: parallel/);
        role, link: "prefill" or "decode" with the address of the pair's process group (disaggregate.py);
        loop_args: ServeLoop's (max_waiting, keep_steps, stream_interval)."""
        weights = save_tensors({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()})
        device = (str(next(model.parameters()).device), getattr(model, "forward_kind", "plain"))  # (layers/compiled.py)
        policy = (scheduler, token_budget, victim)  # layers/policies.make_policy's, built in the child (names pickle)
        recipe = (model.cfg, weights, device, torch.get_num_threads(), policy, cfg, (tp, role, link), loop_args)
        self.conn, child_end = multiprocessing.Pipe()
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: no forked locks or torch threads
        # (a daemonic process may not start processes of its own: with workers, stop() at exit ends it instead)
        self.process = context.Process(target=run_engine, args=(child_end, recipe), name="minillm-engine",
                                       daemon=tp == 1)  # fmt: skip
        if tp > 1:
            atexit.register(self.stop)  # (runs before multiprocessing's exit handler, which would wait for it)
        self._child_end = child_end
        self.streams: dict[str, object] = {}  # request id -> its stream, until its last event
        self.answers: dict[int, Future] = {}
        self.asked = 0
        self.steps = 0
        self.error: str | None = None  # why the engine process died, if it did
        self.automata = Automata()  # which automaton the child keeps in which slot
        self.max_len, self.config = cfg.max_len, {}
        self.on_message = None  # who hears the child's other messages (a prefill engine's hand-overs)
        self._lock = threading.Lock()  # handlers on the event loop and on worker threads all send
        self.event_loop: asyncio.AbstractEventLoop | None = None  # the loop that reads the pipe, if one does
        self._reader = threading.Thread(target=self._read, name="minillm-engine-reader", daemon=True)

    def start(self) -> EngineProcess:
        self.launch()
        return self.wait_ready()

    def launch(self) -> None:
        self.process.start()
        self._child_end.close()  # (the child has its own copy; ours would keep the pipe open after the child dies)

    def wait_ready(self) -> EngineProcess:
        if not self.conn.poll(START_TIMEOUT_S):
            self.process.kill()
            raise ConfigError(f"the engine process did not start within {START_TIMEOUT_S:.0f} s")
        message = self._recv()
        if message is None or message[0] == "failed":
            raise ConfigError(f"the engine process could not start: {message[1] if message else 'it died'}")
        _, self.max_len, self.config = message
        try:
            self.event_loop = asyncio.get_running_loop()  # started by the server, on its event loop
        except RuntimeError:
            self.event_loop = None
        if self.event_loop is not None:
            self.event_loop.add_reader(self.conn.fileno(), self._read_waiting)
            os.set_blocking(self.conn.fileno(), True)  # (add_reader made it non-blocking: a message must come whole)
        else:
            self._reader.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        if self.conn.closed:  # (stopped already)
            return
        if self.event_loop is not None:
            self.event_loop.remove_reader(self.conn.fileno())
        if self.process.is_alive():
            self._send(("stop",))
            self.process.join(timeout)
            if self.process.is_alive():
                self.process.kill()
        self.conn.close()

    @property
    def alive(self) -> bool:
        return self.error is None and self.process.is_alive()

    # --- the HTTP side: messages to the engine -------------------------------------------------------
    def _send(self, message: tuple) -> None:
        kind, *args = message
        if kind == "submit":  # the stream stays here; the engine names it by the request's id
            self.streams[args[0].id] = args[1]
            message = ("submit", args[0], *args[2:])  # (its automaton is packed as it is sent: see below)
        elif kind in ("ask", "snapshot", "metrics"):  # the future stays here; the engine names it by a number
            with self._lock:
                self.asked += 1
                self.answers[self.asked] = args[-1]
                message = (kind, *args[:-1], self.asked)
        if self.error is None:
            try:
                with self._lock:  # (packed under the lock: slots must be given in the order the child reads them)
                    if kind in ("submit", "receive"):  # (a receive carries the reply's logprobs so far after it)
                        message = (kind, self.automata.pack(message[1]), *message[2:])
                    self.conn.send(message)
                return
            except OSError as e:  # the engine process is gone, and the reader has not heard yet
                self.error = f"the engine process is gone ({e})"
        self._end_everything()  # whoever waits for this message hears that it will never be answered

    # --- the HTTP side: the reader thread --------------------------------------------------------------
    def _recv(self) -> tuple | None:
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            return None

    def _read(self) -> None:
        """The reader thread: every message, until the pipe closes."""
        while (message := self._recv()) is not None:
            self._take(message)
        self._closed()

    def _read_waiting(self) -> None:
        """On the event loop, when the pipe has something: every message waiting."""
        while self.conn.poll():
            message = self._recv()
            if message is None:
                self.event_loop.remove_reader(self.conn.fileno())
                return self._closed()
            self._take(message)

    def _take(self, message: tuple) -> None:
        kind = message[0]
        if kind == "events":
            _, self.steps, events = message
            outbox = []
            for rid, event_kind, tokens, detail, status, logprobs in events:
                ends = event_kind in ("done", "refused")
                stream = self.streams.pop(rid, None) if ends else self.streams.get(rid)
                if stream is not None:
                    outbox.append((stream, Event(event_kind, tokens, detail, status, logprobs)))
            deliver(outbox, here=self.event_loop)
        elif kind == "answer":
            _, number, ok, value = message
            answer = self.answers.pop(number)
            answer.set_result(value) if ok else answer.set_exception(value)
        elif kind == "died":
            self.error = message[1]
        elif self.on_message is not None:
            self.on_message(message)

    def _closed(self) -> None:
        self.error = self.error or "the engine process exited"
        self._end_everything()

    def _end_everything(self) -> None:
        """The engine is gone: every reader hears so, every asker gets an error."""
        outbox = [(stream, Event("done", detail=f"error: {self.error}")) for stream in self.streams.values()]
        self.streams.clear()
        deliver(outbox)
        for answer in self.answers.values():
            answer.set_exception(RuntimeError(f"the engine process stopped: {self.error}"))
        self.answers.clear()


# --- the child process ---------------------------------------------------------------------------------
class PipeInbox:
    """The serve loop's inbox in the child: messages off the pipe, turned back into the loop's own shapes."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self.automata = Automata()  # the child's: slot -> Dfa

    def get(self) -> tuple:
        try:
            return self.unpack(self.conn.recv())
        except (EOFError, OSError):
            return ("stop",)  # the server is gone

    def get_nowait(self) -> tuple:
        if not self.conn.poll():
            raise queue.Empty
        return self.get()

    def unpack(self, message: tuple) -> tuple:
        kind, *args = message
        if kind == "submit":
            return ("submit", self.automata.unpack(args[0]), Outlet(args[0].id), *args[1:])  # (+ its service)
        if kind == "receive":  # (a decode engine: a handed-over request's books)
            return ("receive", self.automata.unpack(args[0]), *args[1:])
        if kind in ("ask", "snapshot", "metrics"):
            return (kind, *args[:-1], Answer(self.conn, args[-1]))
        return message


class Outlet:
    """A request's stream, seen from the engine's side: only its id travels back."""

    def __init__(self, rid: str):
        self.rid = rid


class Answer:
    """A Future's stand-in in the child: setting it sends the answer home."""

    def __init__(self, conn: Connection, number: int):
        self.conn, self.number = conn, number

    def set_result(self, value) -> None:
        self.conn.send(("answer", self.number, True, value))

    def set_exception(self, error: BaseException) -> None:
        self.conn.send(("answer", self.number, False, RuntimeError(repr(error))))


def run_engine(conn: Connection, recipe: tuple) -> None:
    """The child's life: build the engine and its loop, say ready, serve until told to stop or the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the server's to handle (see the module's notes)
    from minillm.layers.compiled import speed_up
    from minillm.layers.policies import make_policy
    from minillm.model.transformer import Transformer
    from minillm.serving.serve_loop import ServeLoop

    model_cfg, weights, (device, forward), threads, policy, cfg, (tp, role, link), loop_args = recipe
    runner = None
    try:
        torch.set_num_threads(threads)
        torch.seed()  # unseeded sampling differs from one server to the next
        model = Transformer(model_cfg)
        model.load_state_dict(load_tensors(weights))
        runner = speed_up(model.to(device), forward if tp == 1 else "plain", compile_now=True)  # (before "ready")
        if tp > 1:  # this process is rank 0: it starts the other ranks and hands them every step (linears as written)
            from minillm.parallel.runner import ShardedRunner

            runner = ShardedRunner(runner, tp)
        meta = {"workload": "live", "forward": model.forward_kind} | ({"tp": tp} if tp > 1 else {})
        engine = LayeredEngine(runner, make_policy(*policy), cfg, meta)
    except Exception as e:  # noqa: BLE001 (the parent reports it in one line)
        conn.send(("failed", str(e)))
        if hasattr(runner, "close"):
            runner.close()
        return
    send = conn.send

    def deliver_events(outbox: list) -> None:
        send(("events", engine.step_no, [(s.rid, e.kind, e.tokens, e.detail, e.status, e.logprobs) for s, e in outbox]))

    loop = ServeLoop(engine, inbox=PipeInbox(conn), deliver=deliver_events, **loop_args)
    if role != "both":  # prefill or decode, of a disaggregated pair
        from minillm.serving.handover_link import take_role

        take_role(loop, role, link, send, Outlet)
    send(("ready", loop.max_len, loop.config))
    try:
        loop.serve()
    except (BrokenPipeError, EOFError):  # the server is gone: nobody to tell
        pass
    except BaseException as e:  # noqa: BLE001 (the readers heard of it from the loop; the server hears why)
        try:
            send(("died", str(e) if isinstance(e, MinillmError) else repr(e)))
        except OSError:
            pass
    finally:
        if hasattr(engine.runner, "close"):  # (tensor parallel: the workers end with the engine)
            engine.runner.close()
