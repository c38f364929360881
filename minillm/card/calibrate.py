"""Measure this machine the way the datasheets describe a card: bandwidth, FLOP/s, and a fixed cost per op.

Microbenchmarks, none of them the model:
- bandwidth, two ways, on data far bigger than any cache. A copy reads and writes every byte
  (bytes moved = 2 x size): what the memory can do. A matrix-vector product reads a big matrix
  once: what decode gets, since decode streams every weight through one. On a GPU the two
  agree within a few percent; on a CPU the matrix-vector product can reach far less than the
  copy (on this project's 2-core machine, about a third). The cost model uses the second.
- FLOP/s: one large square matmul per dtype (2 n^3 FLOPs): fp32, and bf16 / fp16 where the
  device has a fast path for them (a dtype slower than fp32 is left out: nobody would run it).
- fixed cost per op: ops on tiny tensors, where the work is nothing and the time is all Python,
  dispatch and (on a GPU) kernel launch. Two figures: an empty op repeated (the floor), and a
  mixed sequence of the kinds a transformer step calls (module calls, a matmul, a norm, views,
  an index, slices and a cat, attention), which is what a model's calls cost on average: on
  this project's 2-core machine the mix costs about 3x the empty op. The cost model uses the mix.
Each figure is a median of repeats (machines are shared). The result is a small JSON file in
the user's cache directory ($XDG_CACHE_HOME/minillm, else ~/.cache/minillm), which
`--gpu this-machine` reads (hardware.this_machine).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from minillm.model.checkpoint import resolve_device


@dataclass(frozen=True)
class Sizes:
    copy_mib: int  # per buffer (two live at once); also the fp32 matrix of the matrix-vector product
    matmul_n: int
    tiny_ops: int  # ops per timed loop
    repeats: int


DEFAULT_SIZES = {"cpu": Sizes(copy_mib=256, matmul_n=2048, tiny_ops=2000, repeats=7),
                 "cuda": Sizes(copy_mib=1024, matmul_n=8192, tiny_ops=2000, repeats=10)}  # fmt: skip


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "minillm"


def calibration_path(device: str) -> Path:
    return cache_dir() / f"calibration-{device}.json"


def _median_seconds(fn, repeats: int, device: torch.device) -> float:
    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    fn()  # warm-up: first calls pay for allocation and kernel selection
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_copy_bandwidth(device: torch.device, mib: int, repeats: int) -> float:
    """Bytes per second a large copy moves (read + write)."""
    src = torch.ones(mib * 2**20 // 4, device=device)
    dst = torch.empty_like(src)
    seconds = _median_seconds(lambda: dst.copy_(src), repeats, device)
    return 2 * src.numel() * 4 / seconds


def measure_matvec_bandwidth(device: torch.device, mib: int, repeats: int) -> float:
    """Bytes per second a matrix-vector product streams from a matrix of `mib` MiB (fp32)."""
    cols = 4096
    matrix = torch.randn(mib * 2**20 // (4 * cols), cols, device=device)
    vector = torch.randn(cols, device=device)
    return matrix.numel() * 4 / _median_seconds(lambda: matrix @ vector, repeats, device)


def measure_matmul(device: torch.device, n: int, dtype: torch.dtype, repeats: int) -> float:
    """Dense FLOP/s of an n x n x n matmul."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    return 2 * n**3 / _median_seconds(lambda: a @ b, repeats, device)


def measure_op_cost(device: torch.device, ops: int, repeats: int) -> float:
    """Seconds per op when the op does (almost) nothing: the floor every op pays."""
    x, y = torch.ones(16, device=device), torch.ones(16, device=device)

    def loop():
        for _ in range(ops):
            torch.add(x, y)

    return _median_seconds(loop, repeats, device) / ops


class _TinyNorm(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)


def measure_op_mix_cost(device: torch.device, ops: int, repeats: int) -> float:
    """Seconds per torch call in a mixed sequence of tiny ops of the kinds a transformer step makes:
    module calls, a matmul, a norm, views, an index, slices and a cat, attention. Different kinds
    cost different amounts (a view is metadata, a matmul enters a BLAS library, attention is a
    dispatcher of its own), so an empty op repeated underestimates what a model's calls cost."""
    norm, proj = _TinyNorm().to(device), torch.nn.Linear(16, 16, bias=False, device=device)
    x = torch.randn(1, 1, 16, device=device)
    table, position = torch.randn(64, 4, device=device), torch.tensor([3], device=device)
    keys = torch.randn(1, 2, 4, 8, device=device)  # (batch, heads, cached tokens, head dim)

    def mix() -> torch.Tensor:
        h = proj(norm(x))  # (1, 1, 16)
        q = h.view(1, 1, 2, 8).transpose(1, 2)  # (1, 2, 1, 8)
        rotated = torch.cat((-q[..., 4:], q[..., :4]), dim=-1) * table[position][..., :1]
        out = torch.nn.functional.scaled_dot_product_attention(rotated, keys, keys)  # (1, 2, 1, 8)
        return h + out.transpose(1, 2).reshape(1, 1, 16)

    with torch.no_grad():
        calls = count_torch_calls(mix)
        rounds = max(1, ops // calls)

        def loop():
            for _ in range(rounds):
                mix()

        return _median_seconds(loop, repeats, device) / (rounds * calls)


def count_torch_calls(fn) -> int:
    """Torch calls from Python while fn() runs (counted, not timed), the unit the fixed cost per op is
    priced in. Attribute reads (.shape, .device) are free and not counted."""
    return sum(torch_calls(fn).values())


def torch_calls(fn) -> Counter:
    """count_torch_calls, itemized: {(caller, op): calls}, where caller is the innermost function outside
    torch that made the call (e.g. 'RMSNorm.forward', 'Attention.forward' for its nn.Linear) and op the
    torch function's name ('linear', 'mul', '__getitem__')."""
    from torch.overrides import TorchFunctionMode

    torch_dir = str(Path(torch.__file__).parent)
    calls: Counter = Counter()

    class Count(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            op = getattr(func, "__name__", "")
            if op != "__get__":
                frame = sys._getframe(1)
                while frame is not None and frame.f_code.co_filename.startswith(torch_dir):
                    frame = frame.f_back  # (an nn.Linear's forward is torch's: name who called the module)
                calls[(frame.f_code.co_qualname if frame else "?", op)] += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return calls


def memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    name = platform.processor() or platform.machine()
    try:  # Linux names the CPU model here; platform.processor() is often empty
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        name = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{name}, {torch.get_num_threads()} threads"


def calibrate(device: str = "auto", sizes: Sizes | None = None, progress: bool = True, save: bool = True) -> dict:
    """Run the microbenchmarks on cpu or cuda; save and return the figures."""
    from tqdm import tqdm

    dev = resolve_device(device)
    s = sizes or DEFAULT_SIZES[dev.type]
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    if dev.type == "cuda":
        dtypes["fp16"] = torch.float16
    steps = ["copy", "matrix-vector", *(f"matmul {d}" for d in dtypes), "op cost"]
    bar = tqdm(steps, desc=f"calibrating {dev.type}", disable=not progress)
    flops = {}
    for step in bar:
        bar.set_postfix_str(step)
        if step == "copy":
            copy = measure_copy_bandwidth(dev, s.copy_mib, s.repeats)
        elif step == "matrix-vector":
            bandwidth = measure_matvec_bandwidth(dev, s.copy_mib, s.repeats)
        elif step == "op cost":
            empty_op_s = measure_op_cost(dev, s.tiny_ops, s.repeats)
            launch_s = measure_op_mix_cost(dev, s.tiny_ops, s.repeats)
        else:
            name = step.split()[1]
            flops[name] = measure_matmul(dev, s.matmul_n, dtypes[name], s.repeats)
    fast = {name: rate for name, rate in flops.items() if name == "fp32" or rate > flops["fp32"]}
    result = {
        "device": dev.type,
        "name": device_name(dev),
        "memory_bytes": memory_bytes(dev),
        "bandwidth": bandwidth,  # what decode gets: the matrix-vector figure
        "copy_bandwidth": copy,
        "flops": fast,
        "launch_s": launch_s,  # what the cost model charges per call: the mix
        "empty_op_s": empty_op_s,
        "sizes": {"copy_mib": s.copy_mib, "matmul_n": s.matmul_n, "tiny_ops": s.tiny_ops, "repeats": s.repeats},
        "torch": torch.__version__,
        "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    if save:
        path = calibration_path(dev.type)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n")
    return result


def load_calibration(device: str) -> dict | None:
    """The saved figures for 'cpu' or 'cuda', or None when this machine was never calibrated."""
    path = calibration_path(device)
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def load_or_calibrate(device: str = "auto", progress: bool = True) -> dict:
    kind = resolve_device(device).type
    return load_calibration(kind) or calibrate(kind, progress=progress)


def describe(cal: dict) -> str:
    flops = ", ".join(f"{name} {rate / 1e9:,.0f} GFLOP/s" for name, rate in cal["flops"].items())
    return (
        f"{cal['device']} ({cal['name']}): bandwidth {cal['bandwidth'] / 1e9:.1f} GB/s through a matrix-vector "
        f"product ({cal.get('copy_bandwidth', 0) / 1e9:.1f} GB/s in a copy); matmul {flops}; "
        f"fixed cost per op {cal['launch_s'] * 1e6:.2f} us in a mix of tiny ops"
        + (f" ({cal['empty_op_s'] * 1e6:.2f} us for an empty one)" if "empty_op_s" in cal else "")
        + f"  [{cal['measured_at']}]"
    )
