"""Draw one layer of the shipped model split over two cards: docs/sharded-layer.png (run: python docs/sharded_layer.py).

The picture README shows beside tensor parallelism, and lesson 12 draws in its notebook (viz/shards.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from minillm.model.checkpoint import load_model  # noqa: E402
from viz.shards import plot_sharded_layer  # noqa: E402

if __name__ == "__main__":
    cfg = load_model(device="cpu").cfg
    out = ROOT / "docs" / "sharded-layer.png"
    plot_sharded_layer(cfg.n_heads, cfg.n_kv_heads, tp=2, figsize=(10.0, 4.6)).savefig(out, dpi=110)
    print(f"wrote {out.relative_to(ROOT)}")
