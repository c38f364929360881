"""`whatif --validate`: the cost model held against this machine, on every size, batch and context.

Calibrate (microbenchmarks only, calibrate.py), then for each model size (sizes.py) and each point:
price the step op by op (opcost.py) with the torch calls counted on the real forward, price the same
step with the one-line roofline (roofline.py, this machine's calibrated bandwidth and peak: the bound),
and time it (measure.py). A row's error is predicted / measured - 1; the verdict is per size, median
and worst. Prompt chunks (one row of 64 to 512 new tokens) are checked the same way.

Timings on a shared machine are noisy: torch runs on one thread, each time is the better of two medians
of as many steps as fit in a few seconds (as calibration's are), and the result says how busy the
machine was (its load average before and after).
The last result is saved beside the calibration, so the app and the lesson can show this machine's
measured dots without measuring again (`this_machine`).
"""

from __future__ import annotations

import json
import os
import statistics
import time

import torch

from minillm.card import roofline
from minillm.card.calibrate import cache_dir, calibrate, describe, load_or_calibrate
from minillm.card.hardware import Device, from_calibration
from minillm.card.measure import filled_cache, step_calls, timed_samples
from minillm.card.opcost import step_bill
from minillm.card.sizes import SIZES, size_spec, timing_model
from minillm.config import resolve_device

GOALS = {"median": 0.15, "worst": 0.35, "prefill": 0.25}
BATCHES, CONTEXTS, CHUNKS = (1, 4, 16, 64, 128), (64, 512), (64, 256, 512)
GUEST_KERNELS = roofline.Kernels(per_layer=0, per_step=0, kv_passes=3)  # the roofline's bound: calls priced apart


def bound_s(spec, machine: Device, rows, calls: int) -> float:
    """The roofline's time for these rows in fp32 on this machine: max(bytes / bandwidth, FLOPs / peak), the paged
    gather's three passes over the KV counted, plus every call at the calibrated mix cost."""
    cost = roofline.step_cost(spec, machine, rows, "fp32", "fp32", GUEST_KERNELS)
    return cost.time_s + calls * machine.launch_s


def check_point(model, spec, cal: dict, machine: Device, rows, budget_s: float, chunk: int = 0) -> dict:
    """One measured step (decode rows, or one prompt chunk when `chunk`) beside its two predictions."""
    device = next(model.parameters()).device
    batch, context = len(rows), rows[0][1]
    with torch.no_grad():
        if chunk:
            calls = step_calls(model, 1, context, chunk)
            cache, fresh = filled_cache(model, 40, context, chunk), iter(range(40))
            tokens = torch.randint(0, 256, (1, chunk), device=device)
            times = timed_samples(lambda: model(tokens, cache.prepare([next(fresh)], chunk), cache, last_only=True),
                                  device, budget_s, least=6, most=30)  # fmt: skip
            priced = [(chunk, context)]
        else:
            calls = step_calls(model, batch, context)
            cache = filled_cache(model, batch, context, 60)
            tokens, seats = torch.randint(0, 256, (batch, 1), device=device), list(range(batch))
            times = timed_samples(lambda: model(tokens, cache.prepare(seats, 1), cache), device, budget_s)
            middle = context + 2 + len(times) // 2  # the context grew by one token per timed step
            priced = [(1, middle)] * batch
    bill = step_bill(spec, cal, priced, calls, logits_rows=1 if chunk else batch)
    half = len(times) // 2  # the better of two medians: other programs only ever slow a step down
    measured = min(statistics.median(times[:half]), statistics.median(times[half:]))
    terms = {name: seconds / measured for name, seconds in bill.terms().items()}
    return {"size": spec.name, "batch": batch, "context": context, "chunk": chunk, "calls": calls,
            "samples": len(times), "measured_s": measured, "predicted_s": bill.time_s,
            "error": bill.time_s / measured - 1, "bound_s": bound_s(spec, machine, priced, calls),
            "dominant": bill.dominant, "terms": bill.terms(), "shares": terms}  # fmt: skip


def summarize_errors(rows: list[dict]) -> dict:
    errors = [abs(r["error"]) for r in rows]
    return {"median_abs_error": statistics.median(errors), "worst_abs_error": max(errors), "points": len(rows)}


def validate(device="auto", sizes=tuple(SIZES), batches=BATCHES, contexts=CONTEXTS, chunks=CHUNKS, budget_s=4.0,
             progress=True, calibration=None, save=True) -> dict:  # fmt: skip
    """Calibrate, then predict and time every size x batch x context (decode) and size x chunk (prefill).
    calibration: reuse these figures instead of measuring again (tests, the bench)."""
    from tqdm import tqdm

    dev = resolve_device(device)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one core: steadier on a shared machine, and what calibrate measured
    try:
        started, load = time.perf_counter(), os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        cal = calibration or calibrate(dev.type, progress=progress)
        machine = from_calibration(cal)
        plan = [(s, b, c, 0) for s in sizes for c in contexts for b in batches] + [
            (s, 1, 0, n) for s in sizes for n in chunks
        ]
        rows, loaded = [], (None, None)
        for name, batch, context, chunk in tqdm(plan, desc="steps", disable=not progress):
            if loaded[0] != name:  # one size in memory at a time
                loaded = (name, timing_model(name, dev))
            model = loaded[1]
            point = [(chunk or 1, context)] * batch
            rows.append(check_point(model, size_spec(name), cal, machine, point, budget_s, chunk))
    finally:
        torch.set_num_threads(threads)
    decode = [r for r in rows if not r["chunk"]]
    prefill = [r for r in rows if r["chunk"]]
    per_size = {name: summarize_errors([r for r in decode if r["size"] == name]) for name in sizes}
    result = {
        "calibration": cal, "device": dev.type, "rows": rows, "per_size": per_size,
        "decode": summarize_errors(decode), "prefill": summarize_errors(prefill) if prefill else None,
        "goals": GOALS, "load_before": load, "load_after": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "seconds": time.perf_counter() - started, "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }  # fmt: skip
    result["met"] = all(
        s["median_abs_error"] <= GOALS["median"] and s["worst_abs_error"] <= GOALS["worst"] for s in per_size.values()
    ) and (not prefill or result["prefill"]["worst_abs_error"] <= GOALS["prefill"])
    if save:
        path = measurements_path(dev.type)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result) + "\n")
    return result


def measurements_path(device: str):
    return cache_dir() / f"roofline-{device}.json"


def measurements(device: str) -> dict:
    """The last saved `whatif --validate` (or `bench --roofline`) result on this kind of device; {} if none."""
    try:
        return json.loads(measurements_path(device).read_text())
    except (OSError, ValueError):
        return {}


def this_machine(device: str = "auto") -> dict:
    """What the app's what-if tab needs for "this machine": the card calibrated here (a hardware.Device, priced by
    the same roofline as the datasheet cards), the calibration's figures, and the last measured steps
    (`whatif --validate` or `bench --roofline`; [] until one has run), each with its two predictions."""
    kind = resolve_device(device).type
    cal, saved = load_or_calibrate(kind, progress=False), measurements(kind)
    dots = [{key: r[key] for key in ("size", "batch", "context", "chunk", "measured_s", "predicted_s", "bound_s")}
            for r in saved.get("rows", [])]  # fmt: skip
    return {"card": from_calibration(cal), "calibration": cal, "description": describe(cal), "dots": dots,
            "measured_at": saved.get("measured_at")}  # fmt: skip


def validation_text(v: dict) -> str:
    lines = [f"calibration ({v['calibration']['seconds']:.0f} s): {describe(v['calibration'])}", ""]
    lines.append("size  batch  context  chunk  calls  predicted ms  measured ms   error   bound ms  dominant term")
    for r in v["rows"]:
        lines.append(
            f"{r['size']:>4}  {r['batch']:>5}  {r['context']:>7}  {r['chunk'] or '':>5}  {r['calls']:>5}  "
            f"{r['predicted_s'] * 1e3:>12.2f}  {r['measured_s'] * 1e3:>11.2f}  {r['error']:>+6.0%}  "
            f"{r['bound_s'] * 1e3:>9.2f}  {r['dominant']} ({r['shares'][r['dominant']]:.0%})"
        )
    lines.append("")
    for name, s in v["per_size"].items():
        lines.append(f"{name:>5}: decode median {s['median_abs_error']:.0%}, worst {s['worst_abs_error']:.0%} "
                     f"({s['points']} points)")  # fmt: skip
    if v["prefill"]:
        p = v["prefill"]
        lines.append(f"prefill chunks: median {p['median_abs_error']:.0%}, worst {p['worst_abs_error']:.0%}")
    g, load = v["goals"], v["load_before"]
    busy = "" if load is None else f"; load average {load:.1f} before, {v['load_after']:.1f} after, on "
    lines.append(f"goals: median at most {g['median']:.0%} and worst at most {g['worst']:.0%} per size, prefill "
                 f"within {g['prefill']:.0%}: {'met' if v['met'] else 'not met'}{busy}{os.cpu_count()} cores; "
                 f"{v['seconds']:.0f} s")  # fmt: skip
    return "\n".join(lines)
