"""Benchmark of the HTTP server: what serving over HTTP costs, against the same engine offline.

The server runs as `python -m minillm serve` (its engine in a process of its own) and the load generator in
this process, as in a workshop. Two figures, with their goals:

  throughput   a chat crowd, everyone sent at once: output tokens/s the client counts, over the tokens/s the
               same engine reaches offline (`run`) on the same users: at least 0.95. The same crowd through
               `serve --engine thread` (the engine on a thread of the HTTP process, one interpreter lock for
               both) is measured beside it: what taking the engine off the HTTP side's lock gives
  TTFT added   one user at a time: the client's time to first token minus the engine's own (arrival to
               first token, from the server's /trace): the HTTP request, the hand-over to the engine
               and the first chunk's way back: at most 3 ms at the median

A second entry, `transformers_server`, serves minillm's export with transformers' own server (`transformers serve
--continuous-batching`, on this machine's CPU) and sends the same users to it and to minillm's: the same replies,
counted the same way (loadgen.py), and each server's pace. It needs `transformers[serving]` (not a minillm
dependency) and records why where it cannot start.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

from minillm.model.transformer import Transformer
from minillm.runs.workload import ChatKnobs

SLOTS = 8  # `serve`'s and `run`'s default seats
RATIO_GOAL, TTFT_ADDED_GOAL_S = 0.95, 0.003


def answering(server: subprocess.Popen, url: str, within_s: float, what: str) -> subprocess.Popen:
    """`server` (started with stderr=PIPE) once `url` answers 200; a RuntimeError that says why when it exits first
    (the last line it wrote) or stays silent."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            why = server.stderr.read().strip().splitlines()
            raise RuntimeError(f"{what} cannot start here: {why[-1] if why else server.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            time.sleep(0.2)
    server.kill()
    raise RuntimeError(f"{what} did not answer {url} within {within_s:.0f} s")


def start_server(
    port: int, engine: str = "process", slots: int = SLOTS, flags: tuple[str, ...] = ()
) -> subprocess.Popen:
    """`python -m minillm serve` on the shipped model (with more of serve's flags), once it answers /health."""
    command = [sys.executable, "-m", "minillm", "serve", "--port", str(port), "--slots", str(slots), "--engine", engine,
               *flags]  # fmt: skip
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              env=os.environ | {"PYTHONUNBUFFERED": "1"})  # fmt: skip
    return answering(server, f"http://127.0.0.1:{port}/health", 120, "the server")


def start_transformers_serve(folder, port: int, continuous_batching: bool = True) -> subprocess.Popen:
    """`transformers serve FOLDER` on the CPU, once it answers /v1/models; a RuntimeError that says why it cannot."""
    try:
        import transformers  # noqa: F401 (only: is it there?)
    except ImportError:
        raise RuntimeError("transformers is not installed (it is no minillm dependency)") from None
    command = [sys.executable, "-m", "transformers.cli.transformers", "serve", str(folder), "--port", str(port),
               "--device", "cpu", "--log-level", "error"] + ["--continuous-batching"] * continuous_batching  # fmt: skip
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return answering(server, f"http://127.0.0.1:{port}/v1/models", 180, "transformers serve")


def free_port() -> int:
    from minillm.serving.server import bind

    sock = bind(port=0)
    port = sock.getsockname()[1]
    sock.close()
    return port


def bench_server(model: Transformer, s) -> dict:
    from minillm.bench.common import serve
    from minillm.runs import trace_file
    from minillm.runs.metrics import summarize
    from minillm.serving.loadgen import jobs_from_workload, run_jobs, summarize_load

    requests, singles, rounds = (64, 10, 1) if s.quick else (200, 30, 3)
    knobs = ChatKnobs(requests=requests, rate=1000, force_lengths=True)  # everyone queued at step 0
    jobs = jobs_from_workload("chat", requests, None, seed=0, force_lengths=True)  # the same users
    ports = {"process": free_port(), "thread": free_port()}
    servers = {engine: start_server(port, engine) for engine, port in ports.items()}
    url = f"http://127.0.0.1:{ports['process']}/v1"
    try:
        rows = []  # (offline, through the server, through the thread server, finished), in turn: noise hits all
        for _ in range(rounds):
            offline = serve(model, "chat", "continuous", "paged", SLOTS, knobs)[0]
            crowd = summarize_load(asyncio.run(run_jobs(url, jobs)))
            threaded = summarize_load(asyncio.run(run_jobs(f"http://127.0.0.1:{ports['thread']}/v1", jobs)))
            rows.append((offline["tokens_per_s"], crowd["tokens_per_s"], threaded["tokens_per_s"],
                         min(crowd["finished"], threaded["finished"])))  # fmt: skip
        one_by_one = jobs_from_workload("chat", singles, None, seed=1, force_lengths=True)
        steps_before = httpx.get(f"http://127.0.0.1:{ports['process']}/health").json()["steps"]
        alone = summarize_load(asyncio.run(run_jobs(url, one_by_one, max_concurrency=1)))
        trace = httpx.get(f"http://127.0.0.1:{ports['process']}/trace", params={"since_step": steps_before}, timeout=60)
        engine = summarize(trace_file.from_dict(trace.json()))
    finally:
        for server in servers.values():
            server.terminate()
            server.wait(30)
    ratios = [served / offline for offline, served, *_ in rows]
    ratio, thread_ratio = statistics.median(ratios), statistics.median(r[2] / r[0] for r in rows)
    added = alone["ttft_p50_s"] - engine["ttft_p50_s"]
    finished = min(r[3] for r in rows)
    met = ratio >= RATIO_GOAL and added <= TTFT_ADDED_GOAL_S and finished == requests
    return {"requests": requests, "finished": finished, "ratios": ratios,
            "server_tokens_per_s": statistics.median(r[1] for r in rows),
            "thread_server_tokens_per_s": statistics.median(r[2] for r in rows), "thread_ratio": thread_ratio,
            "offline_tokens_per_s": statistics.median(r[0] for r in rows), "ratio": ratio, "goal": RATIO_GOAL,
            "singles": singles, "client_ttft_p50_s": alone["ttft_p50_s"], "engine_ttft_p50_s": engine["ttft_p50_s"],
            "ttft_added_p50_s": added, "ttft_added_goal_s": TTFT_ADDED_GOAL_S, "met": met}  # fmt: skip


def markdown(r: dict) -> list[str]:
    from minillm.bench.report_scheduling import verdict

    rounds = ", ".join(f"{x:.2f}" for x in r["ratios"])
    return ["## 14. The engine behind an HTTP server", "",
            f"`python -m minillm serve` ({SLOTS} seats; its engine in a process of its own, beside the HTTP one), "
            f"the load generator in the bench's process: {r['requests']} `chat` users sent at once, in "
            f"{len(r['ratios'])} rounds (the same users offline, through the server, and through `serve --engine "
            f"thread`; at least {r['finished']} finished in each). Medians: the client counted "
            f"{r['server_tokens_per_s']:.0f} output tokens/s; the same engine offline (`run`) "
            f"{r['offline_tokens_per_s']:.0f}. Ratio {r['ratio']:.2f} (rounds: {rounds}), goal at least {r['goal']}. "
            f"With the engine on a thread of the HTTP process instead, under one interpreter lock: "
            f"{r['thread_server_tokens_per_s']:.0f} tokens/s, ratio {r['thread_ratio']:.2f}.", "",
            f"One user at a time ({r['singles']} of them): time to first token p50 {1e3 * r['client_ttft_p50_s']:.1f} "
            f"ms at the client, {1e3 * r['engine_ttft_p50_s']:.1f} ms inside the engine (arrival to first token): "
            f"HTTP, the hand-over to the engine and streaming add {1e3 * r['ttft_added_p50_s']:.1f} ms (goal at most "
            f"{1e3 * r['ttft_added_goal_s']:.0f} ms). Both goals: {verdict(r['met'])}.", ""]  # fmt: skip


def bench_transformers_server(model: Transformer, s) -> dict:
    """The same chat users sent by `load` to minillm's server and to transformers' serving minillm's export."""
    from minillm.serving.export import export_llama
    from minillm.serving.loadgen import jobs_from_workload, run_jobs, summarize_load

    requests = 8 if s.quick else 24
    jobs = jobs_from_workload("chat", requests, None, seed=2)  # everyone at once, each reply at its own length
    outcomes = {}
    with tempfile.TemporaryDirectory() as folder:
        export_llama(model, folder)
        port = free_port()
        try:
            theirs = start_transformers_serve(folder, port)
        except RuntimeError as e:
            return {"requests": requests, "skipped": str(e)}
        try:
            outcomes["transformers"] = asyncio.run(run_jobs(f"http://127.0.0.1:{port}/v1", jobs, model=folder))
        finally:
            theirs.terminate()
            theirs.wait(30)
    port = free_port()
    ours = start_server(port)
    try:
        outcomes["minillm"] = asyncio.run(run_jobs(f"http://127.0.0.1:{port}/v1", jobs))
    finally:
        ours.terminate()
        ours.wait(30)
    same = sum(a.text == b.text for a, b in zip(outcomes["minillm"], outcomes["transformers"]))
    return {"requests": requests, "same_text": same} | {name: summarize_load(o) for name, o in outcomes.items()}


def markdown_transformers(r: dict) -> list[str]:
    if "skipped" in r:
        return [f"`load` against transformers' own server on minillm's export: not measured here ({r['skipped']}).", ""]
    row = lambda name: (f"| {name} | {r[name]['finished']} | {r[name]['output_tokens']} | "
                        f"{r[name]['tokens_per_s']:.0f} | {1e3 * r[name]['ttft_p50_s']:.0f} |")  # fmt: skip
    return [f"The same {r['requests']} `chat` users (sent at once, natural reply lengths) through `load` to "
            "`python -m minillm serve` and to `transformers serve --continuous-batching` serving minillm's "
            f"export (`python -m minillm export`) on this machine's CPU: {r['same_text']} of {r['requests']} "
            "replies the same text; output tokens counted from the text by both (usage would differ: transformers' "
            "counts the end token).", "",
            "| server | finished | output tokens | tokens/s | TTFT p50 (ms) |", "|---|---:|---:|---:|---:|",
            row("minillm"), row("transformers"), ""]  # fmt: skip
