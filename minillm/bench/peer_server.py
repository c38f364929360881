"""`minillm serve` against vLLM's OpenAI server on the same CPU, under the same load (issue 47; part of the peer entry).

The servers serve minillm's export with the same seats, one torch thread in each engine, each in the shape it ships:
minillm's HTTP process with its engine in a process of its own (on a CPU, linears prepacked: layers/prepack.py; and
a second one with --compile), and vLLM's API server with its engine core in a process of its own (torch.compile at
start, its default). All are up at once, idle while another serves. `load`'s client (serving/loadgen.py) sends
them the chat crowd of the peer entry's offline runs, everyone at once, each reply at its drawn length
(`--force-lengths`: the same work on each), in turns, `repeats` rounds each after an untimed one; medians. Output
tokens are counted from the text, the same way for all.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import tempfile

from minillm.bench.peer_vllm import VLLM_ENV
from minillm.bench.server import answering, free_port, start_server
from minillm.model.tokenizer import EOS
from minillm.serving.loadgen import jobs_from_workload, run_jobs, summarize_load

REQUESTS, SEED = 96, 23
FIGURES = ("tokens_per_s", "ttft_p50_s", "tpot_p50_s", "itl_p50_s", "itl_p99_s")
MINILLM = {"minillm": (), "minillm-compiled": ("--compile",)}  # its servers: name -> serve's flags
IDS = {"return_token_ids": True}  # (minillm's server and vLLM's both send each chunk's token ids when asked)


def start_vllm(python: str, export: str, seats: int, port: int) -> subprocess.Popen:
    command = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", export, "--dtype", "float32",
               "--max-model-len", "1024", "--max-num-seqs", str(seats), "--port", str(port)]  # fmt: skip
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              cwd=tempfile.gettempdir(), env=os.environ | VLLM_ENV)  # fmt: skip
    return answering(server, f"http://127.0.0.1:{port}/v1/models", 300, "vLLM's server")


def stop(server: subprocess.Popen) -> None:
    server.terminate()
    try:
        server.wait(30)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def agree(ours: list[int], theirs: list[int]) -> bool:
    """The same tokens up to vLLM's first EOS: with ignore_eos, minillm never picks EOS (the next likeliest token
    instead) while vLLM picks it and goes on, so the replies part there."""
    cut = theirs.index(EOS) if EOS in theirs else len(theirs)
    return len(ours) == len(theirs) and ours[:cut] == theirs[:cut]


def serve_turns(python: str, export: str, seats: int, repeats: int, requests: int = REQUESTS) -> dict:
    """Every server up (minillm's as it starts by default and with --compile, vLLM's), the crowd sent to each in
    turns; each one's medians, its ratio to vLLM's, and how many replies agree with vLLM's token for token."""
    jobs = jobs_from_workload("chat", requests, None, seed=SEED, force_lengths=True)
    servers, urls = [], {}
    try:
        for name, flags in MINILLM.items():
            servers.append(start_server(port := free_port(), slots=seats, flags=flags))
            urls[name] = (f"http://127.0.0.1:{port}/v1", None)
        servers.append(start_vllm(python, export, seats, port := free_port()))
        urls["vllm"] = (f"http://127.0.0.1:{port}/v1", export)
        rounds: dict[str, list] = {name: [] for name in urls}
        for _ in range(repeats + 1):  # (the first round of each is untimed: caches, the first step's compile)
            for name, (url, model) in urls.items():
                rounds[name].append(asyncio.run(run_jobs(url, jobs, model=model, extra_body=IDS)))
    finally:
        for server in servers:
            stop(server)
    out = {"seats": seats, "requests": requests, "repeats": repeats}
    timed = {name: [summarize_load(o) for o in outcomes[1:]] for name, outcomes in rounds.items()}
    for name, runs in timed.items():
        out[name] = {k: statistics.median(s[k] for s in runs) for k in FIGURES} | {
            "errors": sum(s["errors"] for s in runs),
            "same_tokens": sum(agree(a.token_ids, b.token_ids) for a, b in zip(rounds[name][-1], rounds["vllm"][-1])),
        }
    for name in MINILLM:  # each round's ratio, then their median (a drifting machine moves a round's turns together)
        pairs = zip(timed[name], timed["vllm"])
        out[name]["ratio"] = statistics.median(a["tokens_per_s"] / b["tokens_per_s"] for a, b in pairs)
    return out


def markdown(r: dict) -> list[str]:
    row = lambda name, label: (f"| {label} | {r[name]['tokens_per_s']:,.0f} | "
                               + (f"{r[name]['ratio']:.2f}" if name in MINILLM else "") + " | "
                               f"{1e3 * r[name]['ttft_p50_s']:.0f} | {1e3 * r[name]['tpot_p50_s']:.2f} | "
                               f"{1e3 * r[name]['itl_p50_s']:.2f} / {1e3 * r[name]['itl_p99_s']:.2f} | "
                               f"{r[name]['same_tokens']} of {r['requests']} | {r[name]['errors']} |")  # fmt: skip
    return [
        f"Server against server, the same {r['requests']} users through `python -m minillm load --workload chat "
        f"--requests {r['requests']} --seed {SEED} --force-lengths` (everyone at once, each reply at its drawn "
        f"length) to `python -m minillm serve --slots {r['seats']}` (as it starts, and with `--compile`) and to "
        f"vLLM's OpenAI server (`python -m vllm.entrypoints.openai.api_server --max-num-seqs {r['seats']}`, compiled: "
        f"its default) on minillm's export, all up at once and taking turns, {r['repeats']} rounds each after an "
        "untimed one, medians (/ vLLM: the median of each round's ratio). Replies compared token for token with "
        "vLLM's, up to vLLM's first EOS (asked to ignore it, vLLM may still pick it and go on; minillm picks the next "
        "likeliest). Goal: at least 0.9x vLLM's server.",
        "",
        "| server | output tokens/s | / vLLM | TTFT p50 (ms) | TPOT p50 (ms) | ITL p50 / p99 (ms) | same tokens "
        "| errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        *(row(name, f"`minillm serve{' ' if flags else ''}{' '.join(flags)}`") for name, flags in MINILLM.items()),
        row("vllm", "vLLM's server"),
        "",
    ]
