"""The op-by-op predictor: what one step of minillm's own forward costs on a calibrated machine.

The roofline (roofline.py) is the bound physics sets: every byte once at full bandwidth, every FLOP at
full peak, the larger of the two. A real runtime adds to it, and on a CPU (or an eager GPU step) what it
adds is most of the time. This predictor prices the same step from its parts, each at the rate
calibrate.py measured for that kind of work:

    matmuls      2 x rows x in x out FLOPs per linear layer, at the FLOP/s a matmul of that many rows through
                 a matrix that size reaches (a 1-row matmul is a matrix-vector product: a fraction of a big
                 matmul's rate)
    streaming    when what a step touches (its weights and the KV cache it reads) outgrows the cache, each
                 matmul must also bring its matrix in from memory: weight bytes x (1 / the rate a 1-row matmul
                 streams a matrix that size from memory - 1 / its rate from the cache), times how far the
                 step's working set is past the cache on the measured curve (0 to 1)
    attention    each layer stores the new keys and values, gathers every row's blocks into one tensor
                 (a fresh copy) and attends: priced from the cache's own attend() measured at several sizes
    elementwise  norms, rotary, SiLU, residual adds: the bytes they read and write, at the elementwise rate
    calls        every torch call pays a fixed cost (Python, dispatch, module calls, the cache's bookkeeping;
                 on a GPU the kernel launch), timed on a 16-wide stand-in of minillm's own step, times
                 the calls the step really makes, COUNTED on the real forward (measure.count_torch_calls),
                 never assumed: fusing three projections into one changes the count, and the price follows

On a CPU the terms add: on one core, one op runs after another. On a GPU the host issues calls while the
device runs the earlier ones, so a step takes the longer of the two (StepBill.time_s). `step_bill` returns
the terms one by one, so the lesson can say which one dominates where the predictor and the roofline part ways.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from minillm.card.microbench import CACHED_MIB
from minillm.card.modelspec import ModelSpec
from minillm.errors import ConfigError

WEIGHT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}  # what minillm's forward can run in
BLOCK = 16  # tokens per KV block: the gather reads whole blocks


@dataclass(frozen=True)
class StepBill:
    """One step's predicted seconds, by kind of work."""

    calls: int
    calls_s: float  # the fixed cost of every torch call
    matmul_s: float  # linear layers' FLOPs at the FLOP/s for their number of rows
    stream_s: float  # bringing weights in from memory (0 while the step's working set fits in the cache)
    attention_s: float  # storing, gathering and attending over the KV cache
    elementwise_s: float  # norms, rotary, SiLU, residual adds
    overlapped: bool = False  # a GPU: the host issues calls while the device runs earlier ones

    @property
    def work_s(self) -> float:
        return self.matmul_s + self.stream_s + self.attention_s + self.elementwise_s

    @property
    def time_s(self) -> float:
        """On a CPU the calls and the work run one after the other on one core: their sum. On a GPU the launches
        are asynchronous: the step takes whichever is longer, issuing the calls or running the kernels."""
        return max(self.calls_s, self.work_s) if self.overlapped else self.calls_s + self.work_s

    def terms(self) -> dict[str, float]:
        return {"calls": self.calls_s, "matmuls": self.matmul_s, "streaming": self.stream_s,
                "attention": self.attention_s, "elementwise": self.elementwise_s}  # fmt: skip

    @property
    def dominant(self) -> str:
        terms = self.terms()
        return max(terms, key=terms.get)


def _interpolate(points: list[tuple[float, float]], x: float) -> float:
    """y at x on the log-log line between the two measured points around it; beyond the measured range, the
    nearest end's y (rates are flat past what was measured)."""
    points = sorted(points)
    if x <= points[0][0]:
        return points[0][1]
    if x >= points[-1][0]:
        return points[-1][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= x <= x1:
            share = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return math.exp(math.log(y0) + share * (math.log(y1) - math.log(y0)))
    raise AssertionError("unreachable")


def matmul_flops(cal: dict, rows: int, shape: tuple[int, int]) -> float:
    """FLOP/s a matmul of `rows` rows through an (in, out) matrix reaches here: calibrated by rows for a few matrix
    sizes, interpolated in the rows, then in the size (in x out)."""
    by_size = []
    for key, curve in cal["rows_flops"].items():
        inputs, outputs = (int(n) for n in key.split("x"))
        by_size.append((inputs * outputs, _interpolate([(int(r), rate) for r, rate in curve.items()], rows)))
    return _interpolate(by_size, shape[0] * shape[1])


def attention_points(cal: dict, spec: ModelSpec) -> list[dict]:
    """The attention measurements for this model's head shape, or the nearest one measured (head dim first, then
    query heads per kv head, then heads)."""
    shapes = {tuple(int(n) for n in key.split("x")): points for key, points in cal["attention"].items()}
    want = (spec.heads, spec.kv_heads, spec.head_dim)
    distance = lambda s: (abs(math.log(s[2] / want[2])), abs(math.log(s[0] * want[1] / (s[1] * want[0]))),
                          abs(math.log(s[0] / want[0])))  # fmt: skip
    return shapes[min(shapes, key=distance)]


def attention_row_seconds(points: list[dict]) -> float:
    """What one row costs attend() beyond its bytes: the same bytes as 128 short rows and as 8 long ones."""
    short, long_ = points[:2]
    return max(0.0, (short["seconds"] - long_["seconds"]) / (short["sequences"] - long_["sequences"]))


def attention_seconds(points: list[dict], rows: int, kv_bytes: float, queries: int, flops: float) -> float:
    """One group's attend(): each row a fixed cost, and its keys and values at the time per byte measured for that
    many bytes (gathered into a fresh copy, then read by attention); a prompt chunk (many queries) at least its
    FLOPs at the attention FLOP/s measured for chunks that long."""
    per_row = attention_row_seconds(points)
    decode = [p for p in points if p["chunk"] == 1]
    per_byte = _interpolate([(p["kv_bytes"], max(p["seconds"] - p["sequences"] * per_row, 0.1 * p["seconds"])
                              / p["kv_bytes"]) for p in decode], kv_bytes)  # fmt: skip
    seconds = rows * per_row + kv_bytes * per_byte
    if queries > 1:
        per_flop = _interpolate([(p["chunk"], p["seconds"] / p["flops"]) for p in points if p["chunk"] > 1], queries)
        seconds = max(seconds, flops * per_flop)
    return seconds


def elementwise_bandwidth(cal: dict, operand_bytes: float) -> float:
    return _interpolate([(int(size), rate) for size, rate in cal["elementwise_bandwidth"].items()], operand_bytes)


def elementwise_floats_per_token(spec: ModelSpec) -> int:
    """Floats one token's elementwise ops read and write in one layer of minillm's forward (transformer.py):
    two RMSNorms (square, mean, scale, weight: 7 x hidden each), rotary on q and k (negate, cat, two
    products and a sum: 9 per value), storing k and v (4 per value), the attention output's reshape
    (2 x q), two residual adds (3 x hidden each), SiLU and the gate product (5 x intermediate)."""
    return 20 * spec.hidden + 11 * spec.q_dim + 13 * spec.kv_dim + 5 * spec.intermediate


def linear_shapes(spec: ModelSpec) -> list[tuple[int, int]]:
    """(in, out) of one layer's linear layers: q, k, v, o, gate, up, down."""
    h, q, kv, f = spec.hidden, spec.q_dim, spec.kv_dim, spec.intermediate
    return [(h, q), (h, kv), (h, kv), (q, h), (h, f), (h, f), (f, h)]


def streamed_share(cal: dict, working_set: float) -> float:
    """How much of the way from "the cache holds the weights" (0) to "every weight comes from memory" (1) a step
    with this working set is, read off the measured curve of 1-row rates by working set."""
    curve = [(int(size), 1 / rate) for size, rate in cal["stream_bandwidth"].items()]
    cached, memory = _interpolate(curve, CACHED_MIB * 2**20), max(curve)[1]  # (the largest set: from memory)
    if memory <= cached:
        return 0.0
    return min(1.0, max(0.0, (_interpolate(curve, working_set) - cached) / (memory - cached)))


def stream_seconds_per_byte(cal: dict, shape: tuple[int, int], size: int) -> float:
    """What a 1-row matmul through an (in, out) matrix spends per weight byte bringing it in from memory, beyond its
    time from the cache (the rows curves' rate: 2 FLOPs per weight of `size` bytes)."""
    by_size = [(int(k.split("x")[0]) * int(k.split("x")[1]), 1 / rate) for k, rate in cal["stream_by_shape"].items()]
    cached = 2 / (size * matmul_flops(cal, 1, shape))
    return max(0.0, _interpolate(by_size, shape[0] * shape[1]) - cached)


def groups_of(rows) -> list[tuple[int, int, int]]:
    """The cache attends rows of equal length together (packing.py): (rows, new tokens each, longest context
    after the step) per group."""
    by_length: dict[int, list[int]] = {}
    for new, before in rows:
        by_length.setdefault(new, []).append(before + new)
    return [(len(ends), new, max(ends)) for new, ends in by_length.items()]


def step_bill(spec: ModelSpec, cal: dict, rows, calls: int, dtype: str = "fp32", logits_rows: int | None = None):
    """Predicted seconds of one paged step of minillm's forward on the calibrated machine `cal`.
    rows: (new_tokens, cached_before) per row; calls: torch calls the step makes (counted on the real forward);
    logits_rows: rows whose next token is computed (default: every row)."""
    if "rows_flops" not in cal:
        raise ConfigError("this calibration lacks the op-by-op rates; run `python -m minillm calibrate`")
    if dtype not in WEIGHT_BYTES:
        raise ConfigError(f"minillm's forward runs in {', '.join(WEIGHT_BYTES)}, not {dtype!r}")
    rows = list(rows)
    if not rows or any(new < 1 or before < 0 for new, before in rows):
        raise ConfigError(f"a step needs rows of (new_tokens >= 1, cached_tokens >= 0), got {rows}")
    tokens, size = sum(new for new, _ in rows), WEIGHT_BYTES[dtype]
    logits = len(rows) if logits_rows is None else logits_rows
    linears = [(tokens, shape, spec.layers) for shape in linear_shapes(spec)] + [(logits, (spec.hidden, spec.vocab), 1)]
    matmul_s = sum(count * 2 * m * i * o / matmul_flops(cal, m, (i, o)) for m, (i, o), count in linears)
    attention_s, points, kv_total = 0.0, attention_points(cal, spec), 0
    for count, new, longest in groups_of(rows):
        kv_bytes = count * -(-longest // BLOCK) * BLOCK * 2 * spec.kv_dim * 4  # the gather pads to the longest
        kv_total += spec.layers * kv_bytes
        flops = 4 * count * new * longest * spec.heads * spec.head_dim
        attention_s += spec.layers * attention_seconds(points, count, kv_bytes, new, flops)
    weights = sum(count * i * o for _, (i, o), count in linears) * size
    share = streamed_share(cal, weights + 2 * kv_total)  # the step touches its weights, the KV pool and its copy
    stream_s = share * sum(count * i * o * size * stream_seconds_per_byte(cal, (i, o), size) for _, (i, o), count in
                           linears)  # fmt: skip
    element_bytes = 4 * tokens * spec.layers * elementwise_floats_per_token(spec)
    elementwise_s = element_bytes / elementwise_bandwidth(cal, 4 * tokens * spec.hidden)
    call_s = cal.get("call_s", cal["launch_s"])  # minillm's own calls, timed on a stand-in; else the tiny-op mix
    return StepBill(calls, calls * call_s, matmul_s, stream_s, attention_s, elementwise_s,
                    overlapped=cal["device"] == "cuda")  # fmt: skip
