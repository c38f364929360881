"""The OpenAI API's prompts: each endpoint's body read, its prompt in every shape OpenAI allows, the engine request.

  POST /v1/completions        {"model", "prompt": "spell 42", "max_tokens", "stream", ...}: the prompt as raw text,
                              or as OpenAI allows: ["spell 1", "spell 2"], [257, 115, ...], [[257, 115], [257, 99]]
  POST /v1/chat/completions   {"model", "messages": [{"role": "system" | "user" | ..., "content"}], ...}

Chat maps onto the tiny model's prompt format (tokenizer.encode_prompt): the system message becomes
the preamble, the last user message the prompt; earlier turns are dropped (the model has no memory
of a conversation, and it knows only its two tasks: "count down from N" and "spell N"). Completions
send the prompt as it is, after <bos> (as vLLM does): the chat format is the chat endpoint's business. A prompt
sent as token ids goes to the model exactly as sent (no <bos> added, as vLLM does). Several prompts in one request
are several engine requests, their replies the choices (index: the prompt's position), streamed side by side.
Completions' echo may come with max_tokens 0: only the prompt is scored (openai_echo.py).

The fields both endpoints share (sampling, stop, stream_options, ...) are read and checked by openai_protocol.py.
"""

from __future__ import annotations

from minillm.engine.request import Request
from minillm.model.tokenizer import BOS, VOCAB_SIZE, decode, encode, encode_prompt
from minillm.serving.openai_protocol import ApiError, Ask, check_fields, common_fields, flag, utf8, whole

MAX_TOP_LOGPROBS = 20  # chat's top_logprobs (OpenAI's range: 0-20)
MAX_LEGACY_LOGPROBS = 5  # completions' logprobs (OpenAI's legacy range: 0-5)
MAX_PROMPTS = 128  # prompts in one /v1/completions request: each is an engine request of its own


def _token(t) -> bool:
    return isinstance(t, int) and not isinstance(t, bool)


def token_ids(ids: list) -> list[int]:
    """A prompt sent as token ids: each must be one of the vocabulary's, or a 400 naming the range."""
    bad = next((t for t in ids if not 0 <= t < VOCAB_SIZE), None)
    if bad is not None:
        raise ApiError(f"prompt token ids must lie in [0, {VOCAB_SIZE - 1}] (the vocabulary's {VOCAB_SIZE} tokens), "
                       f"got {bad}", param="prompt")  # fmt: skip
    return list(ids)


def prompts_of(prompt) -> list[str | list[int]]:
    """The prompts of a completions request, as OpenAI takes them: a string, an array of strings, an array of
    token ids, or an array of arrays of token ids."""
    shapes = ('prompt must be a string, an array of strings, an array of token ids or an array of arrays of token '
              'ids, e.g. "count down from 12"')  # fmt: skip
    if isinstance(prompt, str):
        return [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise ApiError(shapes, param="prompt")
    if all(_token(t) for t in prompt):
        return [token_ids(prompt)]
    if len(prompt) > MAX_PROMPTS:
        raise ApiError(f"prompt holds {len(prompt)} prompts; at most {MAX_PROMPTS} in one request", param="prompt")
    if all(isinstance(p, str) for p in prompt):
        return list(prompt)
    if all(isinstance(p, list) and p and all(_token(t) for t in p) for p in prompt):
        return [token_ids(p) for p in prompt]
    raise ApiError(shapes, param="prompt")


def parse_completion(body: dict, model: str) -> Ask:
    body = check_fields(body, "completions")
    prompts = prompts_of(body.get("prompt"))
    for p in prompts:
        if isinstance(p, str) and not p.strip():
            raise ApiError("a prompt is empty; ask e.g. 'count down from 12' or 'spell 4096'", param="prompt")
    logprobs = whole(body, "logprobs", 0, MAX_LEGACY_LOGPROBS, f"from 0 to {MAX_LEGACY_LOGPROBS} (OpenAI's range)")
    echo = flag(body, "echo")  # (max_tokens 0 with echo: only the prompt is scored, as lm-eval's loglikelihood)
    ask = common_fields(body, model, prompts[0], chat=False, logprobs=logprobs, least_tokens=0 if echo else 1)
    ask.prompts, ask.echo = prompts if len(prompts) > 1 else None, echo
    return ask


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
    logprobs = flag(body, "logprobs")
    top = whole(body, "top_logprobs", 0, MAX_TOP_LOGPROBS, f"from 0 to {MAX_TOP_LOGPROBS} (OpenAI's range)")
    if top is not None and not logprobs:
        raise ApiError("top_logprobs needs logprobs: true", param="top_logprobs")
    return common_fields(body, model, user, chat=True, logprobs=(top or 0) if logprobs else None, preamble=system)


def to_request(ask: Ask, request_id: str, max_len: int) -> Request:
    """The engine's request: the prompt's length checked before it is tokenized (a huge prompt costs nothing).
    Its constraint, the automaton of ask.pattern, is the app's to add to its sampling
    (openai_structured.constraint_for)."""
    param = "messages" if ask.chat else "prompt"
    as_ids = isinstance(ask.prompt, list)  # token ids: the model's input as sent
    if len(ask.prompt) + len(ask.preamble or "") + (not as_ids) + ask.chat >= max_len:  # a character: >= 1 token
        raise ApiError(f"the prompt is over {max_len} tokens, the model's context: shorten it", param=param)
    if not as_ids:
        utf8(ask.prompt, param)
        utf8(ask.preamble or "", param)
    ids = ask.prompt if as_ids else encode_prompt(ask.prompt, ask.preamble) if ask.chat else [BOS, *encode(ask.prompt)]
    if len(ids) >= max_len:
        raise ApiError(f"the prompt is {len(ids)} tokens but the model's context is {max_len}: shorten it",
                       param=param)  # fmt: skip
    room = max_len - len(ids)  # the most tokens a reply can have: prompt + reply fill the context
    if ask.max_tokens is not None and ask.max_tokens > room:
        raise ApiError(f"the prompt ({len(ids)} tokens) plus max_tokens ({ask.max_tokens}) exceeds the model's context "
                       f"of {max_len} tokens; use max_tokens <= {room}", param="max_tokens")  # fmt: skip
    # by default: until EOS, or the context is full (max_tokens 0, echo's scoring: the request never goes to the engine)
    max_tokens = room if ask.max_tokens is None else max(ask.max_tokens, 1)
    text = decode(ids) if as_ids else ask.prompt
    text = text if not ask.preamble else f"[{len(ask.preamble)}-byte system prompt] {text}"
    return Request(request_id, list(ids), max_tokens, ignore_eos=ask.ignore_eos, prompt=text, sampling=ask.sampling)
