"""Features on the core's seams (engine/engine.py names them). Read after the core, in lesson order:

trace.py       after the step: a record per step and per request, what the app and lessons read
speculate.py   lookahead: guesses checked in the same forward, the wrong ones rolled back (lesson 11)
drafters.py    ... who guesses: prompt lookup, or a small draft model with a cache of its own
sampling.py    pick: temperature, top-k, top-p, each request's own seeded streams, logprobs, and
               speculative sampling's rejection rule (lessons 11, 14)
handover.py    each token + admit with KV: prefill on one engine, decode on another (lesson 13)
constrain.py   pick, through the sampler: a pattern's mask on each row's logits (lesson 14)
books.py       after the step: the KV books checked every step (debug)
service.py     policy: what each request was promised (class, priority, TTFT/TPOT/deadline), judged
policies.py    policy: who goes first (priority, earliest deadline) and whom to preempt (lesson 15)
reference.py   the one-user loop with every pick rule: what a layered engine must match
prepack.py     the runner's model: each linear's weight laid out once for oneDNN (lesson 07b)
compiled.py    ... or its forward through torch.compile, attention one opaque op (lesson 07b)
engine.py      LayeredEngine: the core's loop with each layer plugged in, what the rest of minillm runs

No core file imports or names this folder's layers: the core runs greedy on its own (tests/test_architecture.py).
"""

from minillm.layers.engine import LayeredEngine
from minillm.layers.handover import HandOver, export, hand_over, handed_copy
from minillm.layers.reference import generate
from minillm.layers.sampling import Sampler

__all__ = ["HandOver", "LayeredEngine", "Sampler", "export", "generate", "hand_over", "handed_copy"]
