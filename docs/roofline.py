"""Draw this machine's roofline beside two datasheet cards: docs/roofline.png (run: python docs/roofline.py).

The dots are decode steps measured here (`python -m minillm whatif --validate` saves its last sweep; this
script reuses it when it holds the smallest and the largest model size, and measures them otherwise:
a few minutes on 2 CPU cores); the lines are the op-by-op prediction and the roofline's bound; the two
bottom panels are an RTX 4090 and an H100 from their datasheets. The picture README shows.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from minillm.bench.report_roofline import roofline_figure  # noqa: E402
from minillm.card.sizes import SIZES  # noqa: E402
from minillm.card.validate import measurements_path, validate  # noqa: E402

SMALL, BIG = list(SIZES)[0], list(SIZES)[-1]


def sweep() -> dict:
    try:
        saved = json.loads(measurements_path("cpu").read_text())
        if {SMALL, BIG} <= {r["size"] for r in saved["rows"]}:
            return saved
    except (OSError, ValueError, KeyError):
        pass
    return validate("cpu", sizes=(SMALL, BIG), chunks=())


if __name__ == "__main__":
    result = sweep()
    figure = roofline_figure(result["rows"], result["calibration"], SMALL, BIG)
    figure.savefig(ROOT / "docs" / "roofline.png", dpi=90)
    print(f"docs/roofline.png from the sweep of {result['measured_at']} ({result['calibration']['name']})")
