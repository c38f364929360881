"""Pictures of a minillm trace, shared by the lesson notebooks and the app.

Pure functions: a Trace in, a matplotlib Figure or plain data out (the app's fast path paints
numpy pixels instead, see raster.py and player.py).
"""

from viz.colors import STATE_COLORS, request_colors
from viz.kv_blocks import kv_block_fill, kv_block_owners, kv_blocks_rgb, plot_kv_blocks
from viz.occupancy import occupancy_grid, occupancy_labels, plot_occupancy
from viz.player import Frame, TracePlayer
from viz.replies import status_at_step, text_at_step, tokens_produced
from viz.timeline import plot_queue, plot_utilization, queue_lengths, running_utilization

__all__ = [
    "STATE_COLORS",
    "Frame",
    "TracePlayer",
    "kv_block_fill",
    "kv_block_owners",
    "kv_blocks_rgb",
    "occupancy_grid",
    "occupancy_labels",
    "plot_kv_blocks",
    "plot_occupancy",
    "plot_queue",
    "plot_utilization",
    "queue_lengths",
    "request_colors",
    "running_utilization",
    "status_at_step",
    "text_at_step",
    "tokens_produced",
]
