"""Speculation with sampling is exact in distribution, and every sampled request draws from streams of its own.

The rejection rule (sampling.keep_or_resample: keep a guess drawn from q with probability min(1, p / q), else draw
from max(0, p - q) normalised) must give tokens distributed as p itself. Checked by a chi-square test at
significance 0.001, first on toy distributions where p is known exactly (with rules that look right and are not:
the same test must reject them), then end to end: the engine's first sampled tokens with speculation against the
model's own distribution, computed token by token with the plain loop's forward.
"""

from __future__ import annotations

import functools

import pytest
import torch

from minillm.config import EngineConfig, Sampling
from minillm.engine.request import Request
from minillm.engine.scheduler import ContinuousScheduler
from minillm.layers import LayeredEngine
from minillm.layers.sampling import generator, keep_or_resample, probabilities
from tests.conftest import random_model
from tests.test_speculate import target

# The chi-square distribution's upper 0.001 points by degrees of freedom (any statistics table, e.g. NIST/SEMATECH
# e-Handbook of Statistical Methods, section 1.3.6.7.4): a right rule exceeds them once in a thousand runs.
CHI2_0001 = {3: 16.266, 5: 20.515, 8: 26.124}


def chi_square(counts: torch.Tensor, p: torch.Tensor) -> tuple[float, int]:
    """Pearson's statistic of `counts` against the distribution p, and its degrees of freedom (categories whose
    expected count is under 5 are pooled, as the test requires)."""
    expected = p * counts.sum()
    small = expected < 5
    observed = torch.cat([counts[~small], counts[small].sum().reshape(1)]) if small.any() else counts
    expected = torch.cat([expected[~small], expected[small].sum().reshape(1)]) if small.any() else expected
    keep = expected > 0
    stat = float(((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum())
    return stat, int(keep.sum()) - 1


P = torch.tensor([0.30, 0.25, 0.20, 0.12, 0.08, 0.05], dtype=torch.float64)  # the target's distribution
Q = torch.tensor([0.10, 0.40, 0.05, 0.30, 0.10, 0.05], dtype=torch.float64)  # a drafter that is often wrong
DRAWS = 20_000


def settled(rule, q: torch.Tensor | None, guess_of=None) -> torch.Tensor:
    """Counts of the tokens `rule` leaves at one position over DRAWS seeds: the guess drawn from q (or fixed)."""
    counts = torch.zeros(len(P), dtype=torch.float64)
    for seed in range(DRAWS):
        guess = guess_of(seed) if guess_of else torch.multinomial(q, 1, generator=generator(seed, 0, 3)).item()
        counts[rule(P, guess, q, seed, 0)] += 1
    return counts


def accept_always(p, guess, q, seed, position):  # the greedy habit: a guess is kept
    return guess


def resample_from_p(p, guess, q, seed, position):  # right test, wrong fallback: a rejected guess redrawn from p
    u = torch.rand((), dtype=torch.float64, generator=generator(seed, position, 1)).item()
    return guess if u * q[guess] < p[guess] else torch.multinomial(p, 1, generator=generator(seed, position, 2)).item()


def test_the_rejection_rule_gives_the_targets_distribution_and_a_wrong_rule_is_caught():
    stat, df = chi_square(settled(keep_or_resample, Q), P)
    assert stat < CHI2_0001[df], f"the rule's tokens are not distributed as p: chi2 {stat:.1f} on {df} df"
    for wrong in (accept_always, resample_from_p):
        stat, df = chi_square(settled(wrong, Q), P)
        assert stat > CHI2_0001[df], f"{wrong.__name__} passed the test it must fail (chi2 {stat:.1f})"


def test_a_certain_guess_prompt_lookups_is_kept_as_often_as_p_gives_it():
    """Prompt lookup's guess is no draw (q all on it): kept with probability p[guess], else a token drawn from
    the rest of p. Whatever the guess, the tokens are distributed as p."""
    for guess in (0, 4):
        counts = settled(keep_or_resample, None, guess_of=lambda seed, g=guess: g)
        stat, df = chi_square(counts, P)
        assert stat < CHI2_0001[df], f"guess {guess}: chi2 {stat:.1f} on {df} df"


# --- end to end: the engine's sampled replies with speculation ------------------------------------------------------
PROMPT = [257, 11, 12, 13, 14]
WARM = dict(temperature=1.0, top_k=3)  # three tokens at each position: 27 replies of three tokens, each likely enough


def exact_joint(n_tokens: int) -> dict[tuple[int, ...], float]:
    """The model's own probability of each reply of n_tokens tokens under WARM, position by position."""
    model, s = target(), Sampling(**WARM)
    joint = {(): 1.0}
    for _ in range(n_tokens):
        grown = {}
        for reply, mass in joint.items():
            with torch.no_grad():
                logits = model(torch.tensor([PROMPT + list(reply)]), last_only=True)[0, -1]
            p = probabilities(logits, s)
            for token in torch.nonzero(p).flatten().tolist():
                grown[reply + (token,)] = mass * float(p[token])
        joint = grown
    return joint


@functools.cache
def half_right():
    """The target with a little noise in its weights: a draft whose guesses the rule keeps about a third of the
    time, so both of its branches (keep, and draw from the residual) are exercised."""
    model = random_model("gqa")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.3 * p.std())
    return model


def engine_replies(n: int, speculate: int, seeds) -> tuple[list[tuple[int, ...]], float]:
    """The 3-token replies of n seeded requests (the first token picked after the prompt, the next two after guesses
    when speculating), and the share of guesses the model kept."""
    cfg = EngineConfig(slots=64, max_len=256, speculate=speculate, debug=True)
    engine = LayeredEngine(target(), ContinuousScheduler(), cfg, draft=half_right())
    requests = [Request(f"r{i}", PROMPT, 3, ignore_eos=True, sampling=Sampling(**WARM, seed=seed))
                for i, seed in zip(range(n), seeds)]  # fmt: skip
    for r in requests:
        engine.submit(r)
    trace = engine.run()
    verified = sum(trace.request(r.id).drafts_verified for r in requests)
    accepted = sum(trace.request(r.id).drafts_accepted for r in requests)
    return [tuple(r.output_ids) for r in requests], accepted / max(verified, 1)


def test_the_engines_speculated_samples_follow_the_models_own_distribution(capsys):
    joint = exact_joint(3)
    keys = sorted(joint)
    p = torch.tensor([joint[k] for k in keys], dtype=torch.float64)
    replies, acceptance = engine_replies(3000, 2, range(3000))
    counts = torch.tensor([sum(1 for r in replies if r == k) for k in keys], dtype=torch.float64)
    assert counts.sum() == len(replies), "a reply outside the top-3 tokens: the cut was not applied"
    stat, df = chi_square(counts, p)
    with capsys.disabled():
        print(
            f"\n  speculative sampling (k = 2, top-3, temperature 1): {acceptance:.0%} of guesses kept; "
            f"chi2 {stat:.1f} on {df} df against the model's own distribution"
        )
    assert 0.15 < acceptance < 0.85, "the draft must be right sometimes and wrong sometimes, or nothing is tested"
    assert stat < chi2_critical(df), f"chi2 {stat:.1f} on {df} df: speculation changed the distribution"


def chi2_critical(df: int) -> float:
    """The upper 0.001 point for df degrees of freedom (Wilson-Hilferty's approximation, within 1% past df = 10;
    the table's values below)."""
    if df in CHI2_0001:
        return CHI2_0001[df]
    z = 3.0902  # the normal's upper 0.001 point
    return df * (1 - 2 / (9 * df) + z * (2 / (9 * df)) ** 0.5) ** 3


def test_seeded_speculated_replies_are_reproducible_and_differ_by_seed():
    first, _ = engine_replies(40, 4, range(40))
    again, _ = engine_replies(40, 4, range(40))
    other, _ = engine_replies(40, 4, range(100, 140))
    assert first == again and first != other


# --- batch invariance: a request's draws are its own ----------------------------------------------------------------
def run(requests, slots: int, **cfg) -> dict[str, list[int]]:
    engine = LayeredEngine(target(), ContinuousScheduler(), EngineConfig(slots=slots, max_len=256, **cfg))
    for r in requests:
        engine.submit(r)
    engine.run()
    return {r.id: r.output_ids for r in requests}


@pytest.mark.parametrize("speculate", [0, 3])
def test_a_requests_draws_are_its_own_whoever_shares_the_batch(speculate):
    """Seeded or not, a sampled request's reply does not depend on its neighbours: which ones, how many, in which
    seat, or whether memory ran short and it was preempted. (An unseeded request takes its seed from torch's
    generator when it is submitted, so the same submissions in the same order give the same replies.)"""
    warm = Sampling(temperature=1.0, top_p=0.95)
    seeded = Sampling(temperature=0.7, seed=5)
    mine = lambda: [Request("a", [257, 3, 4], 24, ignore_eos=True, sampling=warm),
                    Request("b", [257, 9], 24, ignore_eos=True, sampling=seeded)]  # fmt: skip
    neighbours = [Request(f"n{i}", [257, 20 + i] * (1 + i), 10 + 3 * i, ignore_eos=True,
                          sampling=Sampling(temperature=1.3, seed=i) if i % 2 else Sampling())
                  for i in range(6)]  # fmt: skip
    target()  # (built first: its first build seeds and draws from torch's generator, which the unseeded "a" reads)
    torch.manual_seed(0)
    alone = run(mine(), slots=2, speculate=speculate)
    torch.manual_seed(0)
    crowded = run(mine() + neighbours, slots=4, speculate=speculate)
    torch.manual_seed(0)
    squeezed = run(mine() + [Request(n.id, n.prompt_ids, n.max_new_tokens, ignore_eos=True, sampling=n.sampling,
                                     arrival_step=1) for n in neighbours],
                   slots=8, speculate=speculate, kv="paged", block_size=4, num_blocks=24)  # fmt: skip
    for rid in "ab":
        assert crowded[rid] == alone[rid], f"{rid}: a crowd changed its draws"
        assert squeezed[rid] == alone[rid], f"{rid}: preemption and other seats changed its draws"


def test_preemption_happens_in_the_squeezed_run():
    """(The run above is only a test of preemption if memory does run short.)"""
    engine = LayeredEngine(target(), ContinuousScheduler(), EngineConfig(slots=8, max_len=256, kv="paged", block_size=4,
                                                                  num_blocks=24))  # fmt: skip
    for i in range(8):
        engine.submit(Request(f"n{i}", [257, 20 + i] * (1 + i), 10 + 3 * i, ignore_eos=True))
    engine.run()
    assert sum(r.preemptions for r in engine.requests) > 0
