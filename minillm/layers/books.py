"""The KV books checked after every step (EngineConfig.debug, or MINILLM_DEBUG=1): slow, for tests.

Seam: after the step (an observer). The allocator's own `check` says what must hold: free + used
== total, reference counts equal the tables that hold each block, the prefix keys agree, nothing
written into a shared block (engine/blocks.py); a host tier's pool, that every slot is held or free.
"""

from __future__ import annotations

from minillm.engine.paged_books import PagedKVBooks


def check_books(engine, record) -> None:
    if isinstance(engine.cache, PagedKVBooks):  # (a contiguous cache has no books to break)
        engine.cache.allocator.check()
    if getattr(engine, "tier", None) is not None:
        engine.tier.host.check()
