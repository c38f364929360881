"""`bench --roofline`: this machine's roofline, measured and predicted, and the real cards against published figures.

roofline   every size x batch (1..128) x context (whatif --validate's sweep, denser in batch): the decode step
           measured, the op-by-op prediction and the roofline's bound beside it; prompt chunks too; then the
           published table (published.py), each figure beside run --simulate's prediction
"""

from __future__ import annotations

from minillm.model.transformer import Transformer


def bench_roofline(model: Transformer, s) -> dict:
    from minillm.bench.published import bench_published
    from minillm.card.validate import validate

    device = next(model.parameters()).device.type
    batches = (1, 8, 64, 128) if s.quick else (1, 2, 4, 8, 16, 32, 64, 128)
    chunks = (64, 512) if s.quick else (64, 128, 256, 512)
    v = validate(device, batches=batches, chunks=chunks, budget_s=1.0 if s.quick else 2.0, progress=False)
    published = bench_published(model, s)
    keys = ("calibration", "rows", "per_size", "decode", "prefill", "goals", "load_before", "load_after", "met")
    return {key: v[key] for key in keys} | {"published": published}
