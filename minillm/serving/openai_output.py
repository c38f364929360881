"""The OpenAI API's replies: a request's tokens turned into the text a client sees, and the shapes it comes in.

A reply's tokens arrive a few at a time (each step's). ReplyText turns them into text, a piece at a time:

- a character cut between two byte tokens waits for its rest (an incremental UTF-8 decoder);
- stop strings: the reply ends where one appears, without it, also when it spans two pieces. Text that could
  still be the start of a stop string is held back until the next tokens say whether it is; the engine is
  told at once (an abort with reason "stop") and frees the request's seat and KV blocks before its next step.
  Matching happens here, on the HTTP side, as vLLM's output processor does it: the engine never decodes text;
- the tokens it counts (usage's completion_tokens, return_token_ids) are those up to the end of a stop
  string; EOS is never counted (it is no part of the reply) and neither are tokens made after a stop while
  the abort travelled.

With "stream": true the reply comes as server-sent events, one `data: {json}` line per piece, then
`data: [DONE]`. Usage comes in a whole reply always; in a stream only when asked (stream_options.include_usage),
on a last chunk with no choices, as OpenAI's API sends it, and with vLLM's continuous_usage_stats also on every
chunk (the counts so far). A completions request with several prompts has one choice per prompt (its index: the
prompt's position); its usage counts them all.

echo (completions) puts the prompt's text before the reply's, and with logprobs the prompt's tokens before the
reply's in every column, the first one's logprob null (nothing came before it), as OpenAI and vLLM send it. Those
come from prompt_logprobs: one plain forward over the prompt, run on the engine's side between two steps.
"""

from __future__ import annotations

import codecs
import json
import time

import torch

from minillm.errors import MinillmError
from minillm.model.tokenizer import EOS, SPECIAL_NAMES
from minillm.serving.openai_protocol import Ask

FINISH_REASONS = {"eos": "stop", "length": "length", "stop": "stop", "abort": "abort"}  # the engine's -> OpenAI's
LOWEST_LOGPROB = -9999.0  # what a logprob of -inf is sent as (JSON has no infinity; vLLM sends the same)


class ReplyText:
    """One reply's tokens -> its text, a piece at a time, ending at the first stop string."""

    def __init__(self, stop: tuple[str, ...] = ()):
        self.stops = [s.encode("utf-8") for s in stop]
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.tokens: list[int] = []  # the reply's tokens so far, up to a stop string's end
        self.waiting: list[tuple[int, tuple | None]] = []  # (token, logprobs) counted but not shown yet
        self.held = bytearray()  # the waiting tokens' bytes: they might begin a stop string
        self.chars = 0  # characters shown so far (a token's text_offset)
        self.stopped = False

    def add(self, tokens: list[int], logprobs: list | None = None, end: bool = False):
        """New tokens (and their logprobs) -> (text to show now, tokens counted now, [(token, logprobs, offset)]
        shown now). end: the reply is over, show whatever waits."""
        counted = len(self.tokens)
        for i, token in enumerate(tokens):
            self.tokens.append(token)
            self.waiting.append((token, logprobs[i] if logprobs and i < len(logprobs) else None))
            if token >= 256:
                continue  # special tokens have no text
            self.held.append(token)
            stop = next((s for s in self.stops if self.held.endswith(s)), None)
            if stop is not None:  # the reply ends here: show what came before the stop string, drop the rest
                self.stopped = True
                text, shown = self.show(len(self.held) - len(stop), final=True)
                return text, self.tokens[counted:], shown
        keep = 0 if end else self.stop_prefix()
        text, shown = self.show(len(self.held) - keep, final=end)
        return text, self.tokens[counted:], shown

    def stop_prefix(self) -> int:
        """How many of the held bytes, at their end, are the start of some stop string (and must wait)."""
        for n in range(min(len(self.held), max(map(len, self.stops), default=1) - 1), 0, -1):
            if any(s.startswith(self.held[-n:]) for s in self.stops):
                return n
        return 0

    def show(self, num_bytes: int, final: bool) -> tuple[str, list]:
        """Release the waiting tokens up to `num_bytes` of their bytes: their text and their logprobs."""
        pieces, shown = [], []
        while self.waiting and (self.waiting[0][0] >= 256 or num_bytes > 0):
            token, logprobs = self.waiting.pop(0)
            piece = ""
            if token < 256:
                piece, num_bytes = self.decoder.decode(bytes([token])), num_bytes - 1
                del self.held[0]
            shown.append((token, logprobs, self.chars))
            pieces.append(piece)
            self.chars += len(piece)
        if final:
            pieces.append(self.decoder.decode(b"", final=True))
            self.waiting, self.held = [], bytearray()
        return "".join(pieces), shown


# --- logprobs ----------------------------------------------------------------------------------------
def token_text(token: int) -> str:
    """A token as OpenAI names one: its character, a byte of a longer character as bytes:\\xNN, or <eos>."""
    if token in SPECIAL_NAMES:
        return SPECIAL_NAMES[token]
    return chr(token) if token < 128 else f"bytes:\\x{token:02x}"


def logprobs_shape(ask: Ask, shown: list, echo: list = (), shift: int = 0) -> dict | None:
    """The logprobs of the tokens shown, in the endpoint's shape (chat: a list of entries; completions: columns).
    echo: the prompt's rows (echo_of) before them, the shown tokens' offsets moved on by `shift` (the prompt's text)."""
    if ask.sampling.logprobs is None:
        return None
    # (token, its logprob, [(top id, logprob)], text offset); an echoed prompt's first token has no logprob: None
    row = lambda t, lp, at: (t, None, None, at) if lp is None else (t, max(lp[0], LOWEST_LOGPROB), [*zip(*lp[1:])], at)
    rows = [row(t, lp, at + shift) for t, lp, at in shown if lp is not None]
    if ask.chat:
        entry = lambda t, lp: {"token": token_text(t), "logprob": max(lp, LOWEST_LOGPROB), "bytes": [t] * (t < 256)}
        return {"content": [entry(t, lp) | {"top_logprobs": [entry(i, v) for i, v in top]} for t, lp, top, _ in rows]}
    rows = [row(*one) for one in echo] + rows
    return {"tokens": [token_text(t) for t, *_ in rows], "token_logprobs": [lp for _, lp, _, _ in rows],
            "top_logprobs": [None if top is None else {token_text(i): max(v, LOWEST_LOGPROB) for i, v in top}
                             | {token_text(t): lp} for t, lp, top, _ in rows],
            "text_offset": [at for *_, at in rows]}  # fmt: skip


# --- echo: the prompt's own log-probabilities ------------------------------------------------------------
@torch.no_grad()
def prompt_logprobs(ids: list[int], top: int, engine) -> list[tuple | None]:
    """(Asked of the engine between two steps: loop.ask(partial(prompt_logprobs, ids, top)).) The prompt's own
    log-probabilities: one plain forward over it (a prefill with no cache, no sampling). Entry i < len(ids): (logprob
    of ids[i] given ids[:i], the `top` likeliest ids there, their logprobs); entry 0 is None: nothing came before it.
    The last entry, len(ids): the same for an EOS after the whole of ids (a reply that ends there shows its EOS)."""
    from minillm.engine.runner import ModelRunner

    runner = engine.runner
    if type(runner) is not ModelRunner:  # (a tensor-parallel runner holds a shard: one plain forward is not enough)
        raise MinillmError("echo with logprobs needs the whole model in one engine process (not --tp > 1)")
    rows = runner.model(torch.tensor([ids], device=runner.device))[0].float().log_softmax(-1)  # (T, V)
    after = torch.tensor([*ids[1:], EOS], dtype=torch.long, device=rows.device)  # each row's next token
    chosen = rows.gather(1, after[:, None])[:, 0].tolist()
    best = rows.topk(top) if top else None
    top_ids = best.indices.tolist() if best is not None else [[]] * len(chosen)
    top_lps = best.values.tolist() if best is not None else [[]] * len(chosen)
    return [None, *zip(chosen, top_ids, top_lps)]


def echo_of(prompt_ids: list[int], scores: list | None) -> tuple[str, list]:
    """The prompt as echo shows it: its text, and its rows [(token, logprobs or None, text offset)] (none without
    scores: logprobs not asked)."""
    decoder, text, rows = codecs.getincrementaldecoder("utf-8")(errors="replace"), [], []
    chars = 0
    for i, token in enumerate(prompt_ids):
        if scores is not None:
            rows.append((token, scores[i], chars))
        if token < 256:
            piece = decoder.decode(bytes([token]))
            text.append(piece)
            chars += len(piece)
    text.append(decoder.decode(b"", final=True))
    return "".join(text), rows


# --- what goes back ----------------------------------------------------------------------------------
def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}  # fmt: skip


def response_id(ask: Ask, request_id: str) -> str:
    return f"{'chatcmpl' if ask.chat else 'cmpl'}-{request_id}"


def choice(ask: Ask, index: int, tokens: list[int], text: str, finish: str, shown: list,
           echo: tuple[str, list] = ("", [])) -> dict:  # fmt: skip
    """One choice of a whole reply. echo: the prompt's text and rows (echo_of) to put before the reply's."""
    if ask.chat:
        one = {"index": index, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
    else:
        one = {"index": index, "text": echo[0] + text, "finish_reason": finish}
    one["logprobs"] = logprobs_shape(ask, shown, echo[1], len(echo[0]))
    if ask.return_token_ids:
        one["token_ids"] = tokens
    return one


def reply(ask: Ask, request_id: str, model: str, choices: list[dict], counts: dict) -> dict:
    """The whole reply at once (stream: false): its choices (choice()), in their indexes' order."""
    return {"id": response_id(ask, request_id), "object": "chat.completion" if ask.chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": choices, "usage": counts}  # fmt: skip


def chunk(ask: Ask, request_id: str, model: str, text: str | None, finish: str | None = None,
          counts: dict | None = None, role: bool = False, tokens: list[int] = (), shown: list = (),
          index: int = 0, echo: list = (), shift: int = 0) -> str:  # fmt: skip
    """One server-sent event of a streamed reply, for the choice `index`. text None (with counts): the usage-only
    last chunk; text and counts (continuous_usage_stats): a chunk with the usage so far. echo, shift: as
    logprobs_shape's (the echoed prompt's chunk: its rows; the reply's after it: the prompt's length)."""
    if text is None:
        choices = []
    elif ask.chat:
        delta = ({"role": "assistant"} if role else {}) | ({"content": text} if text or role else {})
        choices = [{"index": index, "delta": delta, "logprobs": logprobs_shape(ask, shown), "finish_reason": finish}]
    else:
        lps = logprobs_shape(ask, shown, echo, shift)
        choices = [{"index": index, "text": text, "logprobs": lps, "finish_reason": finish}]
    if ask.return_token_ids and choices:
        choices[0]["token_ids"] = list(tokens)
    body = {"id": response_id(ask, request_id), "object": "chat.completion.chunk" if ask.chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": choices}  # fmt: skip
    if counts is not None:
        body["usage"] = counts
    return sse(body)


def sse(data: dict | str) -> str:
    """A server-sent event: a `data:` line and a blank line."""
    return f"data: {data if isinstance(data, str) else json.dumps(data, separators=(',', ':'))}\n\n"


DONE = sse("[DONE]")
