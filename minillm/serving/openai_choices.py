"""A reply in the making: each prompt's engine stream read into its choice, several side by side, sent back.

One request's token stream becomes pieces of text (openai_output.ReplyText: stop strings, characters cut between
tokens). A completions request with several prompts has several streams, merged as their pieces come: no choice
waits for another. The reply then goes back whole (one JSON object once every choice has finished; meanwhile the
client is asked now and then whether it still waits) or as server-sent events, a chunk per piece, each with its
choice's index. However it ends (every choice finished, the client hung up, the server stopping, a sibling that
failed), each request not finished is aborted, so its seat and KV blocks are free before the next step.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from fastapi import Request

from minillm.model.tokenizer import EOS
from minillm.serving.openai_output import DONE, FINISH_REASONS, ReplyText, choice, chunk, reply, sse, usage
from minillm.serving.openai_protocol import ApiError, Ask
from minillm.serving.serve_loop import LoopHandle
from minillm.serving.token_stream import AsyncTokenStream

HANG_UP_CHECK_S = 0.5  # while a whole (not streamed) reply is being made, check this often that the client waits


@dataclass
class Choices:
    """One reply's engine requests, a choice each (asks[i], rids[i], streams[i]), taken by the engine."""

    loop: LoopHandle
    model: str
    in_flight: set[str]  # the app's: ids of the requests whose reply is being made (drain waits for them)
    ask: Ask  # the request as sent (asks: one per prompt, Ask.each)
    asks: list[Ask]
    rids: list[str]
    streams: list[AsyncTokenStream]
    prompt_tokens: int
    echoes: list  # each choice's echo, put first (openai_echo.echoes_of): ("", []) without echo
    eos: list  # each choice's openai_echo.eos_row, for a reply whose EOS is shown, or None

    async def pieces(self, i: int):
        """Choice i's reply as (text, tokens counted, tokens shown with logprobs, finish reason or None, error)."""
        ask, rid, stream, eos = self.asks[i], self.rids[i], self.streams[i], self.eos[i]
        text = ReplyText(ask.stop)
        while True:
            events = await stream.next_batch()  # all that piled up: a reader that fell behind sends one chunk
            done = next((e for e in events if e.kind == "done"), None)
            tokens = [t for e in events for t in e.tokens]
            logprobs = [lp for e in events for lp in e.logprobs or ()] if ask.sampling.logprobs is not None else None
            piece, counted, shown = text.add(tokens, logprobs, end=done is not None)
            if text.stopped:
                self.loop.abort(rid, "stop")  # its seat and KV blocks are free before the next step
                yield piece, counted, shown, "stop", None
                return
            if done is None:
                yield piece, counted, shown, None, None
                continue
            error = done.detail if done.detail.startswith("error") else None
            if done.detail == "eos" and eos is not None:  # (not counted: EOS is no part of the reply's text)
                shown = [*shown, (EOS, await eos(text.tokens), text.chars)]
            yield piece, counted, shown, FINISH_REASONS.get(done.detail, done.detail), error
            return

    async def all_pieces(self):
        """Every choice's pieces as they come, as (index, piece): one prompt's directly, several side by side."""
        if len(self.asks) == 1:
            async for piece in self.pieces(0):
                yield 0, piece
            return
        merged: asyncio.Queue = asyncio.Queue()

        async def pump(i: int) -> None:
            try:
                async for piece in self.pieces(i):
                    await merged.put((i, piece))
            except Exception as e:  # (a bug here must end the reply, not leave it waiting)
                await merged.put((i, ("", [], [], "error", f"error: {e!r}")))

        pumps = [asyncio.create_task(pump(i)) for i in range(len(self.asks))]
        try:
            left = len(self.asks)
            while left:
                i, piece = await merged.get()
                left -= piece[3] is not None
                yield i, piece
        finally:
            for task in pumps:
                task.cancel()

    async def whole(self, http: Request) -> dict:
        """The reply as one JSON object, once every choice has finished."""
        asks, rids, echoes = self.asks, self.rids, self.echoes
        texts, tokens, shown = [[] for _ in asks], [[] for _ in asks], [[] for _ in asks]
        choices: list[dict | None] = [None] * len(asks)
        watch = asyncio.create_task(self.hang_up_watch(http))
        try:
            async for i, (piece, counted, seen, finish, error) in self.all_pieces():
                texts[i].append(piece)
                tokens[i] += counted
                shown[i] += seen
                if finish is not None:
                    self.in_flight.discard(rids[i])
                    if error:
                        raise ApiError(f"the engine failed: {error}", status=503)  # (not the request's fault)
                    choices[i] = choice(asks[i], i, tokens[i], "".join(texts[i]), finish, shown[i], echoes[i])
            counts = usage(self.prompt_tokens, sum(map(len, tokens)))
            return reply(self.ask, rids[0], self.model, choices, counts)
        finally:
            watch.cancel()
            for rid, done in zip(rids, choices):
                self.in_flight.discard(rid)
                if done is None:  # cancelled (the server is stopping), or a sibling failed: free the seat
                    self.loop.abort(rid)

    async def hang_up_watch(self, http: Request) -> None:
        """A whole reply sends nothing until it is done, so no failed send says the client left: ask now and then."""
        while not await http.is_disconnected():
            await asyncio.sleep(HANG_UP_CHECK_S)
        for rid in self.rids:
            self.loop.abort(rid)

    async def stream(self):
        """The reply as server-sent events: the echoes first, then a chunk per piece, usage if asked, [DONE]."""
        ask, rids, echoes, model = self.ask, self.rids, self.echoes, self.model
        made, finished = 0, [False] * len(self.asks)
        so_far = lambda: usage(self.prompt_tokens, made) if ask.continuous_usage else None  # (vLLM's continuous usage)
        try:
            if ask.chat:  # the assistant's turn begins (as OpenAI's first chunk)
                yield chunk(ask, rids[0], model, "", role=True, counts=so_far())
            for i, (text, rows) in enumerate(echoes if ask.echo else ()):  # the prompts first, each in its choice
                yield chunk(ask, rids[0], model, text, index=i, echo=rows, counts=so_far())
            async for i, (piece, counted, shown, finish, error) in self.all_pieces():
                made += len(counted)
                if finish is None:  # (tokens with no text: half a character, a special token, a stop's start)
                    if piece or (counted and ask.return_token_ids) or (shown and ask.sampling.logprobs is not None):
                        yield chunk(ask, rids[0], model, piece, tokens=counted, shown=shown, index=i, counts=so_far(),
                                    shift=len(echoes[i][0]))  # fmt: skip
                    continue
                finished[i] = True
                self.in_flight.discard(rids[i])
                if error:
                    yield sse(ApiError(f"the engine failed: {error}", status=503).body())
                    break
                yield chunk(ask, rids[0], model, piece, finish, tokens=counted, shown=shown, index=i, counts=so_far(),
                            shift=len(echoes[i][0]))  # fmt: skip
            else:
                if ask.include_usage:
                    yield chunk(ask, rids[0], model, None, counts=usage(self.prompt_tokens, made))
            yield DONE
        finally:
            for rid, done in zip(rids, finished):
                self.in_flight.discard(rid)
                if not done:  # the client hung up (Starlette cancelled us), the server is stopping, a sibling failed
                    self.loop.abort(rid)
