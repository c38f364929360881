"""Put it together: an engine, its loop (on a thread: serve_loop.py, or in a process: engine_process.py), the
HTTP app (openai_api.py), uvicorn.

`python -m minillm serve` calls bind() and serve(), with the engine in a process of its own (`--replicas N`: N of
them behind a router, build_fleet); tests and notebooks use ServerThread, which runs the same server on a thread of
the current process, on a free port of 127.0.0.1, for as long as a `with` lasts. Stopping: the first Ctrl-C or
SIGTERM drains (no new requests, the replies in flight get --drain-s seconds to finish, then end with finish_reason
"abort"), a second one stops at once.
"""

from __future__ import annotations

import asyncio
import errno
import socket
import sys
import threading
import time
from contextlib import asynccontextmanager

import uvicorn
from torch import nn

from minillm.config import EngineConfig
from minillm.engine.scheduler import DEFAULT_TOKEN_BUDGET
from minillm.errors import ConfigError
from minillm.layers import LayeredEngine
from minillm.layers.policies import make_policy
from minillm.serving.api_key import ApiKeyMiddleware
from minillm.serving.engine_process import START_TIMEOUT_S, EngineProcess
from minillm.serving.openai_api import MAX_BODY_BYTES, drain, make_app
from minillm.serving.router import Router
from minillm.serving.serve_loop import LoopHandle, ServeLoop

LOOPBACK = "127.0.0.1"
# Python runs one thread at a time (the GIL). With `--engine thread`, when the HTTP thread holds it, the engine
# thread waits until the HTTP thread blocks, or until this interval passes (default 5 ms, a tiny model's step).
# Measured on this project's 2-core machine, 200 chat users at once: before the engine thread batched its
# deliveries (serve_loop.deliver), 0.5 ms served 1.2 to 1.5 times the tokens/s of 5 ms in 3 of 4 paired runs;
# since, the two are within the noise. Kept: it bounds how long the HTTP side can hold a step up.
GIL_SWITCH_S = 0.0005
DRAIN_S = 10.0  # how long a stopping server lets the replies in flight finish (--drain-s)


def build_loop(
    model: nn.Module,
    scheduler: str = "continuous",
    kv: str = "paged",
    slots: int = 8,
    num_blocks: int | None = None,
    block_size: int = 16,
    token_budget: int = DEFAULT_TOKEN_BUDGET,
    prefix_caching: bool = False,
    max_waiting: int = 256,
    keep_steps: int = 10_000,
    record_blocks: bool = True,
    stream_interval: int = 1,
    process: bool = False,
    tp: int = 1,
    disaggregate: bool = False,
    victim: str | None = None,
) -> ServeLoop | EngineProcess:
    """An engine for the model, wrapped in a ServeLoop on a thread of this process, or (process=True) in an
    EngineProcess of its own (what `serve` runs). Not started: the app starts it. tp > 1: the model split across
    that many processes (parallel/), the engine's own among them. disaggregate: a prefill engine and a decode
    engine, each in a process of its own (disaggregate.py). scheduler, victim: the policy and whom it preempts
    (layers/policies.py: POLICIES, VICTIMS; victim None: the policy's own)."""
    if min(max_waiting, keep_steps, stream_interval) < 1:
        raise ConfigError(f"max_waiting, keep_steps and stream_interval must be at least 1, got {max_waiting}, "
                          f"{keep_steps} and {stream_interval}")  # fmt: skip
    cfg = EngineConfig(slots=slots, kv=kv, block_size=block_size, num_blocks=num_blocks,
                       prefix_caching=prefix_caching, record_blocks=record_blocks)  # fmt: skip
    loop_args = {"max_waiting": max_waiting, "keep_steps": keep_steps, "stream_interval": stream_interval}
    policy = make_policy(scheduler, token_budget, victim)  # (here: a wrong name fails before any process starts)
    if disaggregate:  # two engine processes: one prefills, one decodes, the KV sent between them
        from minillm.serving.disaggregate import PrefillDecode

        return PrefillDecode(model, scheduler, token_budget, cfg, tp=tp, victim=victim, **loop_args)
    if process:  # (its process builds a policy of its own from the names)
        return EngineProcess(model, scheduler, token_budget, cfg, tp=tp, victim=victim, **loop_args)
    if tp > 1:
        from minillm.parallel.runner import ShardedRunner  # (its close() runs at the process's exit)

        model = ShardedRunner(model, tp)
    engine = LayeredEngine(model, policy, cfg, meta={"workload": "live"})
    return ServeLoop(engine, **loop_args)


def build_fleet(model: nn.Module, replicas: int, route: str = "cache-aware", **loop_args) -> Router:
    """`replicas` engine processes (each as build_loop(process=True, **loop_args) makes it) behind a Router (router.py)
    that sends each request to one of them by `route` (routing.py). Not started: the app starts it."""
    if replicas < 1:
        raise ConfigError(f"replicas must be at least 1, got {replicas}")
    return Router([build_loop(model, process=True, **loop_args) for _ in range(replicas)], route)


def app_for(loop: LoopHandle, model: str = "minillm", max_body_bytes: int = MAX_BODY_BYTES,
            api_key: str | None = None):  # fmt: skip
    """The app, with the engine started when the server starts and stopped when it stops; api_key: /v1/* and
    /trace answer 401 without `Authorization: Bearer api_key` (api_key.py). Whatever runs behind the app (one
    engine, --replicas' router, --disaggregate, --tp) talks to it over pipes, not HTTP: this one check guards all."""

    @asynccontextmanager
    async def lifespan(_):
        if not loop.alive:
            loop.start()
        yield
        loop.stop()

    app = make_app(loop, model, max_body_bytes)
    app.router.lifespan_context = lifespan
    if api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)
    return app


class Server(uvicorn.Server):
    """uvicorn's server, stopping gently: the first Ctrl-C or SIGTERM drains (openai_api.drain), a second stops the
    replies still going at once. One line in the log, no traceback."""

    def __init__(self, config: uvicorn.Config, loop: LoopHandle | None = None, drain_s: float = DRAIN_S):
        """config.app: minillm's app (app_for), or any ASGI app (then `loop` is None: stopping is uvicorn's own)."""
        super().__init__(config)
        self.app, self.loop, self.drain_s = config.app, loop, drain_s
        self.event_loop: asyncio.AbstractEventLoop | None = None
        self.draining: asyncio.Task | None = None

    async def startup(self, sockets=None) -> None:
        self.event_loop, self.stop_now = asyncio.get_running_loop(), asyncio.Event()
        await super().startup(sockets)

    def handle_exit(self, sig, frame) -> None:
        """(The signal handler, on the main thread: the event loop's, so it only schedules the work.)"""
        if self.event_loop is None or self.loop is None:
            self.should_exit = True
        else:
            self.event_loop.call_soon_threadsafe(self.begin_stop)

    def begin_stop(self) -> None:
        if self.draining is None:
            self.draining = asyncio.ensure_future(self.drain_and_exit())
        else:
            self.stop_now.set()

    async def drain_and_exit(self) -> None:
        busy = len(self.app.state.in_flight)
        news = f"{busy} repl{'y' if busy == 1 else 'ies'} in flight get up to {self.drain_s:g} s to finish (Ctrl-C "
        news = news + "again: end them now)" if busy else "no replies in flight"
        print(f"minillm: stopping; {news}", file=sys.stderr, flush=True)
        await drain(self.app, self.loop, self.drain_s, self.stop_now)
        self.should_exit = True


def bind(host: str = LOOPBACK, port: int = 8000) -> socket.socket:
    """The listening socket (port 0: the system picks a free one), or a ConfigError that says what to change."""
    # (IPPROTO_TCP named: asyncio switches off Nagle's delay, 40 ms on small writes, only on sockets that say so)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except (OSError, OverflowError) as e:
        sock.close()
        taken = isinstance(e, OSError) and e.errno == errno.EADDRINUSE
        fix = "is another server running there? choose another --port" if taken else "check --host and --port"
        raise ConfigError(f"cannot listen on {host}:{port} ({getattr(e, 'strerror', None) or e}): {fix}") from None
    return sock


def serve(loop: LoopHandle, sock: socket.socket, model: str = "minillm", drain_s: float = DRAIN_S,
          max_body_bytes: int = MAX_BODY_BYTES, api_key: str | None = None) -> None:  # fmt: skip
    """Serve on a bound socket until Ctrl-C or SIGTERM (then drain: see Server)."""
    sys.setswitchinterval(GIL_SWITCH_S)  # (process-wide: only the server's own process sets it)
    app = app_for(loop, model, max_body_bytes, api_key)
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2)
    Server(config, loop, drain_s).run(sockets=[sock])


class ServerThread:
    """with ServerThread(loop) as server: ... (or server.start() ... server.stop()); server.url is e.g.
    http://127.0.0.1:54321/v1, server.base the same without /v1 (for /health, /metrics, /trace)."""

    def __init__(self, loop: LoopHandle | None, model: str = "minillm", host: str = LOOPBACK, port: int = 0, app=None,
                 max_body_bytes: int = MAX_BODY_BYTES, api_key: str | None = None):  # fmt: skip
        """Serves `loop` (or any ASGI `app`: a test's stand-in for another server); api_key: as app_for's."""
        self.loop, self.sock = loop, bind(host, port)  # port 0: a free one, and this socket keeps it ours
        app = app or app_for(loop, model, max_body_bytes, api_key)
        self.server = Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2), loop)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        host, port = self.sock.getsockname()
        self.base = f"http://{host}:{port}"
        self.url = f"{self.base}/v1"

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S  # (an engine process imports torch and loads the model first)
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()
