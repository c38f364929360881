"""The OpenAI API's requests: what a client may send, checked field by field, and the errors in between.

vLLM, SGLang, TGI and minillm all speak this dialect, so one client (curl, the `openai` package,
loadgen.py) talks to any of them. Two endpoints generate, /v1/completions and /v1/chat/completions; their
prompts (OpenAI's four shapes, chat's messages) are read by openai_prompts.py, the fields they share here.

Sampling (temperature, top_p, top_k, seed), stop strings, logprobs and max_tokens are honoured, in OpenAI's
ranges (temperature 0-2, chat's top_logprobs 0-20, completions' legacy logprobs 0-5). stream_options takes
OpenAI's include_usage and include_obfuscation (accepted: there is nothing to pad on loopback) and vLLM's
continuous_usage_stats (usage on every chunk, as benchmark clients such as guidellm ask). A field
this server cannot honour (chat's echo, tools, penalties, ...) is refused with a 400 that names it, never silently
dropped: a client that relies on it would get wrong answers without knowing. Such a field sent with the value
that asks for nothing (null, false, 0, an empty list) is fine. Two extensions, as in vLLM: `ignore_eos` runs a
reply to exactly max_tokens; `return_token_ids` adds each choice's new token ids as "token_ids" (the tests
compare them with the offline engine's, token for token). A third, vLLM's `priority`: a whole number, lower goes
first (default 0), which the priority policy (`serve --scheduler priority`) seats by and every policy's trace keeps.
Unlike vLLM, minillm takes it under any policy (a crowd's priorities can be compared across policies) and only as
a JSON integer (vLLM's parser would also take 1.0, "1" or true; like vLLM's, it refuses null). OpenAI's `n` (replies
to each prompt, as choices) is taken up to MAX_REPLIES: the prompt runs once and its KV blocks are shared.

Structured output (`response_format` json_object / json_schema, and minillm's `regex`) is read by
openai_structured.py, on both endpoints, after the fields here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from minillm.config import Sampling, check_sampling
from minillm.errors import InputError, MinillmError
from minillm.layers.replies import MAX_REPLIES

MAX_STOPS = 4  # stop strings per request (OpenAI's limit)
MAX_TEMPERATURE = 2  # OpenAI's range is 0-2 (the engine itself takes any temperature >= 0)
STREAM_OPTIONS = ("include_usage", "continuous_usage_stats", "include_obfuscation")
BIG_NUMBER_DIGITS = 40  # a JSON integer longer than this is no count, seed or token of ours: refused, not parsed
PRIORITY_RANGE = (-(2**63), 2**63 - 1)  # vLLM's: a 64-bit integer


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

    prompt: str | list[int]  # text, or token ids (completions: sent to the model as they are)
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
    continuous_usage: bool = False  # stream_options.continuous_usage_stats (vLLM's): usage on every chunk too
    prompts: list | None = None  # completions with several prompts: all of them (prompt: the first), else None
    echo: bool = False  # completions: the reply's text starts with the prompt (its logprobs too, when asked)
    priority: int = 0  # vLLM's extension: lower goes first (the engine gets it as the request's Service)
    n: int = 1  # replies to each prompt (choices): the prompt's KV computed once, shared (layers/replies.py)

    def each(self) -> list[Ask]:
        """One Ask per prompt: the choices' order (a request with one prompt: itself)."""
        return [replace(self, prompt=p, prompts=None) for p in self.prompts] if self.prompts else [self]


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
# (repetition_penalty is vLLM's extension: its `vllm bench serve` sends the neutral 1.0 with every request)
HARMLESS = {"presence_penalty": (0,), "frequency_penalty": (0,), "logit_bias": ({},), "echo": (False,),
            "best_of": (1,), "suffix": ("",), "tools": ([],), "tool_choice": ("none", "auto"), "functions": ([],),
            "parallel_tool_calls": (True, False), "store": (False,), "repetition_penalty": (1,)}  # fmt: skip
WHY_NOT = {"echo": "echo (the prompt back in the reply) is not supported",
           "tools": "this model cannot call tools", "tool_choice": "this model cannot call tools",
           "functions": "this model cannot call functions"}  # fmt: skip
COMMON = {"model", "max_tokens", "stream", "stream_options", "temperature", "top_p", "top_k", "seed", "stop",
          "ignore_eos", "return_token_ids", "user", "metadata", "service_tier", "response_format", "regex",
          "priority", "n"}  # fmt: skip
FIELDS = {"completions": COMMON | {"prompt", "logprobs", "echo"},
          "chat": COMMON | {"messages", "max_completion_tokens", "logprobs", "top_logprobs"}}  # fmt: skip


def same(value, harmless) -> bool:
    return value == harmless and isinstance(value, bool) == isinstance(harmless, bool)


def check_fields(body: dict, endpoint: str) -> dict:
    """The fields to read (a null is as good as absent, but for priority: see priority_of); any other field that
    asks for something: a 400."""
    priority_of(body)  # (before its null is dropped with the others')
    for name, value in body.items():
        if value is None or name in FIELDS[endpoint] or any(same(value, h) for h in HARMLESS.get(name, ())):
            continue
        why = WHY_NOT.get(name, "this server does not support it" if name in HARMLESS else "unknown field")
        raise ApiError(f"{name}: {why} (got {json.dumps(value, default=repr)[:80]}); leave it out", param=name)
    return {name: value for name, value in body.items() if value is not None}


def flag(body: dict, name: str) -> bool:
    """A true/false field (absent: false)."""
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise ApiError(f"{name} must be true or false, got {value!r}", param=name)
    return value


def whole(body: dict, name: str, low: int, high: float, what: str) -> int | None:
    """A whole-number field in [low, high] (absent: None); `what` says the range in its error."""
    value = body.get(name)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high):
        raise ApiError(f"{name} must be a whole number {what}, got {value!r}", param=name)
    return value


def priority_of(body: dict) -> int:
    """vLLM's `priority`: a whole number, lower first; absent: 0. Not null (vLLM's field is a plain int)."""
    value = body.get("priority", 0)
    low, high = PRIORITY_RANGE
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        got = json.dumps(value, default=repr)[:80]
        raise ApiError(f"priority must be a whole number, lower first (vLLM's rule: e.g. 0 for a user waiting, 1 for "
                       f"a batch job; leave it out for 0), got {got}", param="priority")  # fmt: skip
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
    if body.get("temperature", 0) > MAX_TEMPERATURE:
        raise ApiError(f"temperature must be a number from 0 to {MAX_TEMPERATURE} (OpenAI's range; 0: greedy), got "
                       f"{body['temperature']!r}", param="temperature")  # fmt: skip
    fields = {n: body[n] for n in ("temperature", "top_p", "top_k", "seed") if n in body}
    return Sampling(**fields, logprobs=logprobs)


def _stream_options(body: dict) -> dict:
    options = body.get("stream_options", {})
    if not isinstance(options, dict) or set(options) - set(STREAM_OPTIONS):
        raise ApiError(f"stream_options must be an object like {{\"include_usage\": true}}; it may hold "
                       f"{', '.join(STREAM_OPTIONS)}, got {json.dumps(options, default=repr)[:80]}",
                       param="stream_options")  # fmt: skip
    for name in STREAM_OPTIONS:
        if options.get(name) is not None and not isinstance(options[name], bool):
            raise ApiError(f"stream_options.{name} must be true or false, got {options[name]!r}",
                           param="stream_options")  # fmt: skip
    return options


def common_fields(body: dict, model: str, prompt: str | list[int], chat: bool, logprobs: int | None,
                  preamble: str | None = None, least_tokens: int = 1) -> Ask:  # fmt: skip
    """The Ask: the endpoint's prompt (openai_prompts.py) with the fields both endpoints share, each checked."""
    if not isinstance(body.get("model", model), str):
        raise ApiError(f"model must be a string, e.g. {model!r}", param="model")
    if body.get("model", model) != model:
        raise ApiError(f"the model {body['model']!r} does not exist here; this server serves {model!r} "
                       "(GET /v1/models lists it)", status=404, param="model", code="model_not_found")  # fmt: skip
    if isinstance(prompt, str) and not prompt.strip():
        raise ApiError("the prompt is empty; ask e.g. 'count down from 12' or 'spell 4096'", param="prompt")
    name = "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens"
    what = "of at least 0 (0: echo scores the prompt, nothing more)" if least_tokens == 0 else "of at least 1"
    max_tokens = whole(body, name, least_tokens, float("inf"), what)
    options = _stream_options(body)
    for name in ("user", "service_tier"):
        if not isinstance(body.get(name, ""), str):
            raise ApiError(f"{name} must be a string", param=name)
    include_usage = bool(options.get("include_usage"))
    return Ask(prompt, preamble, max_tokens, flag(body, "stream"), include_usage, flag(body, "ignore_eos"),
               flag(body, "return_token_ids"), chat, _sampling(body, logprobs), _stop(body),
               continuous_usage=include_usage and bool(options.get("continuous_usage_stats")),
               priority=priority_of(body), n=whole(body, "n", 1, MAX_REPLIES, f"from 1 to {MAX_REPLIES}") or 1,
               )  # fmt: skip
