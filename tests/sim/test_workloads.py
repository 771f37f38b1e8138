"""Workload traces: deterministic from the seed, distributions where documented."""

from __future__ import annotations

import random
import statistics

import pytest

from minivllm import workloads as w


def test_same_seed_same_trace_and_same_token_ids():
    a, b = w.chat(50, seed=7, rate=3.0), w.chat(50, seed=7, rate=3.0)
    assert a.items == b.items
    assert [it.prompt_token_ids(5000) for it in a] == [it.prompt_token_ids(5000) for it in b]
    c = w.chat(50, seed=8, rate=3.0)
    assert a.prompt_lens != c.prompt_lens
    assert a[0].prompt_token_ids(5000) != c[0].prompt_token_ids(5000)


def test_every_generator_is_deterministic():
    for make in (w.reasoning, w.long_context, lambda n, seed: w.shared_prefix(n, 64, seed=seed)):
        assert make(20, seed=3).items == make(20, seed=3).items


def test_chat_lengths_match_the_published_sharegpt_means():
    t = w.chat(4000, seed=0)
    # Kwon et al. 2023, Fig. 11: 161.31 / 337.99; with sigma = 1 the standard error at n=4000
    # is ~3 % of the mean, so 8 % is a loose but meaningful band
    assert statistics.fmean(t.prompt_lens) == pytest.approx(161.31, rel=0.08)
    assert statistics.fmean(t.output_lens) == pytest.approx(337.99, rel=0.08)
    # right-skewed: the median sits well below the mean
    assert statistics.median(t.output_lens) < 0.8 * statistics.fmean(t.output_lens)
    assert min(t.prompt_lens) >= 4 and max(t.output_lens) <= 2048


def test_clipped_lognormal_mean_is_exact():
    d = w.LogNormalLengths(mean=500, sigma=1.2, low=10, high=3000)
    xs = d.sample(random.Random(0), 100_000)
    assert statistics.fmean(xs) == pytest.approx(500, rel=0.02)
    assert min(xs) >= 10 and max(xs) == 3000  # the clip is reached with sigma 1.2


def test_reasoning_outputs_reach_but_never_exceed_30k():
    t = w.reasoning(500, seed=1)
    assert max(t.output_lens) == 30_000
    assert min(t.output_lens) >= 256
    assert statistics.fmean(t.output_lens) == pytest.approx(8000, rel=0.1)
    assert all(it.priority == 1 for it in t)


def test_long_context_prompts_are_log_uniform_between_8k_and_100k():
    t = w.long_context(2000, seed=2)
    lens = t.prompt_lens
    assert 8192 <= min(lens) and max(lens) <= 100_000
    # log-uniform: half the mass below the geometric mean of the range
    geo = (8192 * 100_000) ** 0.5
    assert sum(x < geo for x in lens) / len(lens) == pytest.approx(0.5, abs=0.05)


def test_shared_prefix_is_identical_and_the_rest_is_not():
    t = w.shared_prefix(6, prefix_len=40, seed=0)
    ids = [it.prompt_token_ids(1000) for it in t]
    assert all(x[:40] == ids[0][:40] for x in ids)
    assert len({tuple(x[40:41]) for x in ids}) > 1
    assert all(len(x) == it.prompt_len for x, it in zip(ids, t, strict=True))


def test_token_ids_stay_inside_the_vocabulary():
    it = w.chat(1, seed=0)[0]
    ids = it.prompt_token_ids(50)
    assert all(w.FIRST_TOKEN_ID <= t < 50 for t in ids)
    assert len(ids) == it.prompt_len


def test_poisson_arrivals_have_the_requested_rate():
    t = w.chat(3000, seed=4, rate=5.0)
    times = [it.arrival_time for it in t]
    assert times == sorted(times) and times[0] > 0
    gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
    assert statistics.fmean(gaps) == pytest.approx(1 / 5.0, rel=0.06)
    assert statistics.stdev(gaps) == pytest.approx(1 / 5.0, rel=0.1)  # exponential: sd = mean
    assert all(it.arrival_time == 0.0 for it in w.chat(10, seed=4))


def test_fixed_and_merge():
    a = w.fixed([5, 6], 3, name="a")
    b = w.fixed([7], [9], arrival=[0.5], name="b")
    m = w.merge(b, a)
    assert [it.request_id for it in m] == ["a-0", "a-1", "b-0"]
    assert m[2].output_len == 9
    with pytest.raises(ValueError):
        w.merge(a, a)
    with pytest.raises(ValueError):
        w.fixed([1, 2], [1])


def test_items_ask_for_exactly_their_output_length():
    it = w.chat(1, seed=0)[0]
    p = it.sampling_params()
    assert (p.max_tokens, p.ignore_eos, p.temperature) == (it.output_len, True, 0.0)
