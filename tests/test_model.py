"""The model's one code path: cached prefill + decode must equal the plain full-sequence forward."""

import pytest
import torch

from minillm.config import ModelConfig
from minillm.engine.generate import generate
from minillm.engine.kv_cache import ContiguousKVCache
from minillm.errors import ConfigError
from minillm.model.attention import attend, reference_attention, visible_mask
from tests.conftest import DEVICES, SMALL_CONFIGS, random_model

PROMPTS = [[257, 5], [257, 99, 100, 101, 259], [257] + list(range(40, 90)), [257, 1, 2, 3, 4, 5, 6, 7]]


def test_default_model_size_is_a_few_million_parameters():
    from minillm.model.transformer import Transformer

    n = Transformer(ModelConfig()).num_parameters()
    assert 2_000_000 <= n <= 5_000_000
    assert ModelConfig().max_seq_len >= 1024


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(SMALL_CONFIGS))
def test_cached_greedy_equals_no_cache_loop(name, device):
    model = random_model(name, device)
    for seed, prompt in enumerate(PROMPTS):
        cached = generate(model, prompt, max_new_tokens=40, use_cache=True)
        plain = generate(model, prompt, max_new_tokens=40, use_cache=False)
        assert cached.tokens == plain.tokens, f"config {name}, prompt {seed}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(SMALL_CONFIGS))
def test_cached_logits_match_full_forward(name, device):
    """Prefill a prefix, then feed the rest one token at a time: every logit row matches."""
    model = random_model(name, device)
    tokens = torch.randint(0, 256, (1, 60), generator=torch.Generator().manual_seed(1)).to(device)
    with torch.no_grad():
        full = model(tokens)  # (1, 60, V)
        cache = ContiguousKVCache(model.cfg, num_seats=1, device=device)
        pieces = [model(tokens[:, :20], cache.prepare([0], 20), cache)]
        for t in range(20, 60):
            pieces.append(model(tokens[:, t : t + 1], cache.prepare([0], 1), cache))
    cached = torch.cat(pieces, dim=1)
    rel = (cached - full).norm() / full.norm()
    assert rel.item() <= 1e-4
    assert (cached.argmax(-1) == full.argmax(-1)).all()


@pytest.mark.parametrize("n_heads,n_kv_heads", [(4, 4), (4, 2), (8, 1)])
def test_fused_attention_equals_the_textbook_formula(n_heads, n_kv_heads):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, 5, n_heads, 16, generator=g)
    k = torch.randn(3, 9, n_kv_heads, 16, generator=g)
    v = torch.randn(3, 9, n_kv_heads, 16, generator=g)
    mask = visible_mask(torch.tensor([[4, 5, 6, 7, 8]] * 3), 9)
    torch.testing.assert_close(attend(q, k, v, mask), reference_attention(q, k, v, mask))
    causal_k, causal_v = k[:, :5], v[:, :5]
    torch.testing.assert_close(attend(q, causal_k, causal_v, None), reference_attention(q, causal_k, causal_v, None))


def test_batched_rows_do_not_see_each_other():
    """Two seats decoding in one batch give the same logits as each alone."""
    model = random_model("gqa")
    a, b = torch.tensor([[257, 10, 11, 12]]), torch.tensor([[257, 50, 51, 52, 53, 54, 55]])
    with torch.no_grad():
        cache = ContiguousKVCache(model.cfg, num_seats=2)
        model(a, cache.prepare([0], 4), cache)
        model(b, cache.prepare([1], 7), cache)
        step = model(torch.tensor([[20], [60]]), cache.prepare([0, 1], 1), cache)  # (2, 1, V)
        alone_a = model(torch.cat([a, torch.tensor([[20]])], 1))[:, -1]
        alone_b = model(torch.cat([b, torch.tensor([[60]])], 1))[:, -1]
    torch.testing.assert_close(step[0, -1], alone_a[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(step[1, -1], alone_b[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        ({"dim": 65}, "divisible by n_heads"),
        ({"n_heads": 4, "n_kv_heads": 3}, "must divide n_heads"),
        ({"n_layers": 0}, "n_layers must be a positive integer"),
    ],
)
def test_bad_config_is_a_clear_error(kwargs, needle):
    with pytest.raises(ConfigError, match=needle):
        ModelConfig(**kwargs)
