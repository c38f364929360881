"""The OpenAI API's requests: what a client may send, checked field by field, and the errors in between.

vLLM, SGLang, TGI and minillm all speak this dialect, so one client (curl, the `openai` package,
loadgen.py) talks to any of them. Two endpoints generate:

  POST /v1/completions        {"model", "prompt": "spell 42", "max_tokens", "stream", ...}: the prompt as raw text
  POST /v1/chat/completions   {"model", "messages": [{"role": "system" | "user" | ..., "content"}], ...}

Chat maps onto the tiny model's prompt format (tokenizer.encode_prompt): the system message becomes
the preamble, the last user message the prompt; earlier turns are dropped (the model has no memory
of a conversation, and it knows only its two tasks: "count down from N" and "spell N"). Completions
send the prompt as it is, after <bos> (as vLLM does): the chat format is the chat endpoint's business.

Sampling (temperature, top_p, top_k, seed), stop strings, logprobs and max_tokens are honoured. A field
this server cannot honour (echo, tools, penalties, ...) is refused with a 400 that names it, never silently
dropped: a client that relies on it would get wrong answers without knowing. Such a field sent with the value
that asks for nothing (null, false, 0, an empty list) is fine. Two extensions, as in vLLM: `ignore_eos` runs a
reply to exactly max_tokens; `return_token_ids` adds each choice's new token ids as "token_ids" (the tests
compare them with the offline engine's, token for token).

Structured output (`response_format` json_object / json_schema, and minillm's `regex`) is read by
openai_structured.py, on both endpoints, after the fields here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from minillm.config import Sampling, check_sampling
from minillm.engine.request import Request
from minillm.errors import InputError, MinillmError
from minillm.model.tokenizer import BOS, encode, encode_prompt

MAX_STOPS = 4  # stop strings per request (OpenAI's limit)
MAX_TOP_LOGPROBS = 5
BIG_NUMBER_DIGITS = 40  # a JSON integer longer than this is no count, seed or token of ours: refused, not parsed


class ApiError(MinillmError):
    """A request the server answers with an OpenAI-style error object instead of a reply."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.param, self.code = status, param, code

    def body(self) -> dict:
        kind = {404: "not_found_error", 413: "invalid_request_error", 429: "rate_limit_error"}.get(self.status)
        kind = kind or ("server_error" if self.status >= 500 else "invalid_request_error")
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
    sampling: Sampling = Sampling()  # (its logprobs: how many top tokens to list, None: no logprobs)
    stop: tuple[str, ...] = ()
    pattern: str | None = None  # the regex the reply must match, None: any (openai_structured.with_pattern sets it)
    pattern_param: str = "response_format"  # the field that asked for it (an error names it)


# --- the body ------------------------------------------------------------------------------------
class BigNumber:
    """Stands in for an integer with too many digits to be anything a field here could take."""

    def __init__(self, digits: str):
        self.digits = len(digits.lstrip("-"))

    def __repr__(self) -> str:
        return f"<a {self.digits}-digit number>"


def parse_json(raw: bytes) -> dict:
    """The body as a JSON object; malformed, too deep or not an object: a 400 that says so."""
    big = lambda text: int(text) if len(text) <= BIG_NUMBER_DIGITS else BigNumber(text)
    try:
        body = json.loads(raw, parse_int=big)
    except (ValueError, UnicodeDecodeError) as e:  # (json.JSONDecodeError is a ValueError)
        raise ApiError(f"the request body is not valid JSON ({e})") from None
    except RecursionError:
        raise ApiError("the request body is nested too deeply to be a request") from None
    if not isinstance(body, dict):
        raise ApiError('the request body must be a JSON object, e.g. {"prompt": "spell 42"}')
    return body


# Fields a client may send that ask for nothing when they hold one of these values (OpenAI's defaults).
HARMLESS = {"presence_penalty": (0,), "frequency_penalty": (0,), "logit_bias": ({},), "echo": (False,),
            "best_of": (1,), "suffix": ("",), "tools": ([],), "tool_choice": ("none", "auto"), "functions": ([],),
            "parallel_tool_calls": (True, False), "store": (False,), "n": (1,)}  # fmt: skip
WHY_NOT = {"echo": "echo (the prompt back in the reply) is not supported",
           "tools": "this model cannot call tools", "tool_choice": "this model cannot call tools",
           "functions": "this model cannot call functions",
           "n": "n must be 1: this server makes one reply per request"}  # fmt: skip
COMMON = {"model", "max_tokens", "stream", "stream_options", "temperature", "top_p", "top_k", "seed", "stop",
          "ignore_eos", "return_token_ids", "user", "metadata", "service_tier", "response_format", "regex"}  # fmt: skip
FIELDS = {"completions": COMMON | {"prompt", "logprobs"},
          "chat": COMMON | {"messages", "max_completion_tokens", "logprobs", "top_logprobs"}}  # fmt: skip


def same(value, harmless) -> bool:
    return value == harmless and isinstance(value, bool) == isinstance(harmless, bool)


def check_fields(body: dict, endpoint: str) -> dict:
    """The fields to read (a null is as good as absent); any other field that asks for something: a 400."""
    for name, value in body.items():
        if value is None or name in FIELDS[endpoint] or any(same(value, h) for h in HARMLESS.get(name, ())):
            continue
        why = WHY_NOT.get(name, "this server does not support it" if name in HARMLESS else "unknown field")
        raise ApiError(f"{name}: {why} (got {json.dumps(value, default=repr)[:80]}); leave it out", param=name)
    return {name: value for name, value in body.items() if value is not None}


def _flag(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise ApiError(f"{name} must be true or false, got {value!r}", param=name)
    return value


def _whole(body: dict, name: str, low: int, high: float, what: str) -> int | None:
    value = body.get(name)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high):
        raise ApiError(f"{name} must be a whole number {what}, got {value!r}", param=name)
    return value


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop", [])
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > MAX_STOPS or not all(isinstance(s, str) and s for s in stops):
        raise ApiError(f"stop must be a string or a list of at most {MAX_STOPS} non-empty strings, got {stop!r}",
                       param="stop")  # fmt: skip
    for s in stops:
        utf8(s, "stop")
    return tuple(stops)


def utf8(text: str, param: str) -> bytes:
    """The text's bytes (the tiny model's tokens), or a 400 when it is not valid Unicode (a lone surrogate)."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ApiError(f"{param} holds {e.object[e.start : e.end]!r}, which is not valid Unicode text (a lone "
                       "surrogate): send UTF-8 text", param=param) from None  # fmt: skip


def _sampling(body: dict, logprobs: int | None) -> Sampling:
    for name in ("temperature", "top_p", "top_k", "seed"):
        if name in body:
            try:
                check_sampling(name, body[name])
            except InputError as e:
                raise ApiError(str(e), param=name) from None
    fields = {n: body[n] for n in ("temperature", "top_p", "top_k", "seed") if n in body}
    return Sampling(**fields, logprobs=logprobs)


def _common(body: dict, model: str, prompt: str, chat: bool, logprobs: int | None, preamble: str | None = None) -> Ask:
    if not isinstance(body.get("model", model), str):
        raise ApiError(f"model must be a string, e.g. {model!r}", param="model")
    if body.get("model", model) != model:
        raise ApiError(f"the model {body['model']!r} does not exist here; this server serves {model!r} "
                       "(GET /v1/models lists it)", status=404, param="model", code="model_not_found")  # fmt: skip
    if not prompt.strip():
        raise ApiError("the prompt is empty; ask e.g. 'count down from 12' or 'spell 4096'", param="prompt")
    name = "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens"
    max_tokens = _whole(body, name, 1, float("inf"), "of at least 1")
    options = body.get("stream_options", {})
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise ApiError('stream_options must be an object like {"include_usage": true}', param="stream_options")
    for name in ("user", "service_tier"):
        if not isinstance(body.get(name, ""), str):
            raise ApiError(f"{name} must be a string", param=name)
    return Ask(prompt, preamble, max_tokens, _flag(body, "stream"), _flag(options, "include_usage"),
               _flag(body, "ignore_eos"), _flag(body, "return_token_ids"), chat, _sampling(body, logprobs),
               _stop(body))  # fmt: skip


def parse_completion(body: dict, model: str) -> Ask:
    body = check_fields(body, "completions")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]  # a batch of one
    if not isinstance(prompt, str):
        raise ApiError("prompt must be a string, e.g. \"count down from 12\" (one prompt per request)",
                       param="prompt")  # fmt: skip
    logprobs = _whole(body, "logprobs", 0, MAX_TOP_LOGPROBS, f"from 0 to {MAX_TOP_LOGPROBS}")
    return _common(body, model, prompt, chat=False, logprobs=logprobs)


def _text(content, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        if all(isinstance(p.get("text", ""), str) for p in content):
            return "".join(p.get("text", "") for p in content)  # text parts; images and audio are not understood
    raise ApiError(f"messages[{i}].content must be a string or a list of text parts", param="messages")


def parse_chat(body: dict, model: str) -> Ask:
    body = check_fields(body, "chat")
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
    logprobs = _flag(body, "logprobs")
    top = _whole(body, "top_logprobs", 0, MAX_TOP_LOGPROBS, f"from 0 to {MAX_TOP_LOGPROBS}")
    if top is not None and not logprobs:
        raise ApiError("top_logprobs needs logprobs: true", param="top_logprobs")
    return _common(body, model, user, chat=True, logprobs=(top or 0) if logprobs else None, preamble=system)


def to_request(ask: Ask, request_id: str, max_len: int) -> Request:
    """The engine's request: the prompt's length checked before it is tokenized (a huge prompt costs nothing).
    Its constraint, the automaton of ask.pattern, is the app's to add to its sampling
    (openai_structured.constraint_for)."""
    param = "messages" if ask.chat else "prompt"
    if len(ask.prompt) + len(ask.preamble or "") + 1 + ask.chat >= max_len:  # a character is at least one token
        raise ApiError(f"the prompt is over {max_len} tokens, the model's context: shorten it", param=param)
    utf8(ask.prompt, param)
    utf8(ask.preamble or "", param)
    ids = encode_prompt(ask.prompt, ask.preamble) if ask.chat else [BOS, *encode(ask.prompt)]
    if len(ids) >= max_len:
        raise ApiError(f"the prompt is {len(ids)} tokens but the model's context is {max_len}: shorten it",
                       param=param)  # fmt: skip
    room = max_len - len(ids)  # the most tokens a reply can have: prompt + reply fill the context
    if ask.max_tokens is not None and ask.max_tokens > room:
        raise ApiError(f"the prompt ({len(ids)} tokens) plus max_tokens ({ask.max_tokens}) exceeds the model's context "
                       f"of {max_len} tokens; use max_tokens <= {room}", param="max_tokens")  # fmt: skip
    max_tokens = ask.max_tokens or room  # by default: until EOS, or the context is full
    text = ask.prompt if not ask.preamble else f"[{len(ask.preamble)}-byte system prompt] {ask.prompt}"
    return Request(request_id, ids, max_tokens, ignore_eos=ask.ignore_eos, prompt=text, sampling=ask.sampling)
