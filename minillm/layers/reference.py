"""The one-user loop (engine/generate.py) with every pick rule the layers add: the reference a
layered engine's sampled, seeded or constrained replies must match token for token.

Seam: pick (the same Sampler a LayeredEngine uses).
"""

from __future__ import annotations

from minillm.config import Sampling
from minillm.engine.generate import Generation
from minillm.engine.generate import generate as plain_generate
from minillm.layers.sampling import Sampler


def generate(
    model,
    prompt_ids: list[int],
    max_new_tokens: int | None = None,
    temperature=0.0,
    top_k: int = 0,
    seed: int | None = None,
    use_cache: bool = True,
    ignore_eos=False,
    top_p: float = 1.0,
    constraint=None,
    logprobs: int | None = None,
) -> Generation:
    """Generate a reply to one prompt until EOS or max_new_tokens (default: until the context is
    full), each token picked as an engine's request with these settings picks it (sampling.py)."""
    sampling = Sampling(temperature, top_p, top_k or 0, seed, logprobs, constraint)
    return plain_generate(model, prompt_ids, max_new_tokens, use_cache, ignore_eos, sampling, Sampler())
