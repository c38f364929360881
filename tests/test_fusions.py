"""Fewer torch calls per step (issue 22), never different results.

The model fuses what serving engines fuse (one RMSNorm call, one matmul for q/k/v and one for gate/up, RoPE
applied to q and k together, the step's packing planned once for every layer); here it is checked against a
Llama forward written out op by op in this file, the unfused formulation, on the same weights in the
standard Llama layout, through the plain forward, the caches and a ragged step. The shipped file, which
keeps that layout, loads to the same logits.
"""

import pytest
import torch
import torch.nn.functional as F

from minillm.card.measure import torch_calls
from minillm.config import ModelConfig
from minillm.engine.kv_cache import ContiguousKVCache, PagedKVCache
from minillm.model.attention import attend, reference_attention, visible_mask
from minillm.model.checkpoint import llama_layout
from tests.conftest import SMALL_CONFIGS, random_model

TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}


def standard_weights(model) -> dict[str, torch.Tensor]:
    """The model's weights under Llama's names (q_proj, k_proj, v_proj, gate_proj, up_proj: one matrix each)."""
    return llama_layout(model.state_dict(), model.cfg)


def textbook_logits(w: dict[str, torch.Tensor], cfg: ModelConfig, tokens: torch.Tensor) -> torch.Tensor:
    """Llama, one op at a time: RMSNorm written out, a matmul per projection, RoPE as a 2-D rotation of each
    pair (x[i], x[i + D/2]), attention by the formula. tokens (B, T) from position 0. Returns (B, T, V)."""
    B, T = tokens.shape
    H, Hkv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    inv_freq = 1.0 / cfg.rope_theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    angles = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)  # (T, D/2)
    cos, sin = angles.cos().float()[None, :, None], angles.sin().float()[None, :, None]  # (1, T, 1, D/2)

    def norm(x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.norm_eps) * weight

    def rope(x):  # (B, T, heads, D)
        first, second = x[..., : D // 2], x[..., D // 2 :]
        return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)

    x = w["embed_tokens.weight"][tokens]  # (B, T, dim)
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        h = norm(x, w[p + "input_layernorm.weight"])
        q = (h @ w[p + "self_attn.q_proj.weight"].T).view(B, T, H, D)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).view(B, T, Hkv, D)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(B, T, Hkv, D)
        attended = reference_attention(rope(q), rope(k), v, mask=None).reshape(B, T, H * D)
        x = x + attended @ w[p + "self_attn.o_proj.weight"].T
        h = norm(x, w[p + "post_attention_layernorm.weight"])
        gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (F.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    return norm(x, w["norm.weight"]) @ w["lm_head.weight"].T


@pytest.mark.parametrize("name", sorted(SMALL_CONFIGS))
def test_the_model_equals_llama_written_out(name):
    model = random_model(name)
    tokens = torch.randint(0, 256, (3, 21), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), textbook_logits(standard_weights(model), model.cfg, tokens),
                                   **TOLERANCE)  # fmt: skip


@pytest.mark.parametrize("n_heads,n_kv_heads", [(4, 4), (8, 2), (8, 1)])
def test_decode_attention_with_query_heads_folded_equals_the_formula(n_heads, n_kv_heads):
    """One query per row: attend runs each kv head's query heads as its rows; the mask bool or float (0 / -inf)."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(5, 1, n_heads, 16, generator=g)
    k, v = torch.randn(5, 12, n_kv_heads, 16, generator=g), torch.randn(5, 12, n_kv_heads, 16, generator=g)
    mask = visible_mask(torch.tensor([[3], [11], [0], [7], [5]]), 12)  # (5, 1, 12)
    expected = reference_attention(q, k, v, mask)
    torch.testing.assert_close(attend(q, k, v, mask), expected)
    torch.testing.assert_close(attend(q, k, v, torch.where(mask, 0.0, float("-inf"))), expected)


@pytest.mark.parametrize("n_heads,n_kv_heads", [(8, 2), (8, 1)])
@pytest.mark.parametrize("rows,tokens", [(5, 2), (4, 5), (6, 9), (5, 17), (2, 5)])
def test_verify_rows_with_query_heads_folded_equal_the_formula(rows, tokens, n_heads, n_kv_heads):
    """A few queries on each of many rows (speculation's verify rows) fold as decode rows do; each query sees the
    keys up to its own position. Past FOLD_MAX_TOKENS, or on fewer than FOLD_MIN_ROWS rows, attend does not fold."""
    g = torch.Generator().manual_seed(4)
    q = torch.randn(rows, tokens, n_heads, 16, generator=g)
    k, v = torch.randn(rows, 40, n_kv_heads, 16, generator=g), torch.randn(rows, 40, n_kv_heads, 16, generator=g)
    starts = torch.randint(0, 40 - tokens, (rows, 1), generator=g)
    mask = visible_mask(starts + torch.arange(tokens), 40)  # (rows, tokens, 40)
    expected = reference_attention(q, k, v, mask)
    torch.testing.assert_close(attend(q, k, v, mask), expected)
    torch.testing.assert_close(attend(q, k, v, torch.where(mask, 0.0, float("-inf"))), expected)


@pytest.mark.parametrize("layout", ["paged", "contiguous"])
def test_a_ragged_step_through_a_cache_equals_llama_written_out(layout):
    """Rows cached to different lengths, then one step with decode rows and two prompt chunks (three groups)."""
    model = random_model("gqa")
    cfg, g = model.cfg, torch.Generator().manual_seed(1)
    sequences = [torch.randint(0, 256, (n,), generator=g) for n in (9, 30, 17, 12, 25)]
    cached = [8, 29, 16, 0, 5]  # tokens each row has in the cache before the step
    if layout == "paged":
        cache = PagedKVCache(cfg, num_blocks=40, block_size=4)
    else:
        cache = ContiguousKVCache(cfg, num_seats=5, max_len=64)
    with torch.no_grad():
        for seat, (seq, n) in enumerate(zip(sequences, cached)):
            if n:
                model(seq[None, :n], cache.prepare([seat], n), cache)
        counts = [len(seq) - n for seq, n in zip(sequences, cached)]  # 1, 1, 1, 12, 20
        tokens = torch.cat([seq[n:] for seq, n in zip(sequences, cached)])[None]  # (1, N)
        ends = torch.tensor(counts).cumsum(0) - 1
        logits = model(tokens, cache.prepare(list(range(5)), counts), cache, logits_at=ends)  # (5, V)
    expected = torch.stack([textbook_logits(standard_weights(model), cfg, seq[None])[0, -1] for seq in sequences])
    torch.testing.assert_close(logits, expected, **TOLERANCE)


def test_the_shipped_file_loads_to_llama_written_out(shipped_model):
    """The file keeps the standard layout (fp16, the model's config inside): no retraining, the same logits."""
    from safetensors.torch import load_file

    from minillm.model.checkpoint import DEFAULT_CHECKPOINT

    weights = {name: t.float() for name, t in load_file(str(DEFAULT_CHECKPOINT)).items()}
    tokens = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(shipped_model(tokens), textbook_logits(weights, shipped_model.cfg, tokens),
                                   **TOLERANCE)  # fmt: skip


def test_saving_writes_the_file_it_loaded(shipped_model, tmp_path):
    """Load, save: the same tensors under the same names, bit for bit."""
    from safetensors.torch import load_file

    from minillm.model.checkpoint import DEFAULT_CHECKPOINT, save_checkpoint

    save_checkpoint(shipped_model, tmp_path / "again.safetensors")
    shipped, again = load_file(str(DEFAULT_CHECKPOINT)), load_file(str(tmp_path / "again.safetensors"))
    assert sorted(shipped) == sorted(again)
    assert all(torch.equal(shipped[name], again[name]) for name in shipped)


def decode_step(model, batch: int, context: int = 20, layout: str = "paged"):
    if layout == "paged":
        cache = PagedKVCache(model.cfg, num_blocks=batch * 4, block_size=8)
    else:
        cache = ContiguousKVCache(model.cfg, num_seats=batch, max_len=context + 2)
    with torch.no_grad():
        for seat in range(batch):
            model(torch.randint(0, 256, (1, context)), cache.prepare([seat], context), cache)
    tokens = torch.randint(0, 256, (batch, 1))
    return lambda: model(tokens, cache.prepare(list(range(batch)), 1), cache)


def test_a_decode_step_makes_as_many_torch_calls_at_any_batch():
    """No Python loop over rows anywhere in a step: 1 row or 32, the same calls."""
    model = random_model("gqa")
    with torch.no_grad():
        assert sum(torch_calls(decode_step(model, 1)).values()) == sum(torch_calls(decode_step(model, 32)).values())


@pytest.mark.parametrize("layout", ["paged", "contiguous"])
def test_a_step_never_waits_for_a_value(layout):
    """No .item(), int(tensor), .tolist() or truth test of a tensor inside a step: each would stop a GPU's queue."""
    model = random_model("gqa")
    with torch.no_grad():
        calls = torch_calls(decode_step(model, 4, layout=layout))
    syncs = {op for _, op in calls} & {"item", "tolist", "__int__", "__index__", "__bool__", "__float__"}
    assert not syncs, f"host syncs in a decode step: {syncs}"


def test_a_decode_step_calls_sorted_by_kind():
    """One call per RMSNorm, four matmuls per layer (qkv, o, gate_up, down) and the head; every call has a kind."""
    from minillm.bench.calls import calls_by_kind
    from minillm.card.measure import count_torch_calls

    model = random_model("mqa")
    with torch.no_grad():
        kinds, total = calls_by_kind(decode_step(model, 2)), count_torch_calls(decode_step(model, 2))
    layers = model.cfg.n_layers
    assert kinds["norm"] == 2 * layers + 1 and kinds["matmul"] == 4 * layers + 1
    assert sum(kinds.values()) == total and kinds["other"] == 0


def test_the_transformers_comparison_says_how_to_run_it(monkeypatch):
    """transformers is not a dependency: without it the bench entry measures nothing and says what to install."""
    import sys

    from minillm.bench.common import BenchSettings
    from minillm.bench.versus import SKIPPED, bench_vs_transformers

    monkeypatch.setitem(sys.modules, "transformers", None)  # as if not installed: importing it fails
    assert bench_vs_transformers(random_model("gqa"), BenchSettings(quick=True)) == {"skipped": SKIPPED}
