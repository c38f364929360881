"""The two engines of a disaggregated server (disaggregate.py), as each engine process sees the other: a process
group of two (gloo on a CPU, NCCL on GPUs: rank 0 prefill, rank 1 decode) that carries each handed-over request's
keys and values, and the serve loop's part in it on either side (take_role).
"""

from __future__ import annotations

import datetime
from dataclasses import replace

import torch
import torch.distributed as dist

from minillm.serving.serve_loop import Listener
from minillm.serving.token_stream import Event

LINK_TIMEOUT = datetime.timedelta(days=7)  # the decode engine waits for KV only when told some is coming


class HandoverLink:
    """The prefill and decode engines' process group: the KV of one request at a time, then an acknowledgement."""

    def __init__(self, address: str, role: str, device: str):
        self.rank, self.peer = (0, 1) if role == "prefill" else (1, 0)
        self.device = torch.device(device)
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=address, rank=self.rank, world_size=2, timeout=LINK_TIMEOUT)

    def send(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """(prefill) The shape first, then the keys and values; returns once the decode side has them."""
        dist.send(torch.tensor(k.shape, dtype=torch.long, device=self.device), self.peer)
        dist.send(k.contiguous(), self.peer)
        dist.send(v.contiguous(), self.peer)
        dist.recv(torch.zeros(1, device=self.device), self.peer)  # the decode side's ack: r's blocks may go

    def receive(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(decode) One request's keys and values, (L, n, Hkv, D) each."""
        shape = torch.zeros(4, dtype=torch.long, device=self.device)
        dist.recv(shape, self.peer)
        k, v = (torch.empty(*shape.tolist(), dtype=dtype, device=self.device) for _ in range(2))
        dist.recv(k, self.peer)
        dist.recv(v, self.peer)
        dist.send(torch.ones(1, device=self.device), self.peer)
        return k, v


def take_role(loop, role: str, address: str, send, outlet) -> None:
    """Set up a serve loop (serve_loop.py) as the prefill or the decode engine. send: a message to the HTTP side;
    outlet(request id): the stream a decode engine's events go to (engine_process.Outlet)."""
    from minillm.layers.handover import export, handed_copy

    engine = loop.engine
    link = HandoverLink(address, role, str(engine.device))

    def hand_over() -> None:  # (prefill) after each step: every request that has its first token goes over
        for request in list(engine.held):
            loop.listeners.pop(request.id, None)  # (its first token went out; its stream goes on from the decode side)
            books = handed_copy(request)
            pattern = books.sampling.constraint and books.sampling.constraint.pattern  # (the HTTP side has it compiled)
            books.sampling = replace(books.sampling, constraint=pattern)
            logprobs = engine.sampler.logprobs.pop(request.id, None)  # (its first token's: the decode side goes on)
            service = engine.services.get(request.id)  # (its priority holds on the decode side too)
            send(("handed", books, logprobs, service))  # the books first: they tell the decode side to listen
            try:
                link.send(*export(engine, request))
            except RuntimeError as e:  # the decode engine is gone: free this side, end the request
                send(("handover-failed", request.id, f"the KV hand-over failed ({str(e).splitlines()[0][:200]})"))
            engine.release(request)
            loop.stats.count("handed-over")

    def receive(copy, logprobs: list | None, service=None) -> None:  # (decode) its books arrived: its KV follows
        stream = outlet(copy.id)
        try:
            kv = link.receive(engine.cache.k.dtype)
        except RuntimeError as e:
            loop.outbox.append((stream, Event("done", detail=f"error: the KV hand-over failed ({e})")))
            return
        copy.arrival_s, copy.arrival_step = engine.clock.now(), engine.step_no
        if logprobs is not None:  # (the reply's so far: the listener sends them on from its second token)
            engine.sampler.logprobs[copy.id] = list(logprobs)
        if not engine.submit(copy, kv=kv, service=service):  # (it fitted the prefill engine's: the same limits here)
            engine.sampler.logprobs.pop(copy.id, None)
            why = f"error: the decode engine refused it: {copy.finish_reason}"
            loop.outbox.append((stream, Event("done", detail=why)))
            return
        listener = Listener(copy, stream)
        listener.sent, listener.last_token_s = len(copy.output_ids), engine.clock.now()  # token 1 went from prefill
        loop.listeners[copy.id] = listener

    if role == "prefill":
        loop.on_accept = engine.handover.mark  # every request it takes leaves after its first token
        loop.after_step = hand_over
    else:
        loop.receiver = receive
