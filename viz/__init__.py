"""Pictures of a minillm trace, and of a model on a card, shared by the lesson notebooks and the app.

Pure functions: a Trace (or whatif.plan's numbers) in, a matplotlib Figure or plain data out. Each reads
the trace's table (table.py: seat states, colours, token splits, statuses, KV figures per step), built once
per trace, so a function may be given either. The app's fast path paints numpy pixels instead and
precomputes per trace (raster.py, player.py), so a frame costs the same at any step of a run of any length.
"""

from viz.budget import TokenSplit, token_split, token_splits
from viz.card import (
    memory_split,
    plot_memory_split,
    plot_speed_by_batch,
    plot_users_by_context,
    speed_by_batch,
    users_by_context,
)
from viz.colors import STATE_COLORS, request_colors
from viz.events import StepEvents, describe, step_events
from viz.kv_blocks import kv_block_fill, kv_block_owners, kv_block_refs, kv_blocks_rgb, kv_memory, plot_kv_blocks
from viz.occupancy import occupancy_grid, occupancy_labels, plot_occupancy
from viz.player import Frame, Timeline, TracePlayer
from viz.progress import RunProgress
from viz.replies import status_at_step, text_at_step, tokens_produced
from viz.table import TraceTable, table_of
from viz.timeline import plot_queue, plot_utilization, queue_lengths, running_utilization

__all__ = [
    "STATE_COLORS",
    "Frame",
    "RunProgress",
    "StepEvents",
    "Timeline",
    "TokenSplit",
    "TracePlayer",
    "TraceTable",
    "describe",
    "kv_block_fill",
    "kv_block_owners",
    "kv_block_refs",
    "kv_blocks_rgb",
    "kv_memory",
    "memory_split",
    "occupancy_grid",
    "occupancy_labels",
    "plot_kv_blocks",
    "plot_memory_split",
    "plot_occupancy",
    "plot_queue",
    "plot_speed_by_batch",
    "plot_users_by_context",
    "plot_utilization",
    "queue_lengths",
    "request_colors",
    "running_utilization",
    "speed_by_batch",
    "status_at_step",
    "step_events",
    "table_of",
    "text_at_step",
    "token_split",
    "token_splits",
    "tokens_produced",
    "users_by_context",
]
