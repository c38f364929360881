"""The cards: memory, memory bandwidth and dense tensor FLOP/s, each from the vendor's own papers.

A decode step's time is set by two numbers of the card: how fast it streams bytes from memory
(bandwidth) and how fast it multiplies (FLOP/s). The cost model (roofline.py) needs nothing else
but two practical terms: the share of those peaks real kernels reach, and the fixed cost of
launching one kernel.

Every FLOP/s figure below is DENSE. Since Ampere, NVIDIA headlines tensor FLOP/s "with sparsity":
2:4 structured sparsity doubles the figure, and no dense LLM runs that way. Halve the headline.
GeForce cards have a second trap: their fp16/bf16 tensor rate with an fp32 accumulator (what
PyTorch, vLLM and llama.cpp use) is half the rate with an fp16 accumulator that the spec pages
show. The RTX 4090 is 165.2 dense TFLOP/s in bf16, not 330 (fp16 accumulate) or 660 (that, sparse).

Memory sizes: vendors' "24 GB" of GPU memory is 24 GiB (nvidia-smi shows 24576 MiB).
`this-machine` is not in the table: `python -m minillm calibrate` measures it (calibrate.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minillm.errors import ConfigError

GiB = 2**30
TERA = 1e12


@dataclass(frozen=True)
class Device:
    """One card, as the cost model sees it."""

    name: str
    label: str  # for people: "NVIDIA GeForce RTX 4090 (Ada, 24 GB GDDR6X)"
    memory_bytes: int
    bandwidth: float  # bytes/s from memory, the datasheet peak
    flops: dict[str, float] = field(hash=False)  # dense FLOP/s per compute dtype: fp32, bf16, fp16, fp8
    # Practical terms. Assumption, not datasheet: memory-bound kernels on these cards reach 80-90% of
    # the datasheet bandwidth (a STREAM-style copy on an H100 SXM measures about 3.0 of 3.35 TB/s) and
    # large matmuls a similar share of dense peak; one number for both keeps the roofline's formula simple.
    efficiency: float = 0.85
    # Fixed cost of one kernel: the gap between kernels when an engine replays a CUDA graph is a
    # microsecond or two; eager launches from Python cost several. Assumption: 2 us.
    launch_s: float = 2e-6
    achieved: bool = False  # True: bandwidth and FLOP/s were measured here (calibrate.py), no share of them to take

    def peak_flops(self, compute_dtype: str) -> float:
        """Dense FLOP/s for a compute dtype; a dtype the card lacks a fast path for falls back to fp32."""
        return self.flops.get(compute_dtype, self.flops["fp32"])

    def has(self, compute_dtype: str) -> bool:
        return compute_dtype in self.flops


def _card(name, label, memory_gib, bandwidth_gbs, fp32, bf16, fp16=None, fp8=None, **practical) -> Device:
    """A table row in the units the datasheets use: GiB, GB/s and dense TFLOP/s."""
    flops = {"fp32": fp32 * TERA, "bf16": bf16 * TERA, "fp16": (fp16 or bf16) * TERA}
    if fp8 is not None:
        flops["fp8"] = fp8 * TERA
    return Device(name, label, int(memory_gib * GiB), bandwidth_gbs * 1e9, flops, **practical)


DEVICES: dict[str, Device] = {
    d.name: d
    for d in (
        # NVIDIA Ampere GA102 GPU Architecture whitepaper (v2.0), Appendix A, GeForce RTX 3090 table:
        # 936 GB/s GDDR6X; peak FP16 and BF16 tensor TFLOPS with FP32 accumulate 71 (142 with sparsity;
        # the FP16-accumulate row says 142/284); FP32 35.6 TFLOPS. No fp8 tensor cores on Ampere.
        _card("rtx-3090", "NVIDIA GeForce RTX 3090 (Ampere, 24 GB GDDR6X)", 24, 936, fp32=35.6, bf16=71.0),
        # NVIDIA Ada Lovelace GPU Architecture whitepaper (v1.01), Appendix A, GeForce RTX 4090 table:
        # 1008 GB/s GDDR6X; FP16/BF16 tensor with FP32 accumulate 165.2 dense (330.4 sparse; FP16
        # accumulate 330.3 / 660.6); FP8 with FP32 accumulate 330.3 dense (660.6 sparse); FP32 82.6.
        _card("rtx-4090", "NVIDIA GeForce RTX 4090 (Ada, 24 GB GDDR6X)", 24, 1008, fp32=82.6, bf16=165.2, fp8=330.3),
        # NVIDIA L4 Tensor Core GPU datasheet: 24 GB GDDR6, 300 GB/s; FP16/BF16 tensor 242 TFLOPS and
        # FP8 485 TFLOPS, both marked "with sparsity" (dense: 121 and 242.5); FP32 30.3 TFLOPS.
        _card("l4", "NVIDIA L4 (Ada, 24 GB GDDR6)", 24, 300, fp32=30.3, bf16=121.0, fp8=242.5),
        # NVIDIA A100 Tensor Core GPU datasheet, 80GB SXM column: 2,039 GB/s HBM2e; BF16/FP16 tensor
        # 312 TFLOPS (624 with sparsity); FP32 19.5 TFLOPS. No fp8 on Ampere.
        _card("a100-80gb-sxm", "NVIDIA A100 80GB SXM (Ampere, HBM2e)", 80, 2039, fp32=19.5, bf16=312.0),
        # NVIDIA H100 Tensor Core GPU datasheet, SXM column: 80 GB HBM3, 3.35 TB/s; BF16/FP16 tensor
        # 1,979 TFLOPS and FP8 3,958 TFLOPS "with sparsity" (dense: 989.4 and 1,978.9); FP32 67 TFLOPS.
        _card("h100-sxm", "NVIDIA H100 SXM (Hopper, 80 GB HBM3)", 80, 3350, fp32=67.0, bf16=989.4, fp8=1978.9),
        # NVIDIA H200 Tensor Core GPU datasheet (SXM): 141 GB HBM3e, 4.8 TB/s; the same Hopper tensor
        # cores as the H100 SXM (1,979 / 3,958 sparse for BF16 / FP8, so 989.4 / 1,978.9 dense); FP32 67.
        _card("h200", "NVIDIA H200 SXM (Hopper, 141 GB HBM3e)", 141, 4800, fp32=67.0, bf16=989.4, fp8=1978.9),
        # Apple M2 Ultra press release (June 2023): up to 192 GB unified memory at 800 GB/s, 76-core GPU.
        # No tensor cores: the GPU's 76 cores x 128 ALUs x 2 FLOP x ~1.4 GHz give about 27.2 TFLOPS fp32,
        # and fp16/bf16 run at that same rate (derived; Apple publishes no TFLOPS figure). macOS lets the
        # GPU use about 75% of unified memory (Metal's recommendedMaxWorkingSetSize), so we count 144 GiB.
        _card("apple-m2-ultra", "Apple M2 Ultra (76-core GPU, 192 GB unified)", 144, 800, fp32=27.2, bf16=27.2),
    )
}


def from_calibration(cal: dict) -> Device:
    """A Device from measured figures (calibrate.py). They are achieved rates, not datasheet peaks,
    so the efficiency is 1: nothing is left to discount."""
    return Device(
        name="this-machine",
        label=f"this machine ({cal['device']}: {cal['name']}, measured)",
        memory_bytes=int(cal["memory_bytes"]),
        bandwidth=float(cal["bandwidth"]),
        flops={dtype: float(v) for dtype, v in cal["flops"].items()},
        efficiency=1.0,
        launch_s=float(cal["launch_s"]),
        achieved=True,
    )


def this_machine(device: str = "auto", progress: bool = True) -> Device:
    """This machine, from its calibration file; measured first (about a minute) when there is none."""
    from minillm.card.calibrate import load_or_calibrate

    return from_calibration(load_or_calibrate(device, progress=progress))


def device_names() -> list[str]:
    return [*DEVICES, "this-machine"]


def get_device(name: str, calibration_device: str = "auto") -> Device:
    """Look a card up by name; unknown names raise ConfigError listing the known ones."""
    if name == "this-machine":
        return this_machine(calibration_device)
    try:
        return DEVICES[name]
    except KeyError:
        raise ConfigError(f"unknown GPU {name!r}; known: {', '.join(device_names())}") from None
