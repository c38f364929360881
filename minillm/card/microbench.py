"""The microbenchmarks calibration runs: each measures one rate of this machine, none of them a model.

- bandwidth: a large copy (read + write, what the memory can do) and a matrix-vector product over
  data far bigger than any cache (what decode gets: the roofline's bandwidth);
- matmul FLOP/s: one large square matmul per dtype (the roofline's peak), and three layer-sized
  matrices (in the last-level cache) multiplied by 1 to 512 rows: a 1-row matmul is a matrix-vector
  product and reaches a fraction of the big one's FLOP/s; the rate climbs with the rows and the size;
- streaming: a 1-row matmul over many layer-sized matrices used in turn, by the size of the set
  (2 MiB to 256 MiB): in the caches, then past the last-level cache from memory: what a model's
  layers get when its weights (and the KV cache a step reads) do not fit;
- attention over the KV: the paged cache's own attend() (minillm/engine/kv_cache.py) for one layer,
  from a few hundred kilobytes of keys and values to a hundred megabytes;
- elementwise: a product of two tensors into a fresh one (norms, rotary, SiLU, residual adds);
- the fixed cost per torch call: an empty op repeated, a mix of the tiny ops a step makes, and
  minillm's own decode step on a 16-wide stand-in, where the arithmetic is nothing (its caches
  as cold as a real step leaves them).
Each figure is the better of two medians of repeats, timed as steps are (measure.step_clock: on one CPU
thread, the process's CPU time; machines are shared). Times exclude the calls' fixed cost, which the
cost model charges separately per counted call.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import torch

ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)  # matmul rows measured: decode batches and prefill chunks
# (in, out) of the rows curves' matrices, 64 KB to 11.5 MB in fp32, the sizes the model sizes' layers have (a BLAS
# reaches a different share of peak on a 256 x 64 key projection than on a 1024 x 2816 MLP matrix)
MATRICES = ((256, 64), (256, 704), (512, 1408), (1024, 2816))
MATRIX = MATRICES[2]  # the shape `describe` quotes
CACHED_MIB = 8  # the rows curves' working set (in a 32 MiB last-level cache): their rates include no streaming
STREAM_MIB = (2, 4, 8, 16, 24, 32, 48, 64, 256)  # working sets the 1-row matmul sweep is timed over
ATTENTION_HEADS = ((8, 2, 32), (8, 2, 64), (16, 4, 64))  # (query heads, kv heads, head dim): the sizes' (sizes.py)
# (sequences, cached tokens each): the first two hold the same bytes in 128 short rows and in 8 long ones (what a row
# costs beyond its bytes); the rest grow the bytes from a few hundred kilobytes to past the size (a gathered copy of
# 32 MiB) above which the allocator maps fresh pages for every copy (glibc's largest mmap threshold).
ATTENTION_POINTS = ((128, 15), (8, 255), (1, 63), (1, 511), (16, 511), (32, 511), (64, 511), (128, 511))
PREFILL_CHUNKS = (64, 512)  # chunk lengths whose attention FLOP/s is measured (on an empty cache)


def median_seconds(fn, repeats: int, device: torch.device, rounds: int = 2) -> float:
    """The lower of `rounds` medians of `repeats` calls each: other programs on a shared machine only ever slow a
    call down, so the better round is the nearer to what the machine does undisturbed."""

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    from minillm.card.measure import step_clock

    fn()  # warm-up: first calls pay for allocation and kernel selection
    fn()
    clock, medians = step_clock(device), []
    for _ in range(rounds):
        times = []
        for _ in range(repeats):
            sync()
            start = clock()
            fn()
            sync()
            times.append(clock() - start)
        medians.append(statistics.median(times))
    return min(medians)


def last_level_cache_bytes(device: torch.device) -> int:
    """The largest cache: a GPU's L2, a CPU's L3 (or L2) as Linux reports it for the first core; 0 if unknown."""
    if device.type == "cuda":
        return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0))
    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            if (index / "type").read_text().strip() in ("Unified", "Data"):
                text = (index / "size").read_text().strip()
                sizes.append(int(text[:-1]) * {"K": 2**10, "M": 2**20}[text[-1]] if text[-1] in "KM" else int(text))
        except (OSError, ValueError):
            continue
    return max(sizes, default=0)


def measure_copy_bandwidth(device: torch.device, mib: int, repeats: int) -> float:
    """Bytes per second a large copy moves (read + write)."""
    src = torch.ones(mib * 2**20 // 4, device=device)
    dst = torch.empty_like(src)
    seconds = median_seconds(lambda: dst.copy_(src), repeats, device)
    return 2 * src.numel() * 4 / seconds


def measure_matvec_bandwidth(device: torch.device, mib: int, repeats: int) -> float:
    """Bytes per second a matrix-vector product streams from a matrix of `mib` MiB (fp32)."""
    cols = 4096
    matrix = torch.randn(mib * 2**20 // (4 * cols), cols, device=device)
    vector = torch.randn(cols, device=device)
    return matrix.numel() * 4 / median_seconds(lambda: matrix @ vector, repeats, device)


def measure_matmul(device: torch.device, n: int, dtype: torch.dtype, repeats: int) -> float:
    """Dense FLOP/s of an n x n x n matmul."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    return 2 * n**3 / median_seconds(lambda: a @ b, repeats, device)


def measure_rows_curve(device: torch.device, dtype: torch.dtype, call_s: float, repeats: int, shape=MATRIX,
                       rows=ROWS) -> dict[int, float]:  # fmt: skip
    """FLOP/s of x (rows, in) @ W.T for each count of rows, W (out, in) read from the last-level cache as a model's
    layers read theirs: copies that together (CACHED_MIB) overflow the per-core caches but fit in the shared one,
    used in turn. The fixed cost of each call is taken out."""
    inputs, outputs = shape
    size = inputs * outputs * dtype.itemsize
    copies = max(1, CACHED_MIB * 2**20 // size)
    weights = [torch.randn(outputs, inputs, device=device).to(dtype) for _ in range(copies)]
    rates = {}
    for count in rows:
        x = torch.randn(count, inputs, device=device).to(dtype)
        seconds = median_seconds(lambda: [torch.nn.functional.linear(x, w) for w in weights], repeats, device)  # noqa: B023
        rates[count] = 2 * count * inputs * outputs * copies / max(seconds - copies * call_s, seconds / 10)
    return rates


def measure_call_cost(device: torch.device, repeats: int, layers: int = 4) -> float:
    """Seconds per torch call of minillm's own decode step, timed on a 16-wide stand-in of `layers` layers where the
    arithmetic is nothing: Python, module calls, dispatch and the cache's bookkeeping, per call the step makes.
    A real step streams each layer's weights through the core's caches and evicts the interpreter's own state;
    so the stand-in reads 2 MiB (a layer's worth, more than a core's L2) before each layer, and that reading's
    time is taken out again: what is left is the calls, as they run between real layers."""
    from minillm.card.measure import filled_cache, step_calls
    from minillm.config import ModelConfig
    from minillm.model.transformer import Transformer

    model = Transformer(ModelConfig(dim=16, n_layers=layers, n_heads=2, n_kv_heads=1, ffn_dim=16, max_seq_len=512))
    model = model.to(device).eval()
    calls = step_calls(model, 1, 16)
    cache, tokens = filled_cache(model, 1, 16, 4 * repeats + 16), torch.zeros(1, 1, dtype=torch.long, device=device)
    layer_weights = [torch.randn(2**19) for _ in range(layers)]  # 2 MiB each, in the CPU's caches (the host's)
    reads = median_seconds(lambda: [w.sum() for w in layer_weights], repeats, torch.device("cpu"))

    def reader(weights: torch.Tensor):
        def read(*_) -> None:  # a pre-hook that returns nothing leaves the layer's inputs as they are
            weights.sum()

        return read

    hooks = [layer.register_forward_pre_hook(reader(w)) for layer, w in zip(model.layers, layer_weights)]
    try:
        step = median_seconds(lambda: model(tokens, cache.prepare([0], 1), cache), repeats, device)
    finally:
        for hook in hooks:
            hook.remove()
    return max(step - reads, step / 2) / calls


def measure_stream_curve(device: torch.device, dtype: torch.dtype, call_s: float, repeats: int,
                         sizes_mib=STREAM_MIB, shape=MATRICES[1]) -> dict[int, float]:  # fmt: skip
    """Bytes per second a 1-row matmul reads its matrix at, by the working set it sweeps: copies of one matrix
    (256 x 704: 0.7 MB) used in turn, `mib` MiB of them. Small sets stay in the caches; past the last-level cache
    every matrix comes from memory. Measured, not assumed from the cache's size: other programs sharing the
    cache shrink the share a process keeps, and this curve sees that. (From memory, a large matrix streams
    faster than a small one: `calibrate` also times each of MATRICES over the largest set.)"""
    inputs, outputs = shape
    size = inputs * outputs * dtype.itemsize
    weights = [torch.randn(outputs, inputs, device=device).to(dtype) for _ in range(-(-max(sizes_mib) * 2**20 // size))]
    x = torch.randn(1, inputs, device=device).to(dtype)
    rates = {}
    for mib in sizes_mib:
        used = weights[: max(1, mib * 2**20 // size)]
        seconds = median_seconds(lambda: [torch.nn.functional.linear(x, w) for w in used], repeats, device)  # noqa: B023
        rates[len(used) * size] = len(used) * size / max(seconds - len(used) * call_s, seconds / 10)
    return rates


def attention_cache(device: torch.device, heads: tuple[int, int, int], sequences: int, cached: int, room: int):
    """One layer's paged KV cache with these (query heads, kv heads, head dim), whose `sequences` seats hold
    `cached` random tokens each."""
    from minillm.config import ModelConfig
    from minillm.engine.kv_cache import PagedKVCache

    heads, kv_heads, head_dim = heads
    cfg = ModelConfig(dim=heads * head_dim, n_layers=1, n_heads=heads, n_kv_heads=kv_heads, ffn_dim=8,
                      max_seq_len=cached + room)  # fmt: skip
    cache = PagedKVCache(cfg, num_blocks=sequences * -(-(cached + room) // 16), device=device)
    if cached:
        cache.prepare(list(range(sequences)), cached)
    cache.k.normal_()
    cache.v.normal_()
    return cache


def measure_attention(device: torch.device, call_s: float, repeats: int, heads=ATTENTION_HEADS[-1],
                      points=ATTENTION_POINTS, chunks=PREFILL_CHUNKS) -> list[dict]:  # fmt: skip
    """The paged cache's attend() for one layer: store this step's keys and values, gather every sequence's
    blocks, attend. For decode at ATTENTION_POINTS (bytes: the keys and values attended over, fp32) and for a
    prompt chunk at PREFILL_CHUNKS (FLOPs: every query against every key, the masked ones included)."""
    from minillm.card.measure import count_torch_calls

    shape, (heads, kv_heads, head_dim) = heads, heads
    measured = []
    shapes = [(sequences, cached, 1) for sequences, cached in points] + [(1, 0, n) for n in chunks]
    for sequences, cached, chunk in shapes:
        cache = attention_cache(device, shape, sequences, cached, chunk)
        cache.prepare(list(range(sequences)), chunk)
        q = torch.randn(sequences, chunk, heads, head_dim, device=device)  # (B, T, H, D)
        k = torch.randn(sequences, chunk, kv_heads, head_dim, device=device)  # (B, T, Hkv, D)
        run = lambda: cache.attend(0, q, k, k)  # noqa: B023 (run is called before the loop moves on)
        calls = count_torch_calls(run)
        seconds = max(median_seconds(run, repeats, device) - calls * call_s, 1e-9)
        keys = cached + chunk  # each sequence's keys after this step, read in whole blocks of 16
        kv_bytes = sequences * -(-keys // 16) * 16 * 2 * kv_heads * head_dim * 4
        flops = 4 * sequences * chunk * keys * heads * head_dim
        measured.append({"sequences": sequences, "cached": cached, "chunk": chunk, "kv_bytes": kv_bytes,
                         "flops": flops, "seconds": seconds})  # fmt: skip
    return measured


def measure_elementwise(device: torch.device, call_s: float, repeats: int) -> dict[int, float]:
    """Bytes per second of x * y into a fresh tensor (2 reads, 1 write), by the size of one operand in bytes."""
    rates = {}
    for size in (2**16, 2**20, 2**23):
        x, y = torch.randn(size // 4, device=device), torch.randn(size // 4, device=device)
        seconds = median_seconds(lambda: x * y, repeats, device)  # noqa: B023
        rates[size] = 3 * size / max(seconds - call_s, seconds / 10)
    return rates


def measure_op_cost(device: torch.device, ops: int, repeats: int) -> float:
    """Seconds per op when the op does (almost) nothing: the floor every op pays."""
    x, y = torch.ones(16, device=device), torch.ones(16, device=device)

    def loop():
        for _ in range(ops):
            torch.add(x, y)

    return median_seconds(loop, repeats, device) / ops


class _TinyNorm(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)


def measure_op_mix_cost(device: torch.device, ops: int, repeats: int) -> float:
    """Seconds per torch call in a mixed sequence of tiny ops of the kinds a transformer step makes:
    module calls, a matmul, a norm, views, an index, slices and a cat, attention. Different kinds
    cost different amounts (a view is metadata, a matmul enters a BLAS library, attention is a
    dispatcher of its own), so an empty op repeated underestimates what a model's calls cost."""
    from minillm.card.measure import count_torch_calls

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

        return median_seconds(loop, repeats, device) / (rounds * calls)
