"""THE CORE: how one model serves many requests. Read it in this order:

request.py      a request's life: waiting -> running -> finished (and back, when preempted)
scheduler.py    the two policies, static and continuous batching, under a token budget
blocks.py       the block allocator: free list, block tables, reference counts, prefix caching
paged_books.py  what a scheduler may ask of the paged pool, without tensors
kv_cache.py     where keys and values live: a row per seat, or a pool of blocks
packing.py      a step's rows of different lengths laid end to end for one forward
runner.py       one forward over the packed rows, and the next token of each
sampler.py      how each row's next token is picked: greedy, or drawn as its request asks
speculate.py    speculative decoding: guesses checked in the same forward, the wrong ones rolled back
engine.py       the loop: arrive, schedule, preempt, admit, run, finish, record
trace.py        what a run leaves behind: a record per step and per request
generate.py     the one-user loop every batched path must match token for token
"""

from minillm.config import EngineConfig, Sampling
from minillm.engine.blocks import BlockAllocator, BlockPoolExhausted
from minillm.engine.engine import Engine
from minillm.engine.generate import generate
from minillm.engine.kv_cache import ContiguousKVCache, PagedKVCache
from minillm.engine.request import Request, State
from minillm.engine.scheduler import (
    DEFAULT_TOKEN_BUDGET,
    SCHEDULERS,
    ContinuousScheduler,
    KVSpace,
    Plan,
    PlanError,
    Scheduler,
    StaticScheduler,
)
from minillm.engine.trace import RequestRecord, StepRecord, Trace

__all__ = ["DEFAULT_TOKEN_BUDGET", "SCHEDULERS", "BlockAllocator", "BlockPoolExhausted", "ContiguousKVCache",
           "ContinuousScheduler", "Engine", "EngineConfig", "PlanError", "KVSpace", "PagedKVCache", "Plan",
           "Request", "RequestRecord", "Sampling", "Scheduler", "State", "StaticScheduler", "StepRecord", "Trace",
           "generate"]  # fmt: skip
