"""The HTTP side: a FastAPI app that hands requests to the engine and streams its tokens back.

    POST /v1/completions, /v1/chat/completions   generate (streamed as server-sent events, or whole)
    GET  /v1/models, /v1/models/{id}   the one model served       GET /health    is the engine alive?
    GET  /metrics      Prometheus text (live_metrics.py)
    GET  /trace        the recorded steps as a minillm trace (?last_steps=N, ?since_step=K): the app polls it
                       (with replicas, router.py: one replica's, ?replica=I, replica 0 by default)

Every handler runs on the event loop, where waiting is free: a request is handed to the engine (a
ServeLoop on a thread, or an EngineProcess), then the handler awaits its token stream. The engine
never waits for the handler, so a thousand open streams cost it nothing but one message per step.
The body is read by openai_protocol.py and openai_prompts.py, echo's prompt scored by openai_echo.py, and the
engine's streams made into the reply's choices, whole or streamed, by openai_choices.py.

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

from minillm.layers.replies import sibling
from minillm.layers.service import Service
from minillm.serving.openai_choices import Choices
from minillm.serving.openai_echo import echo_only, echoes_of, eos_row
from minillm.serving.openai_output import choice, reply, usage
from minillm.serving.openai_prompts import parse_chat, parse_completion, to_request
from minillm.serving.openai_protocol import ApiError, Ask, parse_json
from minillm.serving.openai_structured import constraint_for, warm, with_pattern
from minillm.serving.serve_loop import RETRY_AFTER_S, LoopHandle
from minillm.serving.token_stream import AsyncTokenStream, Event

ALIVE_CHECK_S = 5.0  # while waiting for the engine's first word, check this often that it still runs
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
        asks = ask.each()  # several prompts (completions): one engine request each, a choice each
        requests = [to_request(one, f"r{next(ids)}", loop.max_len) for one in asks]  # (all checked before any goes)
        constraint = await constraint_for(ask)  # (response_format or regex: a 400 here if it cannot be)
        echoes, scores = await echoes_of(loop, ask, requests)
        prompt_tokens = sum(len(request.prompt_ids) for request in requests)  # (once per prompt, whatever n)
        # n replies to each prompt: reply j of prompt k is choice k * n + j (OpenAI's order); reply j > 0 follows
        # reply 0, whose prompt's blocks it shares (layers/replies.py)
        follows = [None if j == 0 else (r.id, j) for r in requests for j in range(ask.n)]
        requests = [r if j == 0 else sibling(r, j) for r in requests for j in range(ask.n)]
        asks, echoes, scores = ([x for x in xs for _ in range(ask.n)] for xs in (asks, echoes, scores))
        if ask.max_tokens == 0:  # (echo: the prompt scored, nothing made; the engine only answered a question)
            if ask.stream:
                events = echo_only(ask, model, requests, echoes, prompt_tokens)
                return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
            choices = [choice(ask, i, [], "", "length", [], echo) for i, echo in enumerate(echoes)]
            return Json(reply(ask, requests[0].id, model, choices, usage(prompt_tokens, 0)))
        streams, rids = [], [request.id for request in requests]
        service = Service(priority=ask.priority)  # (the trace keeps it; the priority policy seats by it)
        try:
            for request, first in zip(requests, follows):
                request.sampling = replace(request.sampling, constraint=constraint)  # (it travels in the sampling)
                stream = AsyncTokenStream(asyncio.get_running_loop())
                loop.submit(request, stream, service, first)
                streams.append(stream)
                first = await first_word(stream)
                if first.kind == "refused":
                    code = "queue_full" if first.status == 429 else None
                    raise ApiError(first.detail, status=first.status, code=code)
                if first.kind == "done":  # (the engine died, or the server stopped it, before it took the request)
                    raise ApiError(f"the engine could not take the request ({first.detail})", status=503)
                app.state.in_flight.add(request.id)
        except BaseException:
            for rid in rids[: len(streams)]:  # the prompts taken before one was refused: their seats go back
                loop.abort(rid)
                app.state.in_flight.discard(rid)
            raise
        eos = [eos_row(loop, ask, r, s) for r, s in zip(requests, scores)]
        replies = Choices(loop, model, app.state.in_flight, ask, asks, rids, streams, prompt_tokens, echoes, eos)
        if ask.stream:
            events = replies.stream()
            return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        return Json(await replies.whole(http))

    async def first_word(stream: AsyncTokenStream) -> Event:
        while True:
            try:
                return await asyncio.wait_for(stream.next(), ALIVE_CHECK_S)
            except TimeoutError:
                if not loop.alive:
                    raise ApiError(f"the engine has stopped ({loop.error!r})", status=503) from None

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
