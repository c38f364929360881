"""A tensor-parallel worker (ranks 1 .. tp-1): it runs the model's forward on its share of the weights, nothing else.

Rank 0 runs the whole engine (scheduler, allocator, sampler, trace) and, each step, broadcasts what the step is
(runner.py): which seats run which tokens from which positions, and for a paged cache the rows' block tables.
A worker plans the same step on its own KV cache (the same block ids, each block 1/tp of the bytes: its own heads),
runs the same forward, and joins the layers' all-reduces; it never samples (rank 0 holds the full logits) and
keeps no books (the tables come with each step), so it cannot drift from rank 0's.

Messages (torch.distributed.broadcast_object_list from rank 0; no channel of our own):
    ("cache", engine config, max_len)        build the KV cache an engine asked for
    ("step", seats, starts, num_new, padding_rows, tables or None, token ids)
    ("stop",)                                 leave the process group and exit
"""

from __future__ import annotations

import datetime
import signal
import sys

import torch
import torch.distributed as dist
from safetensors.torch import load as load_tensors

IDLE_TIMEOUT = datetime.timedelta(days=7)  # a worker waits for the next step as long as the engine stays idle
# (it is rank 0 that notices a worker gone: runner.py)


def backend_for(device: str) -> str:
    return "nccl" if device.startswith("cuda") else "gloo"  # one code path: the backend follows the device


def receive(device: str) -> tuple:
    box = [None]
    dist.broadcast_object_list(box, src=0, device=torch.device(device) if device.startswith("cuda") else None)
    return box[0]


def serve_rank(rank: int, tp: int, address: str, recipe: tuple) -> None:
    """A worker's life: join the group, take its share of the weights, run each step rank 0 sends, until "stop"."""
    from minillm.engine.runner import make_cache
    from minillm.model.transformer import Transformer
    from minillm.parallel.shard import shard_model, shard_view

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches every process of the terminal: rank 0 decides
    model_cfg, weights, device, threads = recipe
    torch.set_num_threads(threads)
    device = f"cuda:{rank}" if device.startswith("cuda") else device  # a GPU per rank
    dist.init_process_group(backend_for(device), init_method=address, rank=rank, world_size=tp, timeout=IDLE_TIMEOUT)
    try:
        model = Transformer(model_cfg)
        model.load_state_dict(load_tensors(weights))
        model = shard_model(model, rank, tp).to(device).eval()
        cache, nothing = None, torch.empty(0, dtype=torch.long, device=device)  # (no logits: rank 0 samples)
        while (message := receive(device))[0] != "stop":  # (rank 0 gone: receive raises, the worker ends)
            if message[0] == "cache":
                cache = make_cache(shard_view(model_cfg, tp), message[1], message[2], device)
            else:
                _, seats, starts, num_new, padding_rows, tables, token_ids = message
                extra = (tables,) if tables is not None else ()  # (a paged cache plans from the block tables)
                positions = cache.plan_rows(seats, starts, num_new, padding_rows, *extra)
                tokens = torch.tensor(token_ids, device=device).view(positions.shape)
                with torch.no_grad():
                    model(tokens, positions, cache, logits_at=nothing)  # its share of every layer, all-reduced
    except RuntimeError as e:  # a collective failed: rank 0 (or another rank) is gone, and with it the model
        print(f"minillm tensor-parallel rank {rank}: stopping, another rank is gone ({str(e).splitlines()[0][:200]})",
              file=sys.stderr)  # fmt: skip
        sys.exit(1)
    finally:
        dist.destroy_process_group()
