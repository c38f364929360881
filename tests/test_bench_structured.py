"""`python -m minillm bench --only structured` at a tiny size: every figure it reports is there and means what it says
(the constraint that changes no token changes none, constrained replies are JSON or a prefix their pattern allows),
the report renders it, and the timing wrappers leave the engine as they found it."""

from __future__ import annotations

from minillm.bench.common import BenchSettings
from minillm.bench.report import markdown
from minillm.bench.speculation import CROWDS
from minillm.bench.structured import TEMPERATURES, TINY, MaskClock, bench_structured
from minillm.bench.suite import BENCHES
from minillm.layers import sampling
from minillm.layers.constrain import Constraints


def test_the_structured_entry_runs_at_a_tiny_size_and_reports(shipped_model):
    originals = (Constraints.masks, Constraints.allowed_counts, sampling.allowed_logits)
    r = bench_structured(shipped_model, BenchSettings(quick=True), TINY)
    assert (Constraints.masks, Constraints.allowed_counts, sampling.allowed_logits) == originals
    assert BENCHES["structured"] is bench_structured

    assert [x["batch"] for x in r["mask_cost"]] == list(TINY.batches)
    for x in r["mask_cost"]:
        assert x["same_replies"] and x["step_s"] > 0 and x["work_s"] > 0  # (a constrained step does mask work)
    assert r["crowd"]["same_replies"] and r["crowd"]["none_tokens_per_s"] > 0 and r["crowd"]["half_tokens_per_s"] > 0

    rows = {x["constraint"]: x for x in r["valid_json"]}
    assert set(rows) == {"none", "json_object", "json_schema"}
    for name in ("json_object", "json_schema"):  # every constrained reply: JSON, or cut short inside its pattern
        assert rows[name]["valid"] + rows[name]["cut_valid_prefix"] == rows[name]["replies"] == TINY.asks

    assert [(x["task"], x["temperature"]) for x in r["speculation"]] == [(t, c) for t in CROWDS for c in TEMPERATURES]
    assert all(0 <= x["acceptance"] <= 1 and x["spec_tokens_per_s"] > 0 for x in r["speculation"])

    text = markdown({"machine": "this one", "device": "cpu", "date": "today", "structured": r}, "bench")
    assert "## 16. Output that obeys" in text and "| json_object |" in text and "| spell | 0.5 |" in text


def test_the_mask_clock_times_what_it_wraps_and_puts_it_back():
    original = Constraints.masks
    with MaskClock() as clock:
        assert Constraints.masks is not original
        Constraints().masks(type("NoBatch", (), {"sampled": []})(), 4, "cpu")  # (no row constrained: None)
    assert Constraints.masks is original and clock.seconds > 0
