"""A running server's figures, in the Prometheus text format that monitoring tools scrape from /metrics.

Three kinds of figure, as in every serving engine's /metrics:
  gauge      a value now            requests running and waiting, KV blocks used and in the pool
  counter    a total that only grows steps, tokens produced, prompt tokens computed, preemptions, requests by how
                                    they ended
  histogram  counts per bucket      TTFT and inter-token latency, measured on the engine's clock

The names follow vLLM's (vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc,
vllm:generation_tokens_total, vllm:num_preemptions_total, vllm:time_to_first_token_seconds,
vllm:inter_token_latency_seconds: docs.vllm.ai, "Metrics" design page), with a minillm_ prefix.
The engine thread writes these; /metrics asks it (ServeLoop.ask) for a rendering between two steps.
These are the server's view: a client's TTFT adds the network and the HTTP handling (loadgen.py measures it).
With replicas (router.py), fleet_text labels every replica's samples replica="i" and adds the router's figures;
its prefix cache's queries and hits count tokens, as vLLM's vllm:prefix_cache_queries and vllm:prefix_cache_hits.
"""

from __future__ import annotations

from bisect import bisect_left

from minillm.layers.trace import StepRecord

TTFT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# aborted: the client hung up; stop: the reply reached a stop string; abort: cut short by a stopping server;
# refused: the queue was full (HTTP 429)
OUTCOMES = ("eos", "length", "stop", "aborted", "abort", "rejected", "refused")


class Histogram:
    def __init__(self, buckets: tuple[float, ...]):
        self.buckets, self.counts = buckets, [0] * (len(buckets) + 1)  # the last: above every bucket
        self.total, self.count = 0.0, 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.buckets, value)] += 1  # bucket i holds values <= buckets[i]
        self.total, self.count = self.total + value, self.count + 1

    def lines(self, name: str) -> list[str]:
        out, running = [], 0
        for bound, n in zip((*self.buckets, "+Inf"), self.counts):
            running += n  # Prometheus buckets are cumulative: everything <= the bound
            out.append(f'{name}_bucket{{le="{bound}"}} {running}')
        return out + [f"{name}_sum {self.total:.6f}", f"{name}_count {self.count}"]


class LiveStats:
    def __init__(self):
        self.steps = self.tokens = self.preemptions = self.prefill_tokens = 0
        self.outcomes = dict.fromkeys(OUTCOMES, 0)
        self.ttft, self.itl = Histogram(TTFT_BUCKETS_S), Histogram(ITL_BUCKETS_S)

    def on_step(self, record: StepRecord) -> None:
        self.steps += 1
        self.tokens += record.tokens
        self.prefill_tokens += record.prefill_tokens
        self.preemptions += len(record.preempted)

    def count(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1


def gauges(engine) -> dict[str, int]:
    """The engine's state now, read between two steps (serve_loop.py asks for it)."""
    running = engine.running()
    return {
        "running": len(running),
        "waiting": len(engine.pending) + len(engine.waiting),
        "kv_blocks_used": engine.cache.blocks_in_use([r.seat for r in running]),
        "kv_blocks_total": engine.cache.num_blocks,
    }


def prometheus_text(stats: LiveStats, gauges: dict[str, int]) -> str:
    """gauges: the engine's state now (running, waiting, kv_blocks_used, kv_blocks_total)."""
    lines = []

    def metric(name: str, kind: str, help_text: str, samples: list[str]) -> None:
        lines.extend([f"# HELP minillm_{name} {help_text}", f"# TYPE minillm_{name} {kind}"])
        lines.extend(f"minillm_{s}" for s in samples)

    metric("requests_running", "gauge", "Requests in a seat.", [f"requests_running {gauges['running']}"])
    metric("requests_waiting", "gauge", "Requests in the queue.", [f"requests_waiting {gauges['waiting']}"])
    metric("kv_blocks_used", "gauge", "KV blocks held by requests.", [f"kv_blocks_used {gauges['kv_blocks_used']}"])
    metric("kv_blocks_total", "gauge", "KV blocks in the pool.", [f"kv_blocks_total {gauges['kv_blocks_total']}"])
    metric("steps_total", "counter", "Engine steps taken.", [f"steps_total {stats.steps}"])
    metric("generation_tokens_total", "counter", "Output tokens produced (an EOS counts).",
           [f"generation_tokens_total {stats.tokens}"])  # fmt: skip
    metric("prefill_tokens_total", "counter", "Prompt tokens run through the model (a prefix-cache hit skips them; "
           "a preempted request's are run again).", [f"prefill_tokens_total {stats.prefill_tokens}"])  # fmt: skip
    metric("preemptions_total", "counter", "Requests sent back to the queue to free KV blocks.",
           [f"preemptions_total {stats.preemptions}"])  # fmt: skip
    metric("requests_total", "counter", "Requests by how they ended (refused: the queue was full).",
           [f'requests_total{{outcome="{k}"}} {v}' for k, v in stats.outcomes.items()])  # fmt: skip
    metric("time_to_first_token_seconds", "histogram", "Arrival to first token, on the engine's clock.",
           stats.ttft.lines("time_to_first_token_seconds"))  # fmt: skip
    metric("inter_token_latency_seconds", "histogram", "Gap between two tokens of one request.",
           stats.itl.lines("inter_token_latency_seconds"))  # fmt: skip
    return "\n".join(lines) + "\n"


def fleet_text(texts: dict[int, str], rows: list[dict], totals: dict[str, int]) -> str:
    """One text for the fleet: each replica's (texts: replica -> its prometheus_text) with every sample labelled
    replica="i", each metric's HELP and TYPE once; then the router's own figures (rows: one dict per replica)."""
    headers: dict[str, list[str]] = {}  # metric -> its HELP and TYPE lines, in the order first seen
    samples: dict[str, list[str]] = {}
    for replica, text in sorted(texts.items()):
        name = None
        for line in text.splitlines():
            if line.startswith("# HELP "):
                name = line.split()[2]
                headers.setdefault(name, [])
            if line.startswith("#"):
                if line not in headers[name]:
                    headers[name].append(line)
            elif line:
                series, value = line.rsplit(" ", 1)
                head, brace, labels = series.partition("{")
                labelled = f'{head}{{replica="{replica}"' + (f",{labels}" if brace else "}")
                samples.setdefault(name, []).append(f"{labelled} {value}")
    lines = [line for name in headers for line in headers[name] + samples.get(name, [])]

    def metric(name: str, kind: str, help_text: str, values: list[str]) -> None:
        lines.extend([f"# HELP minillm_{name} {help_text}", f"# TYPE minillm_{name} {kind}"])
        lines.extend(f"minillm_{v}" for v in values)

    for name, key, kind, help_text in (
        ("replica_up", "state", "gauge", "1: the replica is in rotation; 0: it failed and left it."),
        ("router_requests_in_flight", "in_flight", "gauge", "Requests the router has on the replica."),
        ("router_load_tokens", "load_tokens", "gauge", "Tokens its requests in flight still have to run."),
        ("prefix_cache_queries_total", "prompt_tokens", "counter", "Prompt tokens of its requests with a first token."),
        ("prefix_cache_hits_total", "hit_tokens", "counter", "Of those, the tokens its prefix cache served at their "
         "first admission (as of the router's last poll)."),
    ):  # fmt: skip
        samples = [(r["replica"], int(r[key] == "ok") if key == "state" else r[key]) for r in rows]
        metric(name, kind, help_text, [f'{name}{{replica="{i}"}} {v}' for i, v in samples])
    routed = [f'router_routed_total{{replica="{r["replica"]}",reason="{reason}"}} {n}'
              for r in rows for reason, n in sorted(r["routed"].items())]  # fmt: skip
    metric("router_routed_total", "counter", "Requests routed, by replica and why it was chosen.", routed)
    metric("router_retried_total", "counter", "Requests sent again elsewhere: their replica failed before their "
           "first token.", [f"router_retried_total {totals['retried']}"])  # fmt: skip
    metric("router_failed_total", "counter", "Requests ended with an error: their replica failed mid-reply.",
           [f"router_failed_total {totals['failed']}"])  # fmt: skip
    return "\n".join(lines) + "\n"
