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

Cards that split one model (tensor parallelism, tensor_parallel.py) talk over a link: NVLink between SXM cards,
PCIe between the others. Vendors print a link's bandwidth "bidirectional", both directions added; a ring
all-reduce sends and receives at once, each at the one-way rate, so LINKS keeps the one-way figure: half the headline.
Cards in different servers talk over the network (InfiniBand), whose rate is printed per direction already: a prefill
card handing a prompt's KV to a decode card in another server (kv_transfer.py) sends at that rate.
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
    link: str | None = None  # how cards of this kind talk to each other by default (LINKS); None: no known link

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
    return Device(name, label, int(memory_gib * GiB), bandwidth_gbs * 1e9, flops, link=CARD_LINKS.get(name),
                  **practical)  # fmt: skip


@dataclass(frozen=True)
class Link:
    """The connection between cards, as a tensor-parallel step sees it."""

    name: str
    label: str
    bandwidth: float  # bytes/s one way, per card: what each rank of a ring all-reduce sends (and receives) at
    # Fixed cost of one collective: kernel launch, the ranks' handshake, the first bytes' trip. Assumption, like
    # launch_s. NVLink: serving engines run small all-reduces with custom one-shot kernels (vLLM's custom_all_reduce,
    # TensorRT-LLM's): SGLang PR #2904 measured 3.7-7.8 us for 0.5-32 KB at TP 2-8 on H100 SXM, so 5 us.
    # PCIe: those kernels need NVLink (or peer-to-peer, which GeForce cards lack), so it is NCCL's ring, whose own
    # tuning model (src/graph/tuning.cc) prices a small one at 6.6 us + 1 us per hop on PCIe (2(tp-1) hops:
    # 20.6 us at 8 ranks), so 20 us.
    latency_s: float


LINKS: dict[str, Link] = {
    link.name: link
    for link in (
        # NVIDIA H100 Tensor Core GPU datasheet, SXM column: NVLink 900 GB/s (4th generation: 18 links of 50 GB/s,
        # both directions counted), so 450 GB/s each way. The H200 SXM datasheet prints the same 900 GB/s.
        Link("nvlink-4", "NVLink 4 (900 GB/s both ways)", 450e9, 5e-6),
        # NVIDIA A100 Tensor Core GPU datasheet, SXM column: NVLink 600 GB/s (3rd generation, 12 links), 300 each way.
        Link("nvlink-3", "NVLink 3 (600 GB/s both ways)", 300e9, 5e-6),
        # PCI Express 4.0 x16: 16 GT/s x 16 lanes x 128/130 encoding = 31.5 GB/s each way (the datasheets' "64 GB/s"
        # is both ways); 5.0 doubles the transfer rate: 63 GB/s each way ("128 GB/s" on the H100 PCIe datasheet).
        Link("pcie-4", "PCIe 4.0 x16 (64 GB/s both ways)", 31.5e9, 20e-6),
        Link("pcie-5", "PCIe 5.0 x16 (128 GB/s both ways)", 63e9, 20e-6),
        # Between servers: NVIDIA ConnectX-7 adapter datasheet, InfiniBand NDR 400 Gb/s per port; the DGX H100 user
        # guide gives each of its 8 GPUs one such port for the compute fabric. A network's rate is per direction
        # (full duplex), unlike NVLink's headline: 400 Gb/s = 50 GB/s each way. Latency, an assumption: a few us on
        # the wire through one switch, plus posting the transfer (RDMA: a request's blocks as one batch), so 10 us.
        Link("ib-400", "InfiniBand NDR (400 Gb/s each way)", 50e9, 10e-6),
    )
}


# Each card's link to its neighbours in a usual server, from the same datasheets as the card: NVLink for the SXM
# modules (H100 and H200 SXM: 4th generation; A100 SXM, 40 and 80 GB: 3rd), PCIe 4.0 x16 for the others (the L4
# datasheet's "PCIe Gen4 x16"; GeForce Ada has no NVLink, and a 3090's NVLink bridge is an option, not the default).
# The M2 Ultra is one chip with no link to another: tensor parallelism there needs --link.
CARD_LINKS = {"h100-sxm": "nvlink-4", "h200": "nvlink-4", "a100-80gb-sxm": "nvlink-3", "a100-40gb-sxm": "nvlink-3",
              "rtx-3090": "pcie-4", "rtx-4090": "pcie-4", "l4": "pcie-4"}  # fmt: skip


def get_link(name: str) -> Link:
    try:
        return LINKS[name]
    except KeyError:
        raise ConfigError(f"unknown link {name!r}; known: {', '.join(LINKS)}") from None


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
        # NVIDIA A10G, AWS's variant of the A10 in its G5 instances (the card of SGLang's paper, papers/sglang_*.py).
        # NVIDIA publishes no A10G datasheet. Memory and bandwidth: "24 gigabytes of GDDR6 VRAM with a memory
        # bandwidth of 600 gigabytes per second", the same as the A10's (baseten.co/blog/nvidia-a10-vs-a10g-for-ml-
        # model-inference). Dense FLOP/s: ASSUMED the A10's, FP16 tensor 125 TFLOPS dense (the A10 datasheet's, as
        # tabled in github.com/citsjtu2020/LLM-Prof hardware_spec.md) and FP32 31.24 (sysrqmts.com's A10 PCIe page);
        # the same Baseten post says the A10G's tensor compute is lower than the A10's, so prefill here is if
        # anything cheaper than on the real card (and a prefix cache's saving smaller).
        _card("a10g", "NVIDIA A10G (Ampere, 24 GB GDDR6; AWS G5)", 24, 600, fp32=31.24, bf16=125.0),
        # NVIDIA A100 Tensor Core GPU datasheet, 80GB SXM column: 2,039 GB/s HBM2e; BF16/FP16 tensor
        # 312 TFLOPS (624 with sparsity); FP32 19.5 TFLOPS. No fp8 on Ampere.
        _card("a100-80gb-sxm", "NVIDIA A100 80GB SXM (Ampere, HBM2e)", 80, 2039, fp32=19.5, bf16=312.0),
        # The same datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf), 40GB SXM column: 40GB HBM2,
        # 1,555GB/s; the same 312 dense BF16/FP16 TFLOPS and 19.5 FP32 (its 40GB PCIe column prints the same three).
        # The card of the Anyscale continuous-batching post (minillm/papers/anyscale.py).
        _card("a100-40gb-sxm", "NVIDIA A100 40GB SXM (Ampere, HBM2)", 40, 1555, fp32=19.5, bf16=312.0),
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
        # NVIDIA DGX Spark (GB10 Grace Blackwell): the product page's 128 GB of LPDDR5x unified memory at 273 GB/s and
        # "up to 1 petaFLOP of FP4 AI performance" (with sparsity: its footnote); about 31 TFLOPS of FP32 (NVIDIA at Hot
        # Chips 2025, as The Register reported it). Dense bf16 with fp32 accumulate is published nowhere: derived as
        # the RTX Blackwell whitepaper's ratio for the RTX 5090 (3,352 sparse FP4 TOPS to 209.5 dense bf16 TFLOPS,
        # 16:1), 1,000 / 16 = 62.5. The GPU shares the 128 GB with the CPU and its system; all of it is counted here.
        _card("dgx-spark", "NVIDIA DGX Spark (GB10 Blackwell, 128 GB LPDDR5x unified)", 128, 273, fp32=31.0, bf16=62.5),
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
