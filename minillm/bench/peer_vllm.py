"""The vLLM side of `bench --only peer` (peer.py), run by vLLM's own Python: it imports nothing of minillm.

    VLLM_PYTHON peer_vllm.py EXPORT REQUESTS.json SEATS eager|compiled

REQUESTS.json: [[prompt token ids, max new tokens], ...]. Builds vLLM's offline engine on the export (one process,
one thread, fp32 as minillm) and serves the requests once untimed (its compile, its caches); prints one JSON line (its
version, the start-up seconds). Then each line "serve" on stdin serves them again, timed, through its engine loop one
step at a time (add every request, step until none is unfinished), as minillm's run does, and prints one JSON line:
the seconds, steps and CPU seconds, and the replies' token ids (EOS kept); "profile" serves them once more under
torch's profiler and prints each op's own CPU seconds. So the bench can take turns between the two
engines without starting vLLM again. It ends at the end of its input.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time

# one thread, no pinning, 1 GiB of KV: the setting minillm runs in (facts from issue 47's install notes); the offline
# engine also in one process (ONE_PROCESS), as minillm's run. Set in main(), so that importing this file (peer.py
# does, for cpu_s and timed) changes nothing.
VLLM_ENV = {"OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0"}
ONE_PROCESS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def timed(module, spent: dict, key: str) -> list:
    """Hooks that add the seconds each call of the module takes to spent[key] (removed by the caller)."""
    started: list[float] = []

    def done(*_) -> None:
        spent[key] += time.perf_counter() - started.pop()

    return [module.register_forward_pre_hook(lambda *_: started.append(time.perf_counter())),
            module.register_forward_hook(done)]  # fmt: skip


def serve(engine, requests, params_for) -> dict:
    """Every request at once, then the engine's steps until all are done. The step is split as minillm's is: the
    model's forward (hooks on vLLM's model and its logits' projection, as minillm's forward ends in its head), the
    pick (its sampler) and the rest."""
    from vllm.inputs import TokensPrompt

    runner = engine.model_executor.driver_worker.worker.model_runner  # (one process: the uni executor)
    spent = {"forward_s": 0.0, "pick_s": 0.0}
    hooks = timed(runner.model, spent, "forward_s") + timed(runner.model.logits_processor, spent, "forward_s")
    hooks += timed(runner.sampler, spent, "pick_s")
    began, cpu_began = time.perf_counter(), cpu_s()
    for i, (ids, max_new) in enumerate(requests):
        engine.add_request(str(i), TokensPrompt(prompt_token_ids=ids), params_for(max_new))
    replies, steps = {}, 0
    try:
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    replies[int(out.request_id)] = list(out.outputs[0].token_ids)
            steps += 1
    finally:
        for hook in hooks:
            hook.remove()
    seconds = time.perf_counter() - began
    return {"seconds": seconds, "cpu_s": cpu_s() - cpu_began, "steps": steps,
            "replies": [replies[i] for i in range(len(requests))],
            "split": spent | {"rest_s": seconds - spent["forward_s"] - spent["pick_s"]}}  # fmt: skip


def profiled(engine, requests, params_for) -> dict:
    """One more run under torch's profiler: each op's own CPU seconds, by name (peer_profile.py sorts them)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run = serve(engine, requests, params_for)
    ops = {e.key: e.self_cpu_time_total / 1e6 for e in prof.key_averages() if e.self_cpu_time_total > 0}
    return {"seconds": run["seconds"], "steps": run["steps"], "ops": ops}


def main() -> None:
    for name, value in (VLLM_ENV | ONE_PROCESS).items():
        os.environ.setdefault(name, value)
    export, requests_file, seats, mode = sys.argv[1:5]
    import torch
    import vllm
    from vllm import LLM, SamplingParams

    torch.set_num_threads(1)
    with open(requests_file) as f:
        requests = json.load(f)
    began = time.perf_counter()
    llm = LLM(model=export, dtype="float32", max_model_len=1024, max_num_seqs=int(seats),
              distributed_executor_backend="uni", enforce_eager=mode == "eager", seed=0)  # fmt: skip
    start_s = time.perf_counter() - began
    params_for = lambda max_new: SamplingParams(temperature=0.0, max_tokens=max_new)  # greedy, EOS honoured
    serve(llm.llm_engine, requests, params_for)  # untimed: the first pass pays for what is built once
    print(json.dumps({"version": vllm.__version__, "mode": mode, "start_s": start_s}), flush=True)
    for line in sys.stdin:
        asked = {"serve": serve, "profile": profiled}.get(line.strip())
        if asked:
            print(json.dumps(asked(llm.llm_engine, requests, params_for)), flush=True)


if __name__ == "__main__":  # (vLLM's engine start-up needs the guard)
    main()
