"""What the roofline-priced run leaves out of DistServe's systems, measured one knob at a time.

1. The engines' own step times: DistServe's simulator prices every step with latency models fitted to profiles of
   vLLM and of its own engine on an A100 (distserve_cost.py); both systems searched again paying them.
2. Requests that miss TTFT even on an idle card: a prompt whose prefill alone outlasts the TTFT target can never
   count, at any rate; where that share nears 10%, a 90% goal leaves no room for queueing and the goodput collapses.
   Counted per system and per pricing, from the sampled crowd.
3. The placement: DistServe searches it per workload (Algorithms 1 and 2); the paper's OPT-13B placement (one
   prefill instance on 2 cards, one decoding instance on 1) was found for its ShareGPT, not for the lengths assumed
   here. One more decoding instance, searched again, shows whether the decoding card's KV memory is what binds.
"""

from __future__ import annotations

from dataclasses import replace

from minillm.card.tensor_parallel import tp_step
from minillm.papers import distserve_setup as setup
from minillm.papers.distserve import Goodput, Options, app_of, deployment_of, goodputs, slos, systems_of
from minillm.papers.distserve_cost import make_runner, step_ms
from minillm.papers.distserve_trace import draw
from minillm.papers.verdict import TOLERANCE, Headline


def prefill_alone_s(model: str, tp: int, engine: str, prices: str, prompt: int) -> float:
    """Seconds to prefill one prompt on an idle instance."""
    if prices == "paper":
        return step_ms(engine, tp, [prompt], []) / 1e3
    runner = make_runner(model, tp, engine, prices)
    return tp_step(runner.spec, runner.card, [(prompt, 0)], setup.DTYPE, setup.DTYPE, tp, runner.link).time_s


def never_in_time(options: Options, prices: str) -> dict[str, float]:
    """Per system with a prefill: the share of the crowd whose prompt alone outlasts the TTFT target."""
    d, (ttft_s, _) = deployment_of(options), slos(options)
    crowd = draw(options.trace or app_of(options).trace, options.requests, options.seed)
    cards = {"vllm": (d.vllm_tp, "vllm"), "distserve": (d.placement.prefill_tp, "distserve"),
             "prefill": (d.placement.prefill_tp, "distserve")}  # fmt: skip
    shares = {}
    for system in [s for s in systems_of(options) if s in cards]:
        tp, engine = cards[system]
        slow = {p for p in set(crowd.prompts) if prefill_alone_s(d.model, tp, engine, prices, p) > ttft_s}
        shares[system] = sum(p in slow for p in crowd.prompts) / len(crowd.prompts)
    return shares


def ratio(found: dict[str, Goodput]) -> float | None:
    both = [found[k] for k in ("vllm", "distserve") if k in found]
    if len(both) == 2 and both[0].rate > 0 and all(g.bounded for g in both):
        return both[1].per_gpu / both[0].per_gpu
    return None


def per_gpu(found: dict[str, Goodput]) -> dict[str, float]:
    return {k: g.per_gpu for k, g in found.items()}


def account(options: Options, found: dict[str, Goodput], missed: list[Headline]) -> dict:
    """The three knobs above, each measured; the figures they move to."""
    paying = goodputs(options, prices="paper")
    out = {
        "missed": [h.name for h in missed],
        "roofline": {"per_gpu": per_gpu(found), "ratio": ratio(found)},
        "paper_prices": {"per_gpu": per_gpu(paying), "ratio": ratio(paying)},
        "never_in_time": {"roofline": never_in_time(options, "roofline"), "paper": never_in_time(options, "paper")},
        "ttft_s": slos(options)[0],
        "published_ratio": next((h.published for h in missed if h.about == "distserve/vllm" and not h.at_least), None),
    }
    if options.app == "chatbot-13b":
        p = deployment_of(options).placement
        wider = replace(options, systems=("distserve",), decode=p.decode + 1)
        more = goodputs(wider, start=found["distserve"].per_gpu or 1.0)["distserve"]  # (from the placement's own)
        placement = setup.Placement(p.prefill_tp, p.decode_tp, p.prefill, p.decode + 1)
        out["placement"] = {"name": placement.name, "per_gpu": more.per_gpu,
                            "ratio": more.per_gpu / found["vllm"].per_gpu if found["vllm"].rate else None}  # fmt: skip
    return out


def in_range(r: float) -> str:
    """Where a chatbot ratio sits against the paper's 2.0x-4.6x (section 6.2)."""
    low, high = setup.CHATBOT_RANGE
    return " (in the paper's range)" if low <= r <= high else " (below the paper's range)" if r < low else (
        " (above the paper's range)")  # fmt: skip


def account_text(a: dict) -> str:
    published = a.get("published_ratio")
    near = lambda r: (
        ""
        if published is None
        # noqa: E731
        else (
            f" ({'within' if abs(r / published - 1) <= TOLERANCE else 'not within'} 35% of the paper's {published:g}x)"
        )
    )
    rates = lambda d: ", ".join(f"{k} {v:.2f}" for k, v in d.items())  # noqa: E731
    late = lambda d: ", ".join(f"{k} {v:.0%}" for k, v in d.items()) or "-"  # noqa: E731
    x = lambda r: "-" if r is None else f"{r:.2f}x" + (in_range(r) if "placement" in a else near(r))  # noqa: E731
    lines = [
        f"what does not reproduce ({'; '.join(a['missed'])}), measured:",
        f"  the mechanism alone (every step priced by the roofline): per-GPU goodput {rates(a['roofline']['per_gpu'])}"
        f" req/s; DistServe over vLLM {x(a['roofline']['ratio'])}",
        f"  1. each engine's measured step times (DistServe's own profiles of vLLM and of its engine, {setup.GPU}): "
        f"{rates(a['paper_prices']['per_gpu'])} req/s; {x(a['paper_prices']['ratio'])}",
    ]
    if any(a["never_in_time"]["roofline"].values()) or any(a["never_in_time"]["paper"].values()):
        lines.append(
            f"  2. requests whose prompt alone outlasts the TTFT target ({a['ttft_s']:g} s) on an idle instance, never "
            f"counted at any rate: roofline {late(a['never_in_time']['roofline'])}; measured step times "
            f"{late(a['never_in_time']['paper'])} (near 10%, the 90% goal leaves no room to queue)"
        )
    if "placement" in a:
        p = a["placement"]
        lines.append(f"  3. the placement searched for the workload: {p['name']} (one more decoding card, the KV "
                     f"memory and decode steps doubled): DistServe {p['per_gpu']:.2f} req/s per GPU, "
                     f"{x(p['ratio'])} over vLLM (roofline)")  # fmt: skip
    return "\n".join(lines)
