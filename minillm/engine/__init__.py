"""THE CORE: how one model serves many requests. Read it in this order (an evening):

request.py      a request's life: waiting -> running -> finished (and back, when preempted)
scheduler.py    the two policies, static and continuous batching, under a token budget
blocks.py       the block allocator: free list, block tables, reference counts, prefix caching
paged_books.py  what a scheduler may ask of the paged pool, without tensors
kv_cache.py     where keys and values live: a row per seat, or a pool of blocks
packing.py      a step's rows of different lengths laid end to end for one forward
runner.py       one forward over the packed rows, and the greedy pick of each next token
engine.py       the loop: arrive, schedule, preempt, admit, run, finish, observe; and its seams
generate.py     the one-user loop every batched path must match token for token

Every other feature, the trace included, plugs into one of engine.py's seams from minillm/layers/.
"""

from minillm.config import EngineConfig, Sampling
from minillm.engine.blocks import BlockAllocator
from minillm.engine.engine import Engine, Step
from minillm.engine.generate import generate
from minillm.engine.kv_cache import ContiguousKVCache, PagedKVCache
from minillm.engine.request import Request, State
from minillm.engine.scheduler import SCHEDULERS, ContinuousScheduler, KVSpace, Plan, StaticScheduler

__all__ = ["SCHEDULERS", "BlockAllocator", "ContiguousKVCache", "ContinuousScheduler", "Engine"]
__all__ += ["EngineConfig", "KVSpace", "PagedKVCache", "Plan", "Request", "Sampling", "State"]
__all__ += ["StaticScheduler", "Step", "generate"]
