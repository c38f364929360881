"""Put it together: an engine, its loop on a thread (serve_loop.py), the HTTP app (openai_api.py), uvicorn.

`python -m minillm serve` calls bind() and serve(); tests and notebooks use ServerThread, which runs the same
server on a thread of the current process, on a free port of 127.0.0.1, for as long as a `with` lasts.
"""

from __future__ import annotations

import errno
import socket
import sys
import threading
import time
from contextlib import asynccontextmanager

import uvicorn
from torch import nn

from minillm.config import EngineConfig
from minillm.engine.engine import Engine
from minillm.engine.scheduler import DEFAULT_TOKEN_BUDGET, SCHEDULERS
from minillm.errors import ConfigError
from minillm.serving.openai_api import make_app
from minillm.serving.serve_loop import ServeLoop

LOOPBACK = "127.0.0.1"
# Python runs one thread at a time (the GIL). When the HTTP thread holds it, the engine thread waits until the
# HTTP thread blocks, or until this interval passes (default 5 ms, as long as one of the tiny model's steps).
# Measured on this project's 2-core machine, 200 chat users at once: before the engine thread batched its
# deliveries (serve_loop.deliver), 0.5 ms served 1.2 to 1.5 times the tokens/s of 5 ms in 3 of 4 paired runs;
# since, the two are within the noise. Kept: it bounds how long the HTTP side can hold a step up.
GIL_SWITCH_S = 0.0005


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
) -> ServeLoop:
    """An engine for the model, wrapped in a ServeLoop (not started: the app starts it)."""
    if min(max_waiting, keep_steps, stream_interval) < 1:
        raise ConfigError(f"max_waiting, keep_steps and stream_interval must be at least 1, got {max_waiting}, "
                          f"{keep_steps} and {stream_interval}")  # fmt: skip
    cfg = EngineConfig(slots=slots, kv=kv, block_size=block_size, num_blocks=num_blocks,
                       prefix_caching=prefix_caching, record_blocks=record_blocks)  # fmt: skip
    engine = Engine(model, SCHEDULERS[scheduler](token_budget=token_budget), cfg, meta={"workload": "live"})
    return ServeLoop(engine, max_waiting=max_waiting, keep_steps=keep_steps, stream_interval=stream_interval)


def app_for(loop: ServeLoop, model: str = "minillm"):
    """The app, with the engine thread started when the server starts and stopped when it stops."""

    @asynccontextmanager
    async def lifespan(_):
        if not loop.alive:
            loop.start()
        yield
        loop.stop()

    app = make_app(loop, model)
    app.router.lifespan_context = lifespan
    return app


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


def serve(loop: ServeLoop, sock: socket.socket, model: str = "minillm") -> None:
    """Serve on a bound socket until Ctrl-C."""
    sys.setswitchinterval(GIL_SWITCH_S)  # (process-wide: only the server's own process sets it)
    config = uvicorn.Config(app_for(loop, model), log_level="warning", timeout_graceful_shutdown=2)
    uvicorn.Server(config).run(sockets=[sock])


class ServerThread:
    """with ServerThread(loop) as server: ... (or server.start() ... server.stop()); server.url is e.g.
    http://127.0.0.1:54321/v1, server.base the same without /v1 (for /health, /metrics, /trace)."""

    def __init__(self, loop: ServeLoop | None, model: str = "minillm", host: str = LOOPBACK, port: int = 0, app=None):
        """Serves `loop` (or any ASGI `app`: a test's stand-in for another server)."""
        self.loop, self.sock = loop, bind(host, port)  # port 0: a free one, and this socket keeps it ours
        config = uvicorn.Config(app or app_for(loop, model), log_level="warning", timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)
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
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()
