"""Paged attention == contiguous-cache attention == the plain reference, token-exact generation."""

import random

import pytest
import torch

from minillm.card.kv_memory import kv_waste, sequences_that_fit
from minillm.config import ModelConfig
from minillm.engine.blocks import BlockPoolExhausted
from minillm.engine.generate import generate
from minillm.engine.kv_cache import ContiguousKVCache, PagedKVCache, kv_bytes_per_token
from minillm.model.attention import paged_gather
from tests.conftest import DEVICES, random_model


def shuffled_paged_cache(cfg, num_blocks, block_size, seed, device="cpu"):
    cache = PagedKVCache(cfg, num_blocks, block_size, device=device)
    order = list(range(num_blocks))
    random.Random(seed).shuffle(order)
    cache.allocator.free_blocks.clear()
    cache.allocator.free_blocks.update(dict.fromkeys(order))  # physical blocks handed out in random order
    return cache


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block_size", [1, 16, 7])
def test_batched_decode_through_every_cache_equals_the_reference(block_size, device):
    """Rows of different lengths prefilled, then decoded together: all three agree."""
    model = random_model("gqa", device)
    rng = random.Random(block_size)
    lengths = [rng.randint(1, 50) for _ in range(5)]
    prompts = [torch.randint(0, 256, (1, n), generator=torch.Generator().manual_seed(n)).to(device) for n in lengths]
    paged = shuffled_paged_cache(model.cfg, 300, block_size, seed=block_size, device=device)
    contiguous = ContiguousKVCache(model.cfg, num_seats=5, max_len=64, device=device)
    next_tokens = torch.randint(0, 256, (5, 1)).to(device)
    with torch.no_grad():
        results = []
        for cache in (paged, contiguous):
            for seat, prompt in enumerate(prompts):
                model(prompt, cache.prepare([seat], prompt.shape[1]), cache)
            results.append(model(next_tokens, cache.prepare(list(range(5)), 1), cache)[:, -1])  # (5, V)
        reference = torch.stack([model(torch.cat([p, t[None]], 1))[0, -1] for p, t in zip(prompts, next_tokens)])
    torch.testing.assert_close(results[0], reference, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(results[1], reference, rtol=1e-4, atol=1e-5)
    paged.allocator.check()


@pytest.mark.parametrize("block_size", [1, 16, 7])
def test_paged_gather_reads_blocks_in_logical_order(block_size):
    """A hand-built pool: whatever the physical order, the gather returns each row's tokens in order."""
    num_blocks, heads, dim = 12, 2, 4
    pool = torch.zeros(num_blocks, block_size, heads, dim)
    order = list(range(num_blocks))
    random.Random(0).shuffle(order)
    tables, lengths = [order[:5], order[5:7]], [5 * block_size - 1, 2 * block_size]
    for row, table in enumerate(tables):
        for pos in range(lengths[row]):
            pool[table[pos // block_size], pos % block_size] = 1000 * row + pos
    gathered = paged_gather(pool, torch.tensor([tables[0], tables[1] + [0, 0, 0]]))  # (2, 5 * bs, H, D)
    for row in range(2):
        assert gathered[row, : lengths[row], 0, 0].tolist() == [1000 * row + p for p in range(lengths[row])]


@pytest.mark.parametrize("block_size", [1, 16, 7])
def test_greedy_generation_through_the_paged_cache_is_token_exact(block_size):
    model = random_model("mqa")
    for seed in range(3):
        prompt = [257] + torch.randint(0, 256, (5 + 11 * seed,), generator=torch.Generator().manual_seed(seed)).tolist()
        plain = generate(model, prompt, max_new_tokens=30, use_cache=False).tokens
        cache = shuffled_paged_cache(model.cfg, 64, block_size, seed)
        tokens, new = [], torch.tensor([prompt])
        with torch.no_grad():
            for _ in range(30):
                logits = model(new, cache.prepare([0], new.shape[1]), cache, last_only=True)
                tokens.append(int(logits[0, -1].argmax()))
                new = torch.tensor([[tokens[-1]]])
        assert tokens == plain[: len(tokens)] and len(plain) == 30


def test_exhausted_pool_raises_and_changes_nothing():
    model = random_model("gqa")
    cache = PagedKVCache(model.cfg, num_blocks=3, block_size=4)
    with torch.no_grad():
        model(torch.zeros(1, 10, dtype=torch.long), cache.prepare([0], 10), cache)  # 3 blocks
    before = dict(cache.allocator.lengths)
    with pytest.raises(BlockPoolExhausted, match="KV cache is full"):
        cache.prepare([0, 1], 3)
    assert cache.allocator.lengths == before
    cache.allocator.check()


def test_memory_accounting():
    cfg = ModelConfig()
    assert kv_bytes_per_token(cfg) == cfg.n_layers * 2 * cfg.n_kv_heads * cfg.head_dim * 4
    paged = PagedKVCache(cfg, num_blocks=10, block_size=16)
    paged.allocator.allocate(0, 17)  # 2 blocks, 32 slots, 17 tokens
    assert paged.reserved_tokens == 32 and paged.stored_tokens == 17
    assert kv_waste(paged) == pytest.approx(15 / 32)
    contiguous = ContiguousKVCache(cfg, num_seats=2, max_len=100)
    contiguous.lengths[0] = 17
    assert contiguous.reserved_tokens == 200 and kv_waste(contiguous) == pytest.approx(183 / 200)
    budget = kv_bytes_per_token(cfg) * 1024 * 4  # room for 4 full-context rows
    assert sequences_that_fit(cfg, budget, seq_len=100, layout="contiguous") == 4
    assert sequences_that_fit(cfg, budget, seq_len=100, layout="paged", block_size=16) == (4096 // 16) // 7
