"""The OpenAI API's shapes: what a client sends, what it gets back, and the errors in between.

vLLM, SGLang, TGI and minillm all speak this dialect, so one client (curl, the `openai` package,
loadgen.py) talks to any of them. Two endpoints generate:

  POST /v1/completions        {"model", "prompt": "spell 42", "max_tokens", "stream"}
  POST /v1/chat/completions   {"model", "messages": [{"role": "system" | "user" | ..., "content"}], ...}

Chat maps onto the tiny model's prompt format (tokenizer.encode_prompt): the system message becomes
the preamble, the last user message the prompt; earlier turns are dropped (the model has no memory
of a conversation, and it knows only its two tasks: "count down from N" and "spell N").

With "stream": true the reply comes as server-sent events, one `data: {json}` line per chunk of new
text, then `data: [DONE]`. The chunk that carries finish_reason also carries `usage` (the token
counts); with "stream_options": {"include_usage": true} a last chunk with no choices repeats it,
as OpenAI's API does. Decoding is greedy: temperature and top_p are accepted and ignored.
`ignore_eos` (as in vLLM) runs a reply to exactly max_tokens; `return_token_ids` (as in vLLM) adds each
choice's new token ids as "token_ids" (the tests compare them with the offline engine's, token for token).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from minillm.engine.request import Request
from minillm.errors import MinillmError
from minillm.model.tokenizer import encode_prompt

FINISH_REASONS = {"eos": "stop", "length": "length"}  # the engine's words -> OpenAI's


class ApiError(MinillmError):
    """A request the server answers with an OpenAI-style error object instead of a reply."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.param, self.code = status, param, code

    def body(self) -> dict:
        kind = {429: "rate_limit_error", 503: "server_error"}.get(self.status, "invalid_request_error")
        return {"error": {"message": str(self), "type": kind, "param": self.param, "code": self.code}}


@dataclass
class Ask:
    """One generation request, whichever endpoint it came through."""

    prompt: str
    preamble: str | None = None
    max_tokens: int | None = None  # None: until EOS or the context is full
    stream: bool = False
    include_usage: bool = False
    ignore_eos: bool = False
    return_token_ids: bool = False
    chat: bool = False


def parse_json(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(f"the request body is not valid JSON ({e})") from None
    if not isinstance(body, dict):
        raise ApiError('the request body must be a JSON object, e.g. {"prompt": "spell 42"}')
    return body


def _flag(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise ApiError(f"{name} must be true or false, got {value!r}", param=name)
    return value


def _common(body: dict, model: str, prompt: str, chat: bool, preamble: str | None = None) -> Ask:
    if body.get("model") not in (None, model):
        raise ApiError(f"model {body['model']!r} is not served here; this server serves {model!r} "
                       "(GET /v1/models lists it)", param="model", code="model_not_found")  # fmt: skip
    if not prompt.strip():
        raise ApiError("the prompt is empty; ask e.g. 'count down from 12' or 'spell 4096'", param="prompt")
    name = "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens"
    max_tokens = body.get(name)
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1):
        raise ApiError(f"{name} must be a whole number of at least 1, got {max_tokens!r}", param=name)
    if body.get("n", 1) != 1:
        raise ApiError("n must be 1: this server makes one reply per request", param="n")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError('stream_options must be an object, e.g. {"include_usage": true}', param="stream_options")
    return Ask(prompt, preamble, max_tokens, _flag(body, "stream"), _flag(options, "include_usage"),
               _flag(body, "ignore_eos"), _flag(body, "return_token_ids"), chat)  # fmt: skip


def parse_completion(body: dict, model: str) -> Ask:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]  # a batch of one
    if not isinstance(prompt, str):
        raise ApiError("prompt must be a string, e.g. \"count down from 12\" (one prompt per request)",
                       param="prompt")  # fmt: skip
    return _common(body, model, prompt, chat=False)


def _text(content, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)  # text parts; images and audio are not understood
    raise ApiError(f"messages[{i}].content must be a string or a list of text parts", param="messages")


def parse_chat(body: dict, model: str) -> Ask:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError('messages must be a non-empty list, e.g. [{"role": "user", "content": "spell 42"}]',
                       param="messages")  # fmt: skip
    system, user = None, None
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant", "tool"):
            raise ApiError(f"messages[{i}] must be an object with a role (system, user or assistant)",
                           param="messages")  # fmt: skip
        if m["role"] in ("system", "developer"):
            system = _text(m.get("content"), i)
        elif m["role"] == "user":
            user = _text(m.get("content"), i)
    if user is None:
        raise ApiError("messages has no user message: nothing to reply to", param="messages")
    return _common(body, model, user, chat=True, preamble=system)


def to_request(ask: Ask, request_id: str, max_len: int) -> Request:
    ids = encode_prompt(ask.prompt, ask.preamble)
    if len(ids) >= max_len:
        raise ApiError(f"the prompt is {len(ids)} tokens but the model's context is {max_len}: shorten it",
                       param="messages" if ask.chat else "prompt")  # fmt: skip
    room = max_len - len(ids)  # the most tokens a reply can have: prompt + reply fill the context
    if ask.max_tokens is not None and ask.max_tokens > room:
        raise ApiError(f"the prompt ({len(ids)} tokens) plus max_tokens ({ask.max_tokens}) exceeds the model's context "
                       f"of {max_len} tokens; use max_tokens <= {room}", param="max_tokens")  # fmt: skip
    max_tokens = ask.max_tokens or room  # by default: until EOS, or the context is full
    text = ask.prompt if not ask.preamble else f"[{len(ask.preamble)}-byte system prompt] {ask.prompt}"
    return Request(request_id, ids, max_tokens, ignore_eos=ask.ignore_eos, prompt=text)


# --- what goes back ---------------------------------------------------------------------------------
def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}  # fmt: skip


def response_id(ask: Ask, request_id: str) -> str:
    return f"{'chatcmpl' if ask.chat else 'cmpl'}-{request_id}"


def reply(ask: Ask, request_id: str, model: str, tokens: list[int], text: str, finish: str, counts: dict) -> dict:
    """The whole reply at once (stream: false)."""
    if ask.chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    if ask.return_token_ids:
        choice["token_ids"] = tokens
    return {"id": response_id(ask, request_id), "object": "chat.completion" if ask.chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": [choice], "usage": counts}  # fmt: skip


def chunk(ask: Ask, request_id: str, model: str, text: str | None, finish: str | None = None,
          counts: dict | None = None, role: bool = False, tokens: list[int] = ()) -> str:  # fmt: skip
    """One server-sent event of a streamed reply. text None (with counts): the usage-only last chunk."""
    if text is None:
        choices = []
    elif ask.chat:
        delta = ({"role": "assistant"} if role else {}) | ({"content": text} if text or role else {})
        choices = [{"index": 0, "delta": delta, "finish_reason": finish}]
    else:
        choices = [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]
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
