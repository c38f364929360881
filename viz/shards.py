"""One transformer layer split across cards (tensor parallelism, minillm/parallel/shard.py): a picture.

Each pair of matmuls splits the same way: the first weight column-parallel (each card its output rows: its heads, its
MLP columns; a fused weight such as q, k and v is split section by section), the second row-parallel (each card the
input columns that multiply what it computed), then one all-reduce adds the cards' partial sums. Lesson 12 draws it
for the shipped model; docs/sharded_layer.py saves it for the README.
"""

from __future__ import annotations

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Circle, Rectangle

CARD_COLORS = ("#0072b2", "#e69f00", "#009e73", "#cc79a7")  # card 0, 1, 2, 3 (colour-blind safe)


def weight_blocks(ax: Axes, x: float, y: float, w: float, h: float, tp: int, by: str, label: str,
                  sections: list[tuple[str, int]] | None = None) -> None:  # fmt: skip
    """One nn.Linear weight (out rows x in columns), its tp shares coloured by card. by="rows": column-parallel,
    each card its run of each section's rows; by="columns": row-parallel, each card its run of columns."""
    if by == "rows":
        names, sizes = zip(*(sections or [("", 1)]))
        top = y + h
        for name, size in zip(names, sizes):
            part = h * size / sum(sizes)
            for r in range(tp):
                share = Rectangle((x, top - (r + 1) * part / tp), w, part / tp, color=CARD_COLORS[r], alpha=0.8,
                                  ec="white", lw=0.5)  # fmt: skip
                ax.add_patch(share)
            ax.text(x - 0.08, top - part / 2, name, ha="right", va="center", fontsize=9)
            top -= part
    else:
        for r in range(tp):
            ax.add_patch(Rectangle((x + r * w / tp, y), w / tp, h, color=CARD_COLORS[r], alpha=0.8))
    ax.add_patch(Rectangle((x, y), w, h, fill=False, lw=1.2))
    ax.text(x + w / 2, y - 0.35, label, ha="center", va="top", fontsize=9)


def arrow(ax: Axes, x0: float, x1: float, y: float, text: str = "") -> None:
    ax.annotate("", (x1, y), (x0, y), arrowprops=dict(arrowstyle="->", lw=1.2))
    if text:
        ax.text((x0 + x1) / 2, y + 0.15, text, ha="center", va="bottom", fontsize=9)


def plot_sharded_layer(n_heads: int, n_kv_heads: int, tp: int = 2, figsize=(12.0, 6.0)) -> Figure:
    """Attention above, the MLP below, each split over `tp` cards (up to 4), for a model with these heads."""
    if not 1 <= tp <= len(CARD_COLORS):
        raise ValueError(f"tp={tp}: this picture colours 1 to {len(CARD_COLORS)} cards")
    pairs = (
        ("qkv_proj", "o_proj", "attention,\nits heads", [("q", n_heads), ("k", n_kv_heads), ("v", n_kv_heads)]),
        ("gate_up_proj", "down_proj", "SiLU(gate)\nx up", [("gate", 1), ("up", 1)]),
    )
    fig = Figure(figsize=figsize, layout="constrained")
    axes = fig.subplots(2, 1)
    for ax, (first, second, middle, sections) in zip(axes, pairs):
        ax.add_patch(Rectangle((0, 1), 0.8, 2, color="lightgrey"))
        ax.text(0.4, 0.65, "x: every card\nall of it", ha="center", va="top", fontsize=9)
        arrow(ax, 0.9, 2.2, 2, "no\nsharing")
        weight_blocks(ax, 2.7, 0.5, 2, 3, tp, "rows", f"{first} (out, in):\ncolumn-parallel, rows by card", sections)
        arrow(ax, 4.8, 6.6, 2, middle)
        weight_blocks(ax, 6.8, 0.9, 3, 2.2, tp, "columns", f"{second} (out, in):\nrow-parallel, columns by card")
        arrow(ax, 9.9, 11.3, 2, "partial\nsums")
        ax.add_patch(Circle((11.8, 2), 0.45, color="tab:red", alpha=0.85))
        ax.text(11.8, 2, "+", ha="center", va="center", fontsize=18, color="white")
        ax.text(11.8, 1.35, "all-reduce\n(over the link)", ha="center", va="top", fontsize=9)
        arrow(ax, 12.3, 14, 2, "the output,\nevery card")
        ax.set(xlim=(-0.2, 14.3), ylim=(-0.7, 3.8), aspect="equal")
        ax.axis("off")
    for r in range(tp):
        axes[0].text(2.7 + r * 2.2 / tp, 3.65, f"card {r}", color=CARD_COLORS[r], fontsize=9, fontweight="bold")
    axes[0].set_title("Attention: each card its query heads and their key/value heads, then its columns of o_proj",
                      fontsize=11)  # fmt: skip
    axes[1].set_title("MLP: each card its ffn columns of gate and of up, then its columns of down", fontsize=11)
    return fig
