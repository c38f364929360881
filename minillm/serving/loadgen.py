"""A load generator: a workload's users sent to any OpenAI-compatible server, timed from the client's side.

Each user is a streamed request sent at its arrival time (Poisson arrivals in wall time, or all at
once); every chunk of text is timed as it arrives. From those times, per request:

    TTFT      send -> the first chunk with text      (queueing + prefill + HTTP + streaming)
    ITL       the gaps between chunks with text
    TPOT      (latency - TTFT) / (output tokens - 1)  (as vLLM's benchmark_serving computes it)
    latency   send -> the end of the stream

and for the run: output tokens/s over the wall time, and goodput: the requests that met both a TTFT
and a TPOT target (what a user would call "fast enough"), per second. The names are those of
`python -m minillm run --json` (ttft_p50_s, itl_p99_s, tokens_per_s, ...) so the two can be compared.
The mixed crowd's users carry their class's priority (runs/classes.py: chat users before batch jobs), sent as
vLLM's `priority` field, and the summary gives each class's TTFT (`by_class`). A job may ask for n replies
(OpenAI's `n`): the choices stream interleaved, each chunk naming its choice's index; all are read and counted
(ITL: the gaps within a choice; TPOT: by a choice's tokens, on average).

Output tokens are counted the same way whatever the server: the reply's text, tokenized by the served model's
tokenizer (`tokenizer`: "minillm", the default, is minillm's byte-level one, which its export carries, so
minillm's server and transformers' or vLLM's serving the export count alike; a tokenizer.json, or a folder
holding one, for another model, read with the `tokenizers` package). Servers' own `usage` differs: some count
the end-of-sequence token that ends a reply (transformers' server does), some do not (minillm), so comparing
their figures would compare their bookkeeping. tokenizer="usage" trusts it anyway (one token per chunk when a
server sends none). Nothing here is specific to minillm: point it at vLLM or SGLang and it measures them.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from minillm.errors import ConfigError
from minillm.model.tokenizer import SEP, decode
from minillm.runs.classes import services
from minillm.runs.metrics import percentiles
from minillm.runs.workload import ChatKnobs, make_workload

LOAD_WORKLOADS = ("chat", "system-prompt", "long-prompts", "mixed")  # the crowds with arrivals per second


@dataclass
class Job:
    """One user: what they send and when."""

    prompt: str
    max_tokens: int
    send_at_s: float = 0.0
    preamble: str | None = None  # sent as the system message
    ignore_eos: bool = False  # run to exactly max_tokens (vLLM and minillm accept this extension)
    hang_up_after: int | None = None  # close the connection after this many chunks with text
    priority: int | None = None  # sent as vLLM's "priority" (lower first) when set; None: not sent (the server's 0)
    cls: str | None = None  # its class (the mixed crowd's chat or batch), for the summary's per-class TTFT
    n: int = 1  # replies to the prompt (OpenAI's n): as many choices, streamed by index


@dataclass
class Outcome:
    job: Job
    sent_s: float = 0.0  # since the run began
    chunk_s: list[float] = field(default_factory=list)  # arrival of each chunk with text, since the run began
    chunk_index: list[int] = field(default_factory=list)  # each chunk's choice (empty: all choice 0)
    end_s: float | None = None
    text: str = ""  # (choice 0's)
    texts: list[str] = field(default_factory=list)  # every choice's text, by index
    token_ids: list[int] = field(default_factory=list)  # choice 0's, when the server sends them (return_token_ids)
    output_tokens: int = 0
    finish_reason: str | None = None
    response_id: str | None = None  # the server's id for it (minillm's: "cmpl-r17" for request r17)
    error: str | None = None
    hung_up: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and not self.hung_up and self.end_s is not None

    def gaps(self) -> list[float]:
        """The gaps between chunks with text of one choice (ITL), every choice's."""
        index = self.chunk_index or [0] * len(self.chunk_s)
        times = [[t for t, j in zip(self.chunk_s, index) if j == i] for i in sorted(set(index))]
        return [b - a for ts in times for a, b in zip(ts, ts[1:])]


def split_prompt(ids: list[int]) -> tuple[str | None, str]:
    """A workload's prompt ids back into (system message, user message): <bos> [preamble <sep>] prompt <sep>."""
    seps = [i for i, t in enumerate(ids) if t == SEP]
    if len(seps) >= 2:
        return decode(ids[1 : seps[0]]), decode(ids[seps[0] + 1 : seps[-1]])
    return None, decode(ids[1:-1])


def jobs_from_workload(name: str, requests: int, rate_per_s: float | None = None, seed: int = 0,
                       force_lengths: bool = False, hang_up: float = 0.0, n: int = 1) -> list[Job]:  # fmt: skip
    """The same users `python -m minillm run --workload NAME --rate-per-s R --seed S` serves offline.

    rate_per_s None: everyone at once. hang_up: the share of users who close the connection after a
    random number of chunks (0 to 8). n: replies each user asks for (`run --n`)."""
    if name not in LOAD_WORKLOADS:
        raise ConfigError(f"load sends the workloads {', '.join(LOAD_WORKLOADS)} (text prompts, arrivals per "
                          f"second); {name!r} is not one of them")  # fmt: skip
    if not 0 <= hang_up <= 1:
        raise ConfigError(f"hang_up is a share of the users, in [0, 1]; got {hang_up}")
    knobs = ChatKnobs(requests=requests, rate_per_s=rate_per_s or 1.0, force_lengths=force_lengths)
    rng, jobs = random.Random(seed + 7), []
    users = make_workload(name, knobs, seed)
    promised = services(users) if name == "mixed" else {}  # (each user's class and priority, as `run` gives them)
    for r in users:
        preamble, prompt = split_prompt(r.prompt_ids)
        hang = rng.randint(0, 8) if rng.random() < hang_up else None
        job = Job(prompt, r.max_new_tokens, r.arrival_s if rate_per_s else 0.0, preamble, r.ignore_eos, hang, n=n)
        if r.id in promised:
            job.priority, job.cls = promised[r.id].priority, promised[r.id].cls
        jobs.append(job)
    return jobs


def request_body(job: Job, model: str, api: str) -> dict:
    body = {"model": model, "max_tokens": job.max_tokens, "stream": True, "stream_options": {"include_usage": True},
            "temperature": 0.0}  # fmt: skip
    if api == "chat":
        messages = [{"role": "system", "content": job.preamble}] if job.preamble else []
        body["messages"] = messages + [{"role": "user", "content": job.prompt}]
    elif job.preamble:
        raise ConfigError("this workload has system prompts, which only the chat API can send: use --api chat")
    else:
        body["prompt"] = job.prompt
    if job.ignore_eos:
        body["ignore_eos"] = True
    if job.priority is not None:
        body["priority"] = job.priority
    if job.n != 1:
        body["n"] = job.n
    return body


def token_counter(tokenizer: str = "minillm") -> Callable[[list[str], dict | None, int], int]:
    """How replies' output tokens are counted: count(each choice's text, usage or None, chunks with text) (the
    module's notes)."""
    if tokenizer == "minillm":
        return lambda texts, usage, chunks: sum(len(text.encode("utf-8")) for text in texts)  # one token per byte
    if tokenizer == "usage":
        return lambda texts, usage, chunks: usage["completion_tokens"] if usage else chunks
    path = Path(tokenizer)
    path = path / "tokenizer.json" if path.is_dir() else path
    try:
        from tokenizers import Tokenizer

        other = Tokenizer.from_file(str(path))
    except ImportError:
        raise ConfigError(
            "counting with a tokenizer.json needs the `tokenizers` package (pip install tokenizers)"
        ) from None
    except Exception as e:  # noqa: BLE001 (the library's errors are of its own kinds)
        raise ConfigError(f"cannot read the tokenizer {path} ({e}); give a tokenizer.json, its folder, "
                          "'minillm' or 'usage'") from None  # fmt: skip
    return lambda texts, usage, chunks: sum(len(other.encode(t, add_special_tokens=False).ids) for t in texts)


async def send(client: httpx.AsyncClient, url: str, body: dict, out: Outcome, t0: float,
               count: Callable[[list[str], dict | None, int], int]) -> None:  # fmt: skip
    """One streamed request; fills `out` as the chunks come; count: how its output tokens are counted."""
    endpoint = f"{url}/chat/completions" if "messages" in body else f"{url}/completions"
    out.sent_s = time.perf_counter() - t0
    async with client.stream("POST", endpoint, json=body) as response:
        if response.status_code != 200:
            await response.aread()
            out.error = f"HTTP {response.status_code}: {response.text[:300]}"
            return
        pieces, usage = {}, None  # choice index -> its text's pieces
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            message = json.loads(data)
            if "error" in message:
                out.error = str(message["error"])
                return
            out.response_id = message.get("id", out.response_id)
            usage = message.get("usage") or usage
            for choice in message.get("choices") or []:
                text = choice.get("text") if "text" in choice else (choice.get("delta") or {}).get("content")
                index = choice.get("index", 0)
                if text:
                    out.chunk_s.append(time.perf_counter() - t0)
                    out.chunk_index.append(index)
                pieces.setdefault(index, []).append(text or "")
                out.token_ids += (choice.get("token_ids") or []) if index == 0 else []
                out.finish_reason = choice.get("finish_reason") or out.finish_reason
            if out.job.hang_up_after is not None and len(out.chunk_s) >= out.job.hang_up_after:
                out.hung_up = True  # leaving the `async with` closes the connection mid-stream
                return
        out.end_s = time.perf_counter() - t0
        out.texts = ["".join(pieces[i]) for i in sorted(pieces)]
        out.text = "".join(pieces.get(0, []))
        out.output_tokens = count(out.texts, usage, len(out.chunk_s))


async def run_jobs(url: str, jobs: list[Job], model: str | None = None, api: str = "chat",
                   max_concurrency: int | None = None, timeout_s: float = 600.0,
                   extra_body: dict | None = None, tokenizer: str = "minillm",
                   api_key: str | None = None) -> list[Outcome]:  # fmt: skip
    """Send every job at its time (waiting for a free client first, with max_concurrency); one Outcome each.
    extra_body: more fields for every request (e.g. {"return_token_ids": True}, which minillm and vLLM know).
    tokenizer: how output tokens are counted (token_counter). api_key: sent as `Authorization: Bearer` (serve's)."""
    count = token_counter(tokenizer)
    if api not in ("chat", "completions"):
        raise ConfigError(f"api must be 'chat' or 'completions', got {api!r}")
    url = url.rstrip("/")
    limits = httpx.Limits(max_connections=max_concurrency or len(jobs), max_keepalive_connections=max_concurrency)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    timeout = httpx.Timeout(timeout_s, connect=30.0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout, headers=headers) as client:
        model = model or await served_model(client, url)
        gate = asyncio.Semaphore(max_concurrency or len(jobs))
        outcomes = [Outcome(job) for job in jobs]
        bodies = [request_body(job, model, api) | (extra_body or {}) for job in jobs]
        t0 = time.perf_counter()

        async def user(body: dict, out: Outcome) -> None:
            await asyncio.sleep(max(0.0, out.job.send_at_s - (time.perf_counter() - t0)))
            async with gate:
                try:
                    await send(client, url, body, out, t0, count)
                except (httpx.HTTPError, json.JSONDecodeError) as e:
                    out.error = f"{type(e).__name__}: {e}"

        await asyncio.gather(*(user(b, o) for b, o in zip(bodies, outcomes)))
    return outcomes


async def served_model(client: httpx.AsyncClient, url: str) -> str:
    """The first model the server lists (GET /v1/models), as vLLM's benchmark does when none is named."""
    try:
        response = await client.get(f"{url}/models")
        if response.status_code == 401:
            raise ConfigError(f"{url} asks for an API key (401): give it with --api-key or MINILLM_API_KEY")
        return response.json()["data"][0]["id"]
    except (httpx.HTTPError, ValueError, KeyError, IndexError) as e:
        raise ConfigError(f"could not ask {url}/models which model it serves ({e}); is a server running "
                          "there? (python -m minillm serve), or name the model with --model") from None  # fmt: skip


def summarize_load(outcomes: list[Outcome], ttft_target_s: float = 1.0, tpot_target_s: float = 0.1) -> dict:
    """The client's figures, named as metrics.summarize names the server's."""
    done = [o for o in outcomes if o.ok]
    began = min((o.sent_s for o in outcomes), default=0.0)
    wall = max((o.end_s for o in done), default=began) - began
    ttft = {id(o): o.chunk_s[0] - o.sent_s for o in done if o.chunk_s}
    per = lambda o: o.output_tokens / o.job.n  # (a choice's tokens, on average: the n decode side by side)
    tpot = {id(o): (o.end_s - o.chunk_s[0]) / (per(o) - 1) for o in done if o.chunk_s and per(o) > 1}
    itl = [gap for o in done for gap in o.gaps()]
    good = [o for o in done if id(o) in ttft and ttft[id(o)] <= ttft_target_s and tpot.get(id(o), 0) <= tpot_target_s]
    tokens = sum(o.output_tokens for o in done)
    summary = {
        "requests": len(outcomes),
        "finished": len(done),
        "replies": sum(len(o.texts) for o in done),  # every choice of the requests finished (n each)
        "aborted": sum(o.hung_up for o in outcomes),  # hung up on purpose (--hang-up)
        "errors": sum(o.error is not None for o in outcomes),
        "output_tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall if wall > 0 else 0.0,
        "requests_per_s": len(done) / wall if wall > 0 else 0.0,
        "ttft_target_s": ttft_target_s,
        "tpot_target_s": tpot_target_s,
        "goodput_requests": len(good),
        "goodput_per_s": len(good) / wall if wall > 0 else 0.0,
        "goodput_share": len(good) / len(done) if done else 0.0,
    }
    figures = {"ttft": list(ttft.values()), "tpot": list(tpot.values()), "itl": itl,
               "latency": [o.end_s - o.sent_s for o in done]}  # fmt: skip
    for name, values in figures.items():
        summary |= {f"{name}_{k}_s": v for k, v in percentiles(values).items()}
    if any(o.job.cls is not None for o in outcomes):
        summary["by_class"] = ttft_by_class(outcomes, done, ttft)
    first_error = next((o.error for o in outcomes if o.error), None)
    return summary | ({"first_error": first_error} if first_error else {})


def ttft_by_class(outcomes: list[Outcome], done: list[Outcome], ttft: dict[int, float]) -> dict[str, dict]:
    """Each class (Job.cls) -> its requests, how many finished, and their TTFT percentiles: who went first."""
    by_class = {}
    for cls in sorted({o.job.cls for o in outcomes if o.job.cls is not None}):
        waits = [ttft[id(o)] for o in done if o.job.cls == cls and id(o) in ttft]
        counts = {"requests": sum(o.job.cls == cls for o in outcomes), "finished": sum(o.job.cls == cls for o in done)}
        by_class[cls] = counts | {f"ttft_{k}_s": v for k, v in percentiles(waits).items()}
    return by_class
