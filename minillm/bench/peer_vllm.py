"""The vLLM side of `bench --only peer` (peer.py), run by vLLM's own Python: it imports nothing of minillm.

    VLLM_PYTHON peer_vllm.py EXPORT REQUESTS.json SEATS eager|compiled

REQUESTS.json: [[prompt token ids, max new tokens], ...]. Builds vLLM's offline engine on the export (one process,
one thread, fp32 as minillm) and serves the requests once untimed (its compile, its caches); prints one JSON line (its
version, the start-up seconds). Then each line "serve" on stdin serves them again, timed, through its engine loop one
step at a time (add every request, step until none is unfinished), as minillm's run does, and prints one JSON line:
the seconds, steps and CPU seconds, and the replies' token ids (EOS kept). So the bench can take turns between the two
engines without starting vLLM again. It ends at the end of its input.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time

# one process, one thread, no pinning: the setting minillm runs in (facts from issue 47's install notes)
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0")
os.environ.setdefault("OMP_NUM_THREADS", "1")


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def serve(engine, requests, params_for) -> dict:
    """Every request at once, then the engine's steps until all are done."""
    from vllm.inputs import TokensPrompt

    began, cpu_began = time.perf_counter(), cpu_s()
    for i, (ids, max_new) in enumerate(requests):
        engine.add_request(str(i), TokensPrompt(prompt_token_ids=ids), params_for(max_new))
    replies, steps = {}, 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                replies[int(out.request_id)] = list(out.outputs[0].token_ids)
        steps += 1
    return {"seconds": time.perf_counter() - began, "cpu_s": cpu_s() - cpu_began, "steps": steps,
            "replies": [replies[i] for i in range(len(requests))]}  # fmt: skip


def main() -> None:
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
        if line.strip() == "serve":
            print(json.dumps(serve(llm.llm_engine, requests, params_for)), flush=True)


if __name__ == "__main__":  # (vLLM's engine start-up needs the guard)
    main()
