"""The papers, reproduced: a serving paper's experiment on the simulated clock, beside what it published.

Each paper is a few files here: its setup as its own sources give it (the model, the card, the workload, each
system's knobs, the published figures, every one with where it was read), the experiment run through minillm's own
engine on a simulated card (card/simulate.py), and the verdict per headline: reproduced when the simulated ratio
lands within 35% of the published one (verdict.py). Where it does not, the experiment adds what the paper's systems
did beyond the mechanism, one measured cost at a time, and says how far each moves the figure.

anyscale_setup.py   the Anyscale post (June 2023): 23x, 8x, 4x over naive static batching; its benchmark's knobs
anyscale_runner.py  ... the costs its systems' own code and harness add to a step, on the simulated card
quota.py            ... TGI's admission rule (a token quota), as Ray Serve re-implemented it
anyscale.py         ... the experiment: the crowd through the four systems, the headlines
anyscale_report.py  ... the table, the verdicts, and each missed figure taken apart by measurement
distserve_*.py      DistServe (OSDI 2024): per-GPU goodput of prefill/decode disaggregation against vLLM, >= 2x
orca_*.py           Orca (OSDI 2022): iteration-level scheduling's throughput at the same latency, 36.9x
sarathi_*.py        Sarathi-Serve (OSDI 2024): chunked prefills' capacity under a P99 TBT SLO against vLLM, 2.6x
sglang_*.py         SGLang (NeurIPS 2024): RadixAttention's cache hit rates, 50-99%, and the throughput they buy
vllm_*.py           vLLM / PagedAttention (SOSP 2023): KV memory wasted by contiguous reservations, 2-4x the rate
verdict.py          published against reproduced: the ratio, the 35% rule
"""
