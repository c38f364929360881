"""Tensor parallelism on this machine: the same model on one process and split across two (parallel/).

allreduce   seconds per all-reduce between two processes (gloo over loopback) against the message's size: a fixed
            cost per collective (both processes meet, the bytes cross a socket) plus bytes over a copy's bandwidth
steps       a decode step's median time at tp = 1 and tp = 2, by model size (card/sizes.py: the shipped 3m, and 25m
            and 100m with random weights) and batch; the step at tp = 2 does half of every matmul per process, plus
            two all-reduces per layer and the plan's broadcast
crowd       tokens/s of the chat crowd on the shipped model, tp = 1 and tp = 2, replies compared token for token

What to expect on a 2-core CPU: a small model's step is mostly a fixed cost per torch call, which every rank pays
whole (tp halves none of it) and to which tp adds 2 all-reduces per layer; a big model's step streams its weights,
and two processes can stream half each on two cores, if the memory keeps up with both.
"""

from __future__ import annotations

import statistics
import time

import torch

from minillm.card.hardware import LINKS
from minillm.config import EngineConfig
from minillm.engine.request import Request
from minillm.engine.scheduler import ContinuousScheduler
from minillm.layers import LayeredEngine
from minillm.runs.run import run_workload
from minillm.runs.workload import ChatKnobs

CONTEXT = 64  # tokens each decoding row holds when its steps are timed


def allreduce_ranks(rank: int, address: str, sizes: list[int], repeats: int, out) -> None:
    """Two processes all-reduce fp32 tensors of each size `repeats` times; rank 0 puts the medians in `out`."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=address, rank=rank, world_size=2)
    medians = {}
    for size in sizes:
        x = torch.ones(size // 4)
        for _ in range(3):
            dist.all_reduce(x)  # (warm-up: connections, buffers)
        times = []
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(x)
            times.append(time.perf_counter() - start)
        medians[size] = statistics.median(times)
    dist.destroy_process_group()
    if rank == 0:
        out.put(medians)


def allreduce_curve(sizes: list[int], repeats: int) -> dict[int, float]:
    import torch.multiprocessing as mp

    from minillm.parallel.runner import free_port

    context = mp.get_context("spawn")
    out, address = context.SimpleQueue(), f"tcp://127.0.0.1:{free_port()}"
    ranks = [context.Process(target=allreduce_ranks, args=(r, address, sizes, repeats, out)) for r in (0, 1)]
    for p in ranks:
        p.start()
    medians = out.get()
    for p in ranks:
        p.join()
    return medians


def step_medians(runner, batches: list[int], repeats: int) -> dict[int, float]:
    """Median seconds of a decode step with `batch` rows, each holding about CONTEXT tokens."""
    medians = {}
    for batch in batches:
        cfg = EngineConfig(slots=batch, record_blocks=False)
        engine = LayeredEngine(runner, ContinuousScheduler(token_budget=0), cfg)
        for i in range(batch):
            prompt = [257] + [(7 * i + j) % 256 for j in range(CONTEXT)]
            engine.submit(Request(f"u{i}", prompt, engine.max_len - len(prompt), ignore_eos=True))
        engine.step()  # the prompts, then decode steps only
        for _ in range(3):
            engine.step()
        medians[batch] = statistics.median(engine.step().wall_s for _ in range(repeats))
        assert engine.records[-1].tokens == batch, "every row must decode in the timed steps"
    return medians


def bench_tensor_parallel(model, s) -> dict:
    from minillm.card.sizes import SIZES, timing_model
    from minillm.parallel.runner import ShardedRunner

    sizes = [2**k for k in range(10, 25, 2)]  # 1 KiB .. 16 MiB
    allreduce = allreduce_curve(sizes, 20 if s.quick else 50)
    batches, repeats = ([1, 16] if s.quick else [1, 16, 64]), (7 if s.quick else s.repeats)
    steps = []
    for name in ("3m", "25m") if s.quick else SIZES:
        sized = model if name == "3m" else timing_model(name)
        one = step_medians(sized, batches, repeats)
        runner = ShardedRunner(sized, 2)
        try:
            two = step_medians(runner, batches, repeats)
        finally:
            runner.close()
        for b in batches:  # (an all-reduce carries one activation: b rows of the width, fp32)
            steps.append({"size": name, "batch": b, "tp1_s": one[b], "tp2_s": two[b], "speedup": one[b] / two[b],
                          "allreduces": 2 * sized.cfg.n_layers, "allreduce_bytes": b * sized.cfg.dim * 4})  # fmt: skip
    knobs = ChatKnobs(requests=16 if s.quick else 48, rate=2.0)
    crowd = {}
    for tp in (1, 2):
        started = time.perf_counter()
        trace = run_workload(model, "chat", knobs=knobs, tp=tp)
        tokens = sum(len(r.output_ids) for r in trace.requests)
        crowd[tp] = {
            "tokens_per_s": tokens / sum(st.wall_s for st in trace.steps),
            "replies": [r.output_ids for r in trace.requests],
            "run_s": time.perf_counter() - started,
        }
    same = crowd[1]["replies"] == crowd[2]["replies"]
    return {"allreduce": [{"bytes": b, "seconds": t} for b, t in allreduce.items()], "steps": steps,
            "crowd": {tp: {k: v for k, v in c.items() if k != "replies"} for tp, c in crowd.items()},
            "crowd_same_replies": same, "threads": torch.get_num_threads()}  # fmt: skip


def markdown(r: dict, img) -> list[str]:
    small = min(r["allreduce"], key=lambda x: x["bytes"])
    big = max(r["allreduce"], key=lambda x: x["bytes"])
    lines = ["## 17. Tensor parallelism on this machine: one model on two processes", "",
             "`python -m minillm bench --only tp`: the same model on one process and split across two "
             "(`minillm/parallel/`: gloo over loopback, one torch thread each).", "",
             f"All-reduce between two processes: {small['seconds'] * 1e6:.0f} us for {small['bytes']:,} bytes, "
             f"{big['seconds'] * 1e3:.1f} ms for {big['bytes'] / 2**20:.0f} MiB.", "",
             "| size | batch | step, tp = 1 | step, tp = 2 | tp = 2 speed-up | all-reduces a step (bytes each) |",
             "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for x in r["steps"]:
        lines.append(f"| {x['size']} | {x['batch']} | {x['tp1_s'] * 1e3:.2f} ms | {x['tp2_s'] * 1e3:.2f} ms | "
                     f"{x['speedup']:.2f}x | {x['allreduces']} ({x['allreduce_bytes']:,}) |")  # fmt: skip
    c = r["crowd"]
    rate = lambda tp: c[tp]["tokens_per_s"] if tp in c else c[str(tp)]["tokens_per_s"]
    lines += ["", f"The chat crowd on the shipped model: {rate(1):.0f} tokens/s at tp = 1, {rate(2):.0f} at tp = 2; "
              f"the same replies, token for token: {'yes' if r['crowd_same_replies'] else 'NO'}.", ""]  # fmt: skip
    return lines + why(r, small)


def why(r: dict, small: dict) -> list[str]:
    """Where a split step's time goes here, from the figures above, and why GPUs differ."""
    first, best = r["steps"][0], max(r["steps"], key=lambda x: x["speedup"])
    comm = first["allreduces"] * small["seconds"]
    pays = "pays" if best["speedup"] > 1 else "never pays here"
    nvlink = LINKS["nvlink-4"].latency_s
    text = (
        "Why: every step at tp = 2 pays fixed costs that one process does not. In the smallest step "
        f"({first['size']}, batch {first['batch']}: {first['tp1_s'] * 1e3:.2f} ms whole) the {first['allreduces']} "
        f"all-reduces alone take about {first['allreduces']} x {small['seconds'] * 1e6:.0f} us = {comm * 1e3:.1f} ms, "
        "and rank 0 sends each step's plan to the other rank before either computes; against that, each rank's half "
        f"of the compute saves little. The split {pays} only where a step's own work dwarfs them: best here "
        f"{best['size']} at batch {best['batch']}, {best['speedup']:.2f}x. Over NVLink a small all-reduce takes about "
        f"{nvlink * 1e6:.0f} us (card/hardware.py, from SGLang's measurements), {small['seconds'] / nvlink:.0f}x less "
        "than gloo's here, and a big model's step is milliseconds of weight reads that halve: that is where tensor "
        "parallelism wins (lesson 12; section 11's published multi-GPU rows)."
    )
    return [text, ""]
