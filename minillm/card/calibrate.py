"""Measure this machine the way the datasheets describe a card, and the few rates more a real runtime needs.

A datasheet gives two numbers, bandwidth and FLOP/s: the roofline (roofline.py) needs nothing else.
The op-by-op predictor (opcost.py) that explains a step measured HERE needs what a runtime adds
to them, each measured by a microbenchmark of its own (microbench.py), none of them the model:
- bandwidth, through a large copy and through a matrix-vector product over data far bigger than the
  last-level cache (the roofline's bandwidth: what decode gets);
- matmul FLOP/s: a large square matmul per dtype (the roofline's peak), and by rows, 1 to 512,
  through a matrix that stays in the cache (a 1-row matmul reaches a fraction of the peak);
- streaming: how fast a 1-row matmul reads its matrix, by the working set (in the cache, from memory);
- attention over the KV cache: the paged cache's own attend() for one layer, at several sizes;
- elementwise bandwidth (norms, rotary, SiLU, residual adds);
- the fixed cost per torch call: Python, dispatch and (on a GPU) the kernel launch: a mix of the tiny
  ops a step makes (on this project's 2-core machine about 3x an empty op: the roofline's launch cost
  for this machine), and minillm's own decode step on a 16-wide stand-in, per call (the predictor's).
About 15 s on 2 CPU cores (goal: at most 60). The result is a small JSON file in the user's cache
directory ($XDG_CACHE_HOME/minillm, else ~/.cache/minillm), which `--gpu this-machine` reads
(hardware.this_machine); a file from an older version of this list is measured again.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from minillm.card import microbench as mb
from minillm.config import resolve_device

VERSION = 4  # what the file holds; an older file lacks (some of) the op-by-op rates and is measured again


@dataclass(frozen=True)
class Sizes:
    copy_mib: int  # per buffer (two live at once); also the fp32 matrix of the matrix-vector product
    matmul_n: int
    tiny_ops: int  # ops per timed loop
    repeats: int
    op_by_op: bool = True  # also the rows curve, streaming, attention and elementwise rates (opcost.py)
    attention_points: tuple = mb.ATTENTION_POINTS  # (sequences, cached tokens) timed through attend()
    chunks: tuple = mb.PREFILL_CHUNKS  # prompt chunk lengths whose attention FLOP/s is timed
    rows: tuple = mb.ROWS  # rows of the matmul curves
    attention_heads: tuple = mb.ATTENTION_HEADS  # (query heads, kv heads, head dim) attend() is timed with
    stream_mib: tuple = mb.STREAM_MIB  # working sets of the streaming curve (MiB)


DEFAULT_SIZES = {"cpu": Sizes(copy_mib=256, matmul_n=2048, tiny_ops=2000, repeats=7),
                 "cuda": Sizes(copy_mib=1024, matmul_n=8192, tiny_ops=2000, repeats=10)}  # fmt: skip


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "minillm"


def calibration_path(device: str) -> Path:
    return cache_dir() / f"calibration-{device}.json"


def memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def device_name(device: torch.device, threads: int) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    name = platform.processor() or platform.machine()
    try:  # Linux names the CPU model here; platform.processor() is often empty
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        name = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{name}, {threads} thread{'s' * (threads != 1)}"


def measure_all(dev: torch.device, s: Sizes, progress: bool) -> dict:
    """Every microbenchmark of the list above, in order (the op cost first: the others take it out of their times)."""
    from tqdm import tqdm

    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    if dev.type == "cuda":
        dtypes["fp16"] = torch.float16
    steps = ["op cost", "copy", "matrix-vector", *(f"matmul {d}" for d in dtypes)]
    steps += ["rows", "streaming", "attention", "elementwise"] * s.op_by_op
    bar = tqdm(steps, desc=f"calibrating {dev.type}", disable=not progress)
    main = torch.float32  # the dtype minillm's forward runs in
    out: dict = {"flops": {}}
    with torch.no_grad():
        for step in bar:
            bar.set_postfix_str(step)
            if step == "op cost":
                out["empty_op_s"] = mb.measure_op_cost(dev, s.tiny_ops, s.repeats)
                out["launch_s"] = call = mb.measure_op_mix_cost(dev, s.tiny_ops, s.repeats)
                out["call_s"] = mb.measure_call_cost(dev, s.repeats)
            elif step == "copy":
                out["copy_bandwidth"] = mb.measure_copy_bandwidth(dev, s.copy_mib, s.repeats)
            elif step == "matrix-vector":
                out["bandwidth"] = mb.measure_matvec_bandwidth(dev, s.copy_mib, s.repeats)
            elif step.startswith("matmul"):
                name = step.split()[1]
                if name != "fp32" and not faster_than_fp32(dev, dtypes[name]):
                    continue  # (left out below anyway; a CPU without bf16 units took minutes over the big one)
                out["flops"][name] = mb.measure_matmul(dev, s.matmul_n, dtypes[name], s.repeats)
            elif step == "rows":
                out["rows_flops"] = {  # (JSON keys are text)
                    f"{i}x{o}": {str(r): f for r, f in mb.measure_rows_curve(dev, main, call, s.repeats, (i, o),
                                                                             s.rows).items()}
                    for i, o in mb.MATRICES
                }  # fmt: skip
            elif step == "streaming":
                curve = mb.measure_stream_curve(dev, main, call, s.repeats, s.stream_mib)
                out["stream_bandwidth"] = {str(size): rate for size, rate in curve.items()}
                out["stream_by_shape"] = {  # from memory: each matrix size at the largest working set
                    f"{i}x{o}": max(mb.measure_stream_curve(dev, main, call, s.repeats, s.stream_mib[-1:],
                                                            (i, o)).values())
                    for i, o in mb.MATRICES
                }  # fmt: skip
            elif step == "attention":  # per head shape: a row's overhead and a byte's cost both depend on it
                out["attention"] = {
                    "x".join(map(str, heads)): mb.measure_attention(dev, call, s.repeats, heads,
                                                                    s.attention_points, s.chunks)
                    for heads in s.attention_heads
                }  # fmt: skip
            else:
                rates = mb.measure_elementwise(dev, call, s.repeats)
                out["elementwise_bandwidth"] = {str(size): rate for size, rate in rates.items()}
    flops = out["flops"]  # a dtype slower than fp32 is left out: nobody would run it
    out["flops"] = {name: rate for name, rate in flops.items() if name == "fp32" or rate > flops["fp32"]}
    return out


def faster_than_fp32(dev: torch.device, dtype: torch.dtype, n: int = 256) -> bool:
    """A quick look (milliseconds) before the big matmul: does `dtype` multiply faster than fp32 here at all? A CPU
    that emulates bfloat16 runs it several times slower, and a 2048-wide matmul of it then takes seconds per call."""
    return mb.measure_matmul(dev, n, dtype, 3) > mb.measure_matmul(dev, n, torch.float32, 3)


def calibrate(device: str = "auto", sizes: Sizes | None = None, progress: bool = True, save: bool = True) -> dict:
    """Run the microbenchmarks on cpu or cuda (a CPU on one thread: the core the cost model describes, and
    steadier when the machine is shared); save and return the figures."""
    started, threads = time.perf_counter(), torch.get_num_threads()
    dev = resolve_device(device)
    if dev.type == "cpu":
        torch.set_num_threads(1)
    try:
        used = torch.get_num_threads()
        measured = measure_all(dev, sizes or DEFAULT_SIZES[dev.type], progress)
    finally:
        torch.set_num_threads(threads)
    s = sizes or DEFAULT_SIZES[dev.type]
    result = (
        {
            "version": VERSION,
            "device": dev.type,
            "name": device_name(dev, used),
            "threads": used,
            "memory_bytes": memory_bytes(dev),
            "cache_bytes": mb.last_level_cache_bytes(dev),  # the last-level cache: weights beyond it stream
            "compute_dtype": "fp32",  # the dtype of the op-by-op rates
        }
        | measured  # bandwidth (the matrix-vector figure: what decode gets), flops, launch_s (the mix), ...
        | {
            "sizes": {"copy_mib": s.copy_mib, "matmul_n": s.matmul_n, "tiny_ops": s.tiny_ops, "repeats": s.repeats},
            "seconds": time.perf_counter() - started,
            "torch": torch.__version__,
            "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        }
    )
    if save:
        path = calibration_path(dev.type)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n")
    return result


def load_calibration(device: str) -> dict | None:
    """The saved figures for 'cpu' or 'cuda', or None when this machine was never calibrated (or by an older
    version that lacks the op-by-op rates)."""
    path = calibration_path(device)
    try:
        cal = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return cal if isinstance(cal, dict) and cal.get("version") == VERSION else None


def load_or_calibrate(device: str = "auto", progress: bool = True) -> dict:
    kind = resolve_device(device).type
    return load_calibration(kind) or calibrate(kind, progress=progress)


def describe(cal: dict) -> str:
    flops = ", ".join(f"{name} {rate / 1e9:,.0f} GFLOP/s" for name, rate in cal["flops"].items())
    text = (
        f"{cal['device']} ({cal['name']}): bandwidth {cal['bandwidth'] / 1e9:.1f} GB/s through a matrix-vector "
        f"product ({cal.get('copy_bandwidth', 0) / 1e9:.1f} GB/s in a copy); matmul {flops}; "
        f"fixed cost per op {cal['launch_s'] * 1e6:.2f} us in a mix of tiny ops"
        + (f" ({cal['empty_op_s'] * 1e6:.2f} us for an empty one)" if "empty_op_s" in cal else "")
    )
    if "rows_flops" in cal:
        rows = cal["rows_flops"][f"{mb.MATRIX[0]}x{mb.MATRIX[1]}"]
        stream = {int(size): rate for size, rate in cal["stream_bandwidth"].items()}
        text += (
            f"; {cal['call_s'] * 1e6:.2f} us per call of minillm's own step; through a {mb.MATRIX[0]}x{mb.MATRIX[1]} "
            f"matrix a matmul of 1 row reaches {rows['1'] / 1e9:.0f} GFLOP/s, of 512 rows {rows['512'] / 1e9:.0f}; "
            f"1-row streaming {stream[min(stream)] / 1e9:.0f} GB/s over {min(stream) / 2**20:.0f} MiB, "
            f"{stream[max(stream)] / 1e9:.1f} GB/s over {max(stream) / 2**20:.0f} MiB; last-level cache "
            f"{cal['cache_bytes'] / 2**20:.0f} MiB; measured in {cal['seconds']:.0f} s"
        )
    return text + f"  [{cal['measured_at']}]"
