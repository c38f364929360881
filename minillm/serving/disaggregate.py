"""`serve --disaggregate`: one engine process prefills, another decodes, and each prompt's KV goes between them.

    HTTP side                       prefill engine (process)                  decode engine (process)
    submit ──("submit", r)────────> runs the prompt, picks token 1
    stream <──token 1───────────────┤
    PrefillDecode <──("handed", r)──┤ (the books: r with its first token)
      └──("receive", r)─────────────┼───────────────────────────────────────> waits for r's KV
                                    └── K, V ──torch.distributed send/recv──> writes them, decodes on
    stream <──tokens 2, 3, ... ───────────────────────────────────────────────┘    then acks: the prefill side frees
                                                                                   r's blocks

The two engines form a process group of two (gloo on a CPU, NCCL on GPUs: rank 0 prefill, rank 1 decode); the KV
goes through it, tensor by tensor, and nothing else does: the books go through the HTTP side's pipes, whose order
tells the decode engine whose KV comes next. A transfer that fails (the other engine died) frees the prefill side's
blocks and ends the request with an error; the decode side never takes a request whose KV did not all arrive.
Inside the engine processes, handover_link.py does their part.
"""

from __future__ import annotations

from dataclasses import replace

from minillm.errors import ConfigError
from minillm.serving.serve_loop import LoopHandle
from minillm.serving.token_stream import Event


class PrefillDecode(LoopHandle):
    """Two engine processes behind one server: what the app asks of one engine, done by the pair."""

    def __init__(self, model, scheduler: str, token_budget: int, cfg, **loop_args):
        from minillm.parallel.runner import free_port
        from minillm.serving.engine_process import EngineProcess

        if loop_args.pop("tp", 1) > 1:
            raise ConfigError("--disaggregate runs each engine on one process: drop --tp (or drop --disaggregate)")
        address = f"tcp://127.0.0.1:{free_port()}"
        self.prefill = EngineProcess(model, scheduler, token_budget, cfg, role="prefill", link=address, **loop_args)
        self.decode = EngineProcess(model, scheduler, token_budget, cfg, role="decode", link=address, **loop_args)
        self.prefill.on_message = self._from_prefill
        self.aborted: set[str] = set()

    def start(self) -> PrefillDecode:
        for engine in (self.prefill, self.decode):  # both at once: their process group needs the two of them
            engine.launch()
        for engine in (self.prefill, self.decode):
            engine.wait_ready()
        self.max_len, self.config = self.decode.max_len, self.decode.config | {"disaggregated": True}
        return self

    def stop(self, timeout: float = 10.0) -> None:
        for engine in (self.prefill, self.decode):
            engine.stop(timeout)

    @property
    def alive(self) -> bool:
        return self.prefill.alive and self.decode.alive

    @property
    def error(self) -> str | None:
        return self.prefill.error or self.decode.error

    @property
    def steps(self) -> int:
        return self.decode.steps

    def _from_prefill(self, message: tuple) -> None:
        """The prefill engine's out-of-band messages: a request handed over, or a hand-over that failed."""
        if message[0] == "handed":
            _, copy, logprobs, service = message  # (logprobs: its first token's, when asked; the decode side goes on)
            if isinstance(copy.sampling.constraint, str):
                from minillm.grammar import compile_regex

                pattern = compile_regex(copy.sampling.constraint)  # (compiled when it came in: kept by pattern)
                copy.sampling = replace(copy.sampling, constraint=pattern)
            stream = self.prefill.streams.pop(copy.id, None)
            if stream is not None:
                self.decode.streams[copy.id] = stream  # its next tokens come from the decode engine
            self.decode._send(("receive", copy, logprobs, service))  # (its priority holds on the decode side too)
            if copy.id in self.aborted:
                self.decode._send(("abort", copy.id, "aborted"))
        else:
            _, rid, why = message
            stream = self.decode.streams.pop(rid, None)
            if stream is not None:
                from minillm.serving.token_stream import deliver

                deliver([(stream, Event("done", detail=f"error: {why}"))])

    def _send(self, message: tuple) -> None:
        kind = message[0]
        if kind == "submit":  # (the prefill engine marks every request it takes for hand-over: take_role)
            self.prefill._send(message)
        elif kind == "abort":
            self.aborted.add(message[1])
            self.prefill._send(message)
            self.decode._send(message)
        else:  # questions, snapshots, metrics: the decode engine's (where replies are made)
            self.decode._send(message)
