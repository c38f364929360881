"""The HTTP side: a FastAPI app that hands requests to the engine thread and streams its tokens back.

    POST /v1/completions, /v1/chat/completions   generate (streamed as server-sent events, or whole)
    GET  /v1/models    the one model served         GET /health    is the engine thread alive?
    GET  /metrics      Prometheus text (live_metrics.py)
    GET  /trace        the recorded steps as a minillm trace (?last_steps=N, ?since_step=K): the app polls it

Every handler runs on the event loop, where waiting is free: a request is put in the engine's inbox,
then the handler awaits its token stream. The engine thread never waits for the handler; the
handler waits for the engine only between its own awaits, so a thousand open streams cost the
engine nothing but a put per token. Status codes: 400 for a request that can never be served
(the engine's own reason), 429 with Retry-After when the queue is full, 503 if the engine died.

A client that hangs up mid-stream cancels its handler (Starlette watches the connection while it
streams); the handler's `finally` then aborts the request, so its seat and KV blocks are free
before the next step.
"""

from __future__ import annotations

import asyncio
import codecs
import itertools
import json

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from minillm.serving.openai_protocol import (
    DONE,
    FINISH_REASONS,
    ApiError,
    Ask,
    chunk,
    parse_chat,
    parse_completion,
    parse_json,
    reply,
    sse,
    to_request,
    usage,
)
from minillm.serving.serve_loop import RETRY_AFTER_S, ServeLoop
from minillm.serving.token_stream import AsyncTokenStream, Event

ALIVE_CHECK_S = 5.0  # while waiting for the engine's first word, check this often that its thread still runs
HANG_UP_CHECK_S = 0.5  # while a whole (not streamed) reply is being made, check this often that the client waits


def make_app(loop: ServeLoop, model: str = "minillm") -> FastAPI:
    app = FastAPI(title="minillm", summary="an OpenAI-compatible server over the minillm engine")
    ids = itertools.count()  # request ids, unique for the server's life ("r0", "r1", ...)

    @app.exception_handler(ApiError)
    async def api_error(_, e: ApiError) -> JSONResponse:
        headers = {"Retry-After": str(RETRY_AFTER_S)} if e.status == 429 else None
        return JSONResponse(e.body(), status_code=e.status, headers=headers)

    @app.get("/health")
    def health() -> JSONResponse:
        if not loop.alive:
            return JSONResponse({"status": "engine stopped", "error": repr(loop.error)}, status_code=503)
        return JSONResponse({"status": "ok", "steps": loop.engine.step_no})  # (an int: safe to read from here)

    @app.get("/v1/models")
    def models() -> dict:
        return {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "minillm",
                                            "max_model_len": loop.max_len}]}  # fmt: skip

    @app.get("/metrics")
    def metrics() -> PlainTextResponse:  # a plain `def`: FastAPI runs it on a worker thread, so its wait is fine
        return PlainTextResponse(loop.metrics_text(), media_type="text/plain; version=0.0.4")

    @app.get("/trace")
    def trace(last_steps: int | None = None, since_step: int | None = None) -> Response:
        if last_steps is not None and last_steps < 1:
            raise ApiError("last_steps must be at least 1", param="last_steps")
        body = json.dumps(loop.trace(last_steps, since_step).to_dict(), separators=(",", ":"))
        return Response(body, media_type="application/json")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await generate(parse_completion(parse_json(await request.body()), model), request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await generate(parse_chat(parse_json(await request.body()), model), request)

    async def generate(ask: Ask, http: Request) -> Response:
        rid = f"r{next(ids)}"
        request = to_request(ask, rid, loop.max_len)
        stream = AsyncTokenStream(asyncio.get_running_loop())
        loop.submit(request, stream)
        first = await first_word(stream)
        if first.kind == "refused":
            raise ApiError(first.detail, status=first.status, code="queue_full" if first.status == 429 else None)
        prompt_tokens = len(request.prompt_ids)
        if ask.stream:
            events = stream_reply(ask, rid, stream, prompt_tokens)
            return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        return JSONResponse(await whole_reply(ask, rid, stream, prompt_tokens, http))

    async def first_word(stream: AsyncTokenStream) -> Event:
        while True:
            try:
                return await asyncio.wait_for(stream.next(), ALIVE_CHECK_S)
            except TimeoutError:
                if not loop.alive:
                    raise ApiError(f"the engine has stopped ({loop.error!r})", status=503) from None

    async def whole_reply(ask: Ask, rid: str, stream: AsyncTokenStream, prompt_tokens: int, http: Request) -> dict:
        tokens, finished = [], False
        watch = asyncio.create_task(hang_up_watch(http, rid))
        try:
            while True:
                event = await stream.next()
                tokens += event.tokens
                if event.kind == "done":
                    finished = True
                    decoder = Text()
                    text = decoder.add(tokens) + decoder.end()
                    finish = FINISH_REASONS.get(event.detail, event.detail)
                    return reply(ask, rid, model, tokens, text, finish, usage(prompt_tokens, len(tokens)))
        finally:
            watch.cancel()
            if not finished:  # cancelled (the server is stopping): free the request's seat
                loop.abort(rid)

    async def hang_up_watch(http: Request, rid: str) -> None:
        """A whole reply sends nothing until it is done, so no failed send says the client left: ask now and then."""
        while not await http.is_disconnected():
            await asyncio.sleep(HANG_UP_CHECK_S)
        loop.abort(rid)

    async def stream_reply(ask: Ask, rid: str, stream: AsyncTokenStream, prompt_tokens: int):
        text, made, finished = Text(), 0, False
        try:
            if ask.chat:
                yield chunk(ask, rid, model, "", role=True)  # the assistant's turn begins (as OpenAI's first chunk)
            while True:
                events = await stream.next_batch()  # all that piled up: a reader that fell behind sends one chunk
                tokens = [t for e in events for t in e.tokens]
                made += len(tokens)
                done = next((e for e in events if e.kind == "done"), None)
                piece = text.add(tokens) + (text.end() if done else "")
                if done is None:
                    if piece or tokens:  # (tokens without text: a character cut in two, or a special token)
                        yield chunk(ask, rid, model, piece, tokens=tokens)
                    continue
                finished = True
                if done.detail.startswith("error"):
                    yield sse(ApiError(f"the engine failed: {done.detail}", status=500).body())
                else:
                    counts = usage(prompt_tokens, made)
                    finish = FINISH_REASONS.get(done.detail, done.detail)
                    yield chunk(ask, rid, model, piece, finish, counts, tokens=tokens)
                    if ask.include_usage:
                        yield chunk(ask, rid, model, None, counts=counts)
                yield DONE
                return
        finally:
            if not finished:  # the client hung up (Starlette cancelled us) or the server is stopping
                loop.abort(rid)

    return app


class Text:
    """Token ids -> text, a piece at a time: a character cut between two byte tokens waits for its rest."""

    def __init__(self):
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, tokens: list[int]) -> str:
        return self.decoder.decode(bytes(t for t in tokens if t < 256))  # special tokens have no text

    def end(self) -> str:
        return self.decoder.decode(b"", final=True)
