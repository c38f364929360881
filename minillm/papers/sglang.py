"""SGLang's RadixAttention, reproduced: a benchmark's programs through minillm's own engine on a simulated A10G
serving Llama-2-7B in fp16, with the prefix cache on and off; the cache hit rate (SGLang's: cached prompt tokens over
prompt tokens), the optimal one (Theorem 3.1: every prompt token some earlier request computed is a hit), and the
throughput in programs per second.

The client is the benchmarks' closed loop: at most `parallel` programs in flight, a program's next turn sent when
its last reply is complete, the next program when one ends. sglang_setup.py gives every fact with its source.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from minillm.card.hardware import get_device
from minillm.card.modelspec import load_spec
from minillm.card.simulate import SimulatedRunner
from minillm.config import EngineConfig
from minillm.engine.engine import Engine
from minillm.engine.request import Request
from minillm.engine.scheduler import ContinuousScheduler
from minillm.errors import ConfigError
from minillm.papers import sglang_setup as setup
from minillm.papers.sglang_lpm import LongestPrefixScheduler
from minillm.papers.sglang_workloads import Program, programs_of
from minillm.papers.traces import paper_engine


@dataclass
class Options:
    workloads: tuple[str, ...] = tuple(setup.WORKLOADS)
    requests: int | None = None  # programs per workload; None: the benchmark's
    block_size: int = setup.BLOCK
    parallel: int = setup.PARALLEL
    seed: int = 0
    gpu: str = setup.GPU  # card/hardware.py's name

    def check(self) -> None:
        unknown = [w for w in self.workloads if w not in setup.WORKLOADS]
        if unknown:
            raise ConfigError(f"unknown workload {unknown[0]!r}; choose from {', '.join(setup.WORKLOADS)}")
        if self.block_size < 1:
            raise ConfigError(f"--block-size must be at least 1 token, got {self.block_size}")
        get_device(self.gpu)  # an unknown card's error lists the known ones
        if self.parallel < 1:
            raise ConfigError(f"--parallel must be at least 1 program in flight, got {self.parallel}")


@dataclass
class Served:
    """One workload through one system."""

    workload: str
    system: str  # a key of setup.SYSTEMS
    block_size: int
    programs: int
    requests: int
    prompt_tokens: int
    cached_tokens: int  # prompt tokens the cache gave (the engine's prompt_tokens_from_cache)
    optimal_tokens: int  # prompt tokens an earlier request had computed (Theorem 3.1's bound)
    computed_tokens: int  # prompt tokens run through the model
    seconds: float  # simulated, first program in to last reply out

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def optimal_rate(self) -> float:
        return self.optimal_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def throughput(self) -> float:  # programs per second, the paper's unit
        return self.programs / self.seconds if self.seconds else 0.0

    def to_dict(self) -> dict:
        return asdict(self) | {"hit_rate": self.hit_rate, "optimal_rate": self.optimal_rate,
                               "throughput": self.throughput}  # fmt: skip


class Seen:
    """Every token position some request has computed, as a chain of hashes: how much of a new prompt was seen."""

    def __init__(self):
        self.prefixes: set[int] = set()

    def match(self, tokens: list[int]) -> int:  # never the last token: the model must run it for the next one
        h, n = 0, 0
        for token in tokens[:-1]:
            h = hash((h, token))
            if h not in self.prefixes:
                break
            n += 1
        return n

    def add(self, tokens: list[int]) -> None:
        h = 0
        for token in tokens:
            h = hash((h, token))
            self.prefixes.add(h)


class Client:
    """The benchmark's closed loop: `parallel` programs in flight; each turn's prompt is the conversation so far."""

    def __init__(self, programs: list[Program], parallel: int):
        self.todo, self.parallel = list(reversed(programs)), parallel
        self.turn: dict[str, tuple[Program, int, list[int]]] = {}  # request id -> (program, turn index, said)
        self.seen, self.optimal, self.sent = Seen(), 0, 0

    def start(self, engine: Engine) -> None:
        while self.todo and len(self.turn) < self.parallel:
            self.send(engine, self.todo.pop(), 0, [])

    def send(self, engine: Engine, program: Program, index: int, said: list[int]) -> None:
        turn = program[index]
        prompt = said + list(turn.tokens)
        self.optimal += self.seen.match(prompt)
        self.seen.add(prompt)
        rid = f"p{self.sent}"
        self.sent += 1
        self.turn[rid] = (program, index, prompt)
        engine.submit(Request(rid, prompt, turn.reply, ignore_eos=True, arrival_s=engine.clock.now()))

    def finished(self, engine: Engine, request: Request) -> None:
        program, index, prompt = self.turn.pop(request.id)
        said = prompt + list(request.output_ids)
        self.seen.add(said[:-1])  # the reply's last token is never run through the model
        if index + 1 < len(program):
            self.send(engine, program, index + 1, said)
        elif self.todo:
            self.send(engine, self.todo.pop(), 0, [])


def make_engine(block_size: int, caching: bool, parallel: int, lpm: bool, gpu: str = setup.GPU,
                workload: str = "") -> Engine:  # fmt: skip
    runner = SimulatedRunner(load_spec(setup.MODEL), get_device(gpu), setup.DTYPE, setup.DTYPE,
                             utilization=setup.MEM_FRACTION)  # fmt: skip
    cfg = EngineConfig(slots=parallel, kv="paged", num_blocks=runner.pool_blocks(block_size), block_size=block_size,
                       max_len=runner.max_len, prefix_caching=caching, record_blocks=False)  # fmt: skip
    policy = LongestPrefixScheduler if lpm else ContinuousScheduler
    name = f"sglang-{workload}-{'lpm' if lpm else 'fcfs'}{'' if caching else '-no-cache'}-block{block_size}"
    meta = {"model": setup.MODEL, "gpu": gpu}
    return paper_engine(runner, policy(token_budget=setup.PREFILL_TOKENS), cfg, name, meta)


def serve(workload: str, programs: list[Program], system: str, block_size: int, parallel: int, gpu: str) -> Served:
    caching, lpm = system != "no-cache", system == "cache"
    engine, client = make_engine(block_size, caching, parallel, lpm, gpu, workload), Client(programs, parallel)
    client.start(engine)
    while engine.has_work():
        for request in Engine.step(engine).finished:  # (the core's Step: a traced engine's step returns its record)
            client.finished(engine, request)
    done = engine.requests
    rejected = [r for r in done if r.finish_reason and r.finish_reason.startswith("rejected")]
    if rejected:
        raise ConfigError(f"{workload}: request {rejected[0].id} {rejected[0].finish_reason}")
    return Served(workload, system, block_size, len(programs), len(done), sum(len(r.prompt_ids) for r in done),
                  sum(r.prompt_tokens_from_cache for r in done), client.optimal,
                  sum(r.prefill_tokens for r in done), engine.clock.now())  # fmt: skip


def run_workload(options: Options, workload: str, systems=tuple(setup.SYSTEMS), block_size: int | None = None,
                 gpu: str | None = None) -> dict[str, Served]:  # fmt: skip
    """One workload through each system (at another block size or card if asked): {system: Served}."""
    programs = programs_of(workload, options.requests, options.seed)
    size, card = block_size or options.block_size, gpu or options.gpu
    return {system: serve(workload, programs, system, size, options.parallel, card) for system in systems}


def run(options: Options) -> dict[str, dict[str, Served]]:
    options.check()
    return {w: run_workload(options, w) for w in options.workloads}
