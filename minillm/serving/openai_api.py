"""The HTTP side: a FastAPI app that hands requests to the engine and streams its tokens back.

    POST /v1/completions, /v1/chat/completions   generate (streamed as server-sent events, or whole)
    GET  /v1/models, /v1/models/{id}   the one model served       GET /health    is the engine alive?
    GET  /metrics      Prometheus text (live_metrics.py)
    GET  /trace        the recorded steps as a minillm trace (?last_steps=N, ?since_step=K): the app polls it
                       (with replicas, router.py: one replica's, ?replica=I, replica 0 by default)

Every handler runs on the event loop, where waiting is free: a request is handed to the engine (a
ServeLoop on a thread, or an EngineProcess), then the handler awaits its token stream. The engine
never waits for the handler, so a thousand open streams cost it nothing but one message per step.

Limits come before work: a body over max_body_bytes is refused (413) before it is read, a prompt
longer than the context before it is tokenized, and a constraint (response_format, regex) is compiled on
a worker thread, never on the event loop, before the request goes to the engine (openai_structured.py).
Every error, whatever its cause (a bad field, an unknown route or model, a wrong method, a full queue, a
stopping server), is an OpenAI error object {"error": {"message", "type", "param", "code"}}: 400 for a
request that can never be served, 404, 405, 413, 422, 429 with Retry-After when the queue is full, 503 when
the engine died or the server is shutting down.

A client that hangs up mid-stream cancels its handler (Starlette watches the connection while it
streams); the handler's `finally` then aborts the request, so its seat and KV blocks are free
before the next step. When the server stops (server.py), `drain` lets the replies in flight finish for a
while and ends the rest with finish_reason "abort", each with its last chunk and [DONE].
"""

from __future__ import annotations

import asyncio
import itertools
import json
from dataclasses import replace

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from minillm.serving.openai_output import DONE, FINISH_REASONS, ReplyText, chunk, reply, sse, usage
from minillm.serving.openai_protocol import ApiError, Ask, parse_chat, parse_completion, parse_json, to_request
from minillm.serving.openai_structured import constraint_for, warm, with_pattern
from minillm.serving.serve_loop import RETRY_AFTER_S, LoopHandle
from minillm.serving.token_stream import AsyncTokenStream, Event

ALIVE_CHECK_S = 5.0  # while waiting for the engine's first word, check this often that it still runs
HANG_UP_CHECK_S = 0.5  # while a whole (not streamed) reply is being made, check this often that the client waits
MAX_BODY_BYTES = 1_000_000  # a request is a prompt and a few settings: a megabyte is plenty


class Json(JSONResponse):
    """JSON with every non-ASCII character escaped: whatever text a client sent, the answer encodes."""

    def render(self, content) -> bytes:
        return json.dumps(content, separators=(",", ":")).encode()


def make_app(loop: LoopHandle, model: str = "minillm", max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
    app = FastAPI(title="minillm", summary="an OpenAI-compatible server over the minillm engine")
    ids = itertools.count()  # request ids, unique for the server's life ("r0", "r1", ...)
    app.state.draining = False  # set by drain(): new requests get 503
    app.state.in_flight = set()  # ids of the requests whose reply is being made
    warm()  # json_object's automaton, compiled while the engine starts (openai_structured.py)

    @app.exception_handler(ApiError)
    async def api_error(_, e: ApiError) -> Json:
        headers = {"Retry-After": str(RETRY_AFTER_S)} if e.status in (429, 503) else None
        return Json(e.body(), status_code=e.status, headers=headers)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> Json:
        what = {404: f"no route {request.url.path}", 405: f"{request.method} is not allowed on {request.url.path}"}
        error = ApiError(what.get(e.status_code, str(e.detail)), status=e.status_code)
        return Json(error.body(), status_code=e.status_code, headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_, e: RequestValidationError) -> Json:
        first = e.errors()[0] if e.errors() else {}
        param = str(first.get("loc", ["", ""])[-1])
        error = ApiError(f"{param}: {first.get('msg', 'invalid')}", status=422, param=param)
        return Json(error.body(), status_code=422)

    @app.get("/health")
    def health() -> Json:
        fleet = {"replicas": loop.replica_states()} if hasattr(loop, "replica_states") else {}  # (a Router)
        if not loop.alive:
            return Json({"status": "engine stopped", "error": repr(loop.error)} | fleet, status_code=503)
        if app.state.draining:
            return Json({"status": "shutting down", "steps": loop.steps} | fleet, status_code=503)
        return Json({"status": "ok", "steps": loop.steps} | fleet)

    def model_card() -> dict:
        return {"id": model, "object": "model", "created": 0, "owned_by": "minillm", "max_model_len": loop.max_len}

    @app.get("/v1/models")
    def models() -> Json:
        return Json({"object": "list", "data": [model_card()]})

    @app.get("/v1/models/{model_id:path}")
    def one_model(model_id: str) -> Json:
        if model_id != model:
            raise ApiError(f"the model {model_id!r} does not exist here; this server serves {model!r}", status=404,
                           param="model", code="model_not_found")  # fmt: skip
        return Json(model_card())

    @app.get("/metrics")
    def metrics() -> PlainTextResponse:  # a plain `def`: FastAPI runs it on a worker thread, so its wait is fine
        return PlainTextResponse(loop.metrics_text(), media_type="text/plain; version=0.0.4")

    @app.get("/trace")
    def trace(last_steps: int | None = None, since_step: int | None = None, replica: int | None = None) -> Response:
        if last_steps is not None and last_steps < 1:
            raise ApiError("last_steps must be at least 1", param="last_steps")
        replicas = len(getattr(loop, "replicas", [loop]))  # (a Router has several; each records its own steps)
        if replica is not None and not 0 <= replica < replicas:
            raise ApiError(f"replica must lie in [0, {replicas - 1}]: this server has {replicas}", param="replica")
        where = {"replica": replica} if replica is not None and replicas > 1 else {}
        body = json.dumps(loop.trace(last_steps, since_step, **where).to_dict(), separators=(",", ":"))
        return Response(body, media_type="application/json")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = parse_json(await read_body(request))
        return await generate(with_pattern(parse_completion(body, model), body), request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = parse_json(await read_body(request))
        return await generate(with_pattern(parse_chat(body, model), body), request)

    async def read_body(request: Request) -> bytes:
        """The body, refused (413) as soon as it is known to be too big: from its Content-Length, or as it comes."""
        too_big = ApiError(f"the request body is over {max_body_bytes} bytes, this server's limit (--max-body-bytes)",
                           status=413)  # fmt: skip
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_body_bytes:
            raise too_big
        body = bytearray()
        async for part in request.stream():
            body += part
            if len(body) > max_body_bytes:
                raise too_big
        return bytes(body)

    async def generate(ask: Ask, http: Request) -> Response:
        if app.state.draining:
            raise ApiError("the server is shutting down: send this request elsewhere or later", status=503)
        rid = f"r{next(ids)}"
        request = to_request(ask, rid, loop.max_len)
        constraint = await constraint_for(ask)  # (response_format or regex: a 400 here if it cannot be)
        request.sampling = replace(request.sampling, constraint=constraint)  # (it travels in the sampling)
        stream = AsyncTokenStream(asyncio.get_running_loop())
        loop.submit(request, stream)
        first = await first_word(stream)
        if first.kind == "refused":
            raise ApiError(first.detail, status=first.status, code="queue_full" if first.status == 429 else None)
        if first.kind == "done":  # (the engine died, or the server stopped it, before it took the request)
            raise ApiError(f"the engine could not take the request ({first.detail})", status=503)
        app.state.in_flight.add(rid)
        prompt_tokens = len(request.prompt_ids)
        if ask.stream:
            events = stream_reply(ask, rid, stream, prompt_tokens)
            return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        return Json(await whole_reply(ask, rid, stream, prompt_tokens, http))

    async def first_word(stream: AsyncTokenStream) -> Event:
        while True:
            try:
                return await asyncio.wait_for(stream.next(), ALIVE_CHECK_S)
            except TimeoutError:
                if not loop.alive:
                    raise ApiError(f"the engine has stopped ({loop.error!r})", status=503) from None

    async def pieces(ask: Ask, rid: str, stream: AsyncTokenStream):
        """The reply as (text, tokens counted, tokens shown with their logprobs, finish reason or None, error)."""
        text = ReplyText(ask.stop)
        while True:
            events = await stream.next_batch()  # all that piled up: a reader that fell behind sends one chunk
            done = next((e for e in events if e.kind == "done"), None)
            tokens = [t for e in events for t in e.tokens]
            logprobs = [lp for e in events for lp in e.logprobs or ()] if ask.sampling.logprobs is not None else None
            piece, counted, shown = text.add(tokens, logprobs, end=done is not None)
            if text.stopped:
                loop.abort(rid, "stop")  # its seat and KV blocks are free before the next step
                yield piece, counted, shown, "stop", None
                return
            if done is None:
                yield piece, counted, shown, None, None
                continue
            error = done.detail if done.detail.startswith("error") else None
            yield piece, counted, shown, FINISH_REASONS.get(done.detail, done.detail), error
            return

    async def whole_reply(ask: Ask, rid: str, stream: AsyncTokenStream, prompt_tokens: int, http: Request) -> dict:
        texts, tokens, shown, finished = [], [], [], False
        watch = asyncio.create_task(hang_up_watch(http, rid))
        try:
            async for piece, counted, seen, finish, error in pieces(ask, rid, stream):
                texts.append(piece)
                tokens += counted
                shown += seen
                if finish is not None:
                    finished = True
                    if error:
                        raise ApiError(f"the engine failed: {error}", status=503)  # (not the request's fault)
                    counts = usage(prompt_tokens, len(tokens))
                    return reply(ask, rid, model, tokens, "".join(texts), finish, counts, shown)
        finally:
            watch.cancel()
            app.state.in_flight.discard(rid)
            if not finished:  # cancelled (the server is stopping): free the request's seat
                loop.abort(rid)

    async def hang_up_watch(http: Request, rid: str) -> None:
        """A whole reply sends nothing until it is done, so no failed send says the client left: ask now and then."""
        while not await http.is_disconnected():
            await asyncio.sleep(HANG_UP_CHECK_S)
        loop.abort(rid)

    async def stream_reply(ask: Ask, rid: str, stream: AsyncTokenStream, prompt_tokens: int):
        made, finished = 0, False
        try:
            if ask.chat:
                yield chunk(ask, rid, model, "", role=True)  # the assistant's turn begins (as OpenAI's first chunk)
            async for piece, counted, shown, finish, error in pieces(ask, rid, stream):
                made += len(counted)
                if finish is None:  # (tokens with no text: half a character, a special token, a stop's start)
                    if piece or (counted and ask.return_token_ids) or (shown and ask.sampling.logprobs is not None):
                        yield chunk(ask, rid, model, piece, tokens=counted, shown=shown)
                    continue
                finished = True
                if error:
                    yield sse(ApiError(f"the engine failed: {error}", status=503).body())
                else:
                    yield chunk(ask, rid, model, piece, finish, tokens=counted, shown=shown)
                    if ask.include_usage:
                        yield chunk(ask, rid, model, None, counts=usage(prompt_tokens, made))
                yield DONE
        finally:
            app.state.in_flight.discard(rid)
            if not finished:  # the client hung up (Starlette cancelled us) or the server is stopping
                loop.abort(rid)

    return app


async def drain(app: FastAPI, loop: LoopHandle, drain_s: float, stop_now: asyncio.Event) -> int:
    """Stop taking requests (503), let the replies in flight finish for up to drain_s seconds (or until stop_now),
    then end the rest with finish_reason "abort" and wait until their last chunks are out. Returns how many were
    cut short."""
    app.state.draining = True
    try:
        await asyncio.wait_for(until(lambda: not app.state.in_flight, stop_now), drain_s)
    except TimeoutError:
        pass
    cut = list(app.state.in_flight)
    for rid in cut:
        loop.abort(rid, "abort")
    try:
        await asyncio.wait_for(until(lambda: not app.state.in_flight), 5.0)
    except TimeoutError:
        pass
    return len(cut)


async def until(condition, interrupt: asyncio.Event | None = None) -> None:
    while not condition() and not (interrupt and interrupt.is_set()):
        await asyncio.sleep(0.02)
