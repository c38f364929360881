"""A real model on a real card, by arithmetic: datasheets, config.json shapes, the roofline, a simulated clock.

hardware.py   the cards (memory, bandwidth, dense FLOP/s, each with its source) and this machine
modelspec.py  a model's shape from its Hugging Face config.json (models/ holds a few)
roofline.py   what one engine step costs on a card, and how many users' KV fits
calibrate.py  this machine measured, so it can be priced like a card
measure.py    timing a real decode step here (to check the prices against)
simulate.py   the same engine on a virtual clock: a stand-in forward priced by the roofline
whatif.py     one summary for a model on a card; the cost model checked against this machine
"""
