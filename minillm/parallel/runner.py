"""Rank 0 of a tensor-parallel model: the engine's runner, which hands every step to the other ranks.

The engine does not know how many ranks there are: it calls its runner's `make_cache` and `run` as it calls a
single device's (engine/runner.py). ShardedRunner starts tp - 1 worker processes (torch.multiprocessing, spawned:
a fresh interpreter each), joins them in a torch.distributed process group (gloo on a CPU, NCCL on GPUs), keeps its
own share of the weights, and each step

    1. plans the step on its own KV cache (the allocator and the block tables live here, as on one device),
    2. broadcasts the plan: seats, positions, block tables, tokens (worker.py says what a worker does with it),
    3. runs its share of the forward, whose row-parallel layers all-reduce with every rank (shard.py),
    4. samples from the full logits, which every rank has and only rank 0 uses.

A worker that dies ends the run within seconds: rank 0 looks at its workers before every step, and a collective
with a rank gone fails (its socket closes); either way the engine stops with WorkerDied naming the rank, and a
server answers 503. close() (or the process's exit) stops and joins every worker: no process outlives the run.
"""

from __future__ import annotations

import atexit
import copy
import datetime
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import save as save_tensors

from minillm.config import EngineConfig
from minillm.engine.packing import Batch
from minillm.engine.runner import ModelRunner
from minillm.errors import ConfigError, MinillmError
from minillm.parallel.shard import check_tp, shard_model, shard_view
from minillm.parallel.worker import backend_for, serve_rank

START_TIMEOUT = datetime.timedelta(seconds=120)  # workers import torch and load their share: slow on a busy laptop
STEP_TIMEOUT = datetime.timedelta(seconds=30)  # a collective that waits longer than this: a rank is stuck


class WorkerDied(MinillmError):
    """A tensor-parallel worker is gone: the model is incomplete without it, so the engine stops."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ShardedRunner(ModelRunner):
    def __init__(self, model: torch.nn.Module, tp: int):
        """Serve `model` (the ordinary, whole model; not changed) split across `tp` ranks on its device."""
        check_tp(model.cfg, tp)
        if dist.is_initialized():
            raise ConfigError("this process already runs a tensor-parallel model: close() it before starting another")
        device = str(next(model.parameters()).device)
        weights = save_tensors({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()})
        recipe = (model.cfg, weights, device, torch.get_num_threads())
        address, context = f"tcp://127.0.0.1:{free_port()}", mp.get_context("spawn")
        self.workers = [context.Process(target=serve_rank, args=(rank, tp, address, recipe), daemon=True,
                                        name=f"minillm-tp-rank{rank}") for rank in range(1, tp)]  # fmt: skip
        for worker in self.workers:
            worker.start()
        self.tp, self.closed = tp, False
        self.object_device = torch.device(device) if device.startswith("cuda") else None  # (NCCL sends from a GPU)
        atexit.register(self.close)  # (before multiprocessing's own exit handler: workers leave the group first)
        try:
            dist.init_process_group(backend_for(device), init_method=address, rank=0, world_size=tp,
                                    timeout=START_TIMEOUT)  # fmt: skip
        except Exception as e:  # noqa: BLE001 (a worker that failed to start is the likely cause: say which)
            self.close()
            raise WorkerDied(f"the tensor-parallel workers did not all start ({self.gone() or e})") from None
        super().__init__(shard_model(copy.deepcopy(model), 0, tp))
        self.kv_cfg = shard_view(model.cfg, tp)  # rank 0's own cache holds its share of the heads, like each worker's

    def gone(self) -> str:
        """'' while every worker lives, else which rank ended and how."""
        dead = [(rank, w.exitcode) for rank, w in enumerate(self.workers, 1) if not w.is_alive()]
        return "; ".join(f"rank {rank} exited with code {code}" for rank, code in dead)

    def broadcast(self, message: tuple) -> None:
        why = self.gone()
        if why:
            raise WorkerDied(f"a tensor-parallel worker is gone: {why}; the model is incomplete without it")
        self.collective(lambda: dist.broadcast_object_list([message], src=0, device=self.object_device))

    def collective(self, call):
        try:
            return call()
        except RuntimeError as e:  # (gloo: "Connection closed by peer" when a rank's process ends)
            deadline = time.monotonic() + 2  # the socket can close a moment before the process is seen gone
            while not self.gone() and time.monotonic() < deadline:
                time.sleep(0.02)
            why = self.gone() or f"no worker has exited: {str(e).splitlines()[0][:200]}"
            raise WorkerDied(f"a tensor-parallel collective failed ({why})") from None

    def make_cache(self, cfg: EngineConfig, max_len: int):
        self.broadcast(("cache", cfg, max_len))
        return super().make_cache(cfg, max_len)

    def prepare(self, batch: Batch, cache) -> torch.Tensor:
        """Plan the step here, then send the plan to every worker (before the forward they run together)."""
        starts = [cache.seat_tokens(seat) for seat in batch.seats]
        positions = super().prepare(batch, cache)
        num_new = batch.counts[0] if len(set(batch.counts)) == 1 else batch.counts
        tables = {s: list(cache.allocator.tables[s]) for s in batch.seats} if hasattr(cache, "allocator") else None
        self.broadcast(("step", batch.seats, starts, num_new, batch.padding_rows, tables, batch.token_ids))
        return positions

    def run(self, batch: Batch, cache, picker) -> list[int]:
        return self.collective(lambda: super(ShardedRunner, self).run(batch, cache, picker))

    def close(self) -> None:
        """Stop every worker and leave the process group (idempotent; also run at the process's exit)."""
        if self.closed:
            return
        self.closed = True
        if dist.is_initialized():
            try:
                if not self.gone():
                    dist.broadcast_object_list([("stop",)], src=0, device=self.object_device)
            except RuntimeError:
                pass
            dist.destroy_process_group()
        for worker in self.workers:
            worker.join(10)
            if worker.is_alive():
                worker.kill()
                worker.join()
