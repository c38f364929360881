"""echo (completions): the prompt put back before the reply, and with logprobs the prompt's own log-probabilities.

Those come first in every column, the first token's logprob null (nothing came before it), as OpenAI and vLLM send
them: one plain forward over the prompt, asked of the engine between two steps (openai_output.prompt_logprobs: a
prefill with no sampling and no KV kept). With max_tokens 0 only the prompt is scored (lm-eval's loglikelihood):
no request goes to the engine, the reply is the echo alone. A reply that ends with EOS shows it, with its logprob,
as vLLM does: lm-eval drops the last token of what it gets back.
"""

from __future__ import annotations

import asyncio
import functools

from minillm.serving.openai_output import DONE, chunk, echo_of, prompt_logprobs, usage
from minillm.serving.openai_protocol import ApiError, Ask
from minillm.serving.serve_loop import LoopHandle


async def echoes_of(loop: LoopHandle, ask: Ask, requests: list) -> tuple[list[tuple[str, list]], list]:
    """echo: each prompt's text and, with logprobs, its own log-probabilities: one plain forward over it, asked
    of the engine between two steps (a prefill with no sampling and no KV kept). No echo: nothing to put first.
    Also each prompt's scores (prompt_logprobs), or None."""
    scores = [None] * len(requests)
    if not ask.echo:
        return [("", [])] * len(requests), scores
    if ask.sampling.logprobs is not None:
        scores = await asyncio.gather(*(score(loop, r.prompt_ids, ask.sampling.logprobs) for r in requests))
    return [echo_of(r.prompt_ids, s) for r, s in zip(requests, scores)], scores


async def score(loop: LoopHandle, ids: list[int], top: int) -> list:
    """prompt_logprobs(ids), asked of the engine."""
    try:
        return await asyncio.wrap_future(loop.ask(functools.partial(prompt_logprobs, ids, top)))
    except Exception as e:  # noqa: BLE001 (the engine could not score it: one line, never a 500)
        status = 400 if loop.alive else 503  # (--tp > 1 cannot; a stopped engine could not answer)
        raise ApiError(f"echo with logprobs could not be served: {e}", status=status, param="echo") from None


def eos_row(loop: LoopHandle, ask: Ask, request, scores: list | None):
    """echo with logprobs: a reply that ends with EOS shows it (as vLLM does), with its logprob: lm-eval drops
    the last token of what it gets back. None: nothing to add."""
    if scores is None:
        return None

    async def row(made: list[int]) -> tuple:
        return scores[-1] if not made else (await score(loop, [*request.prompt_ids, *made], ask.sampling.logprobs))[-1]

    return row


async def echo_only(ask: Ask, model: str, requests: list, echoes: list, prompt_tokens: int):
    """A stream of echoed prompts and nothing more (max_tokens 0)."""
    counts = usage(prompt_tokens, 0)
    for i, (text, rows) in enumerate(echoes):
        yield chunk(ask, requests[0].id, model, text, "length", index=i, echo=rows,
                    counts=counts if ask.continuous_usage else None)  # fmt: skip
    if ask.include_usage:
        yield chunk(ask, requests[0].id, model, None, counts=counts)
    yield DONE
