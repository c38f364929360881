"""A real model on a real card, by arithmetic: datasheets, config.json shapes, the roofline, a simulated clock;
and this machine, measured and predicted the same way.

hardware.py    the cards (memory, bandwidth, dense FLOP/s, each with its source), the links between them, this machine
modelspec.py   a model's shape from its Hugging Face config.json (models/ holds a few)
families.py    the fields each family names experts, latent attention and sliding windows with (MoE, MLA, Gemma 3)
model_bytes.py what the weights and the KV weigh: in memory, streamed by a step, per token and per user
experts.py     a mixture of experts batched: the experts a step's tokens touch, E (1 - (1 - k/E)^B)
kv_layout.py   the KV per layer: per kv head, a latent (MLA), or a sliding window that stops growing
roofline.py    the bound on one engine step (bytes and FLOPs, the larger), and how many users' KV fits
enginecost.py  a serving engine's step on a card: the roofline kernel by kernel (what run --simulate charges)
tensor_parallel.py  one model split over several cards: a card's share of the step, plus the all-reduces
sizes.py       model sizes for timing this machine (random weights, the same engine code)
microbench.py  the microbenchmarks calibration runs (none of them the model)
calibrate.py   this machine measured, so it can be priced like a card
opcost.py      minillm's own step on this machine, op by op, from the calibrated rates
measure.py     timing (and counting the calls of) a real step here
validate.py    whatif --validate: both predictions against measured steps, every size, batch and context
simulate.py    the same engine on a virtual clock: a stand-in forward priced by enginecost.py
kv_transfer.py a prompt's KV handed from a prefill card to a decode card: bytes over a link
fleet.py       many simulated engines on one time line: replicas, or prefill and decode cards
fleet_figures.py  a fleet's TTFT, ITL, TPOT and goodput, and the table of prefill:decode splits
whatif.py      one summary for a model on a card
"""
