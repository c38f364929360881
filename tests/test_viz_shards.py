"""The sharded-layer picture (viz/shards.py, lesson 12, README): each weight's shares by card as shard.py splits it."""

import pytest
from matplotlib.colors import to_hex
from matplotlib.patches import Rectangle

from viz.shards import CARD_COLORS, plot_sharded_layer


def shares(ax, tp: int) -> dict[str, list[Rectangle]]:
    """Each card's coloured rectangles in one row of the picture, by card colour."""
    found = {c: [] for c in CARD_COLORS[:tp]}
    for patch in ax.patches:
        if isinstance(patch, Rectangle) and patch.get_fill() and to_hex(patch.get_facecolor()) in found:
            found[to_hex(patch.get_facecolor())].append(patch)
    return found


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_each_card_gets_its_share_of_every_section(tp):
    n_heads, n_kv_heads = 8, 4
    attention, mlp = plot_sharded_layer(n_heads, n_kv_heads, tp).axes
    for ax, sections in ((attention, 3), (mlp, 2)):
        for color, patches in shares(ax, tp).items():
            column, row = patches[:sections], patches[sections:]  # (the column-parallel weight is drawn first)
            assert len(column) == sections and len(row) == 1, color  # a run of each of q, k, v (gate, up)
    q, k, v = sorted(shares(attention, tp)[CARD_COLORS[0]][:3], key=lambda p: -p.get_y())
    assert q.get_height() == pytest.approx(k.get_height() * n_heads / n_kv_heads)  # by heads, not evenly
    assert k.get_height() == pytest.approx(v.get_height())


def test_more_cards_than_colours_is_refused():
    with pytest.raises(ValueError, match="tp=5"):
        plot_sharded_layer(8, 4, 5)
