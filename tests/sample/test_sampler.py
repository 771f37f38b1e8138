"""The sampler's filters against transformers' logits warpers, and its per-request seeding."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from minivllm.request import Request
from minivllm.sample.sampler import Sampler
from minivllm.sampling_params import SamplingParams


def _req(rid, **kw):
    return Request(rid, [1, 2, 3], SamplingParams(**kw))


@pytest.mark.parametrize("temperature", [0.5, 1.0, 1.7])
@pytest.mark.parametrize("top_k", [0, 1, 5, 50])
@pytest.mark.parametrize("top_p", [1.0, 0.9, 0.3, 0.01])
def test_filters_match_transformers(temperature, top_k, top_p):
    torch.manual_seed(0)
    logits = torch.randn(4, 100) * 3
    logits[1, :10] = 2.0  # ties at the top-k boundary
    reqs = [_req(str(i), temperature=temperature, top_k=top_k, top_p=top_p) for i in range(4)]
    ours = Sampler().filter_logits(logits.clone(), reqs)
    ref = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k:
        ref = TopKLogitsWarper(top_k)(None, ref)
    if top_p < 1.0:
        ref = TopPLogitsWarper(top_p)(None, ref)
    assert torch.equal(torch.isinf(ours), torch.isinf(ref))
    finite = ~torch.isinf(ref)
    torch.testing.assert_close(ours[finite], ref[finite])


def test_rows_keep_their_own_settings():
    logits = torch.randn(2, 50)
    reqs = [_req("a", temperature=1.0, top_k=3), _req("b", temperature=1.0, top_p=1.0)]
    out = Sampler().filter_logits(logits, reqs)
    assert int((~torch.isinf(out[0])).sum()) == 3 and not torch.isinf(out[1]).any()


def _draw(sampler, logits, reqs):
    tokens, failed = sampler(logits, reqs)
    assert not failed
    return tokens


def test_greedy_rows_take_the_argmax_and_seeded_rows_are_reproducible():
    logits = torch.randn(3, 64)
    reqs = [_req("g", temperature=0), _req("s", temperature=1.0, seed=3), _req("u", temperature=1.0)]
    a = _draw(Sampler(), logits, reqs)
    assert a[0] == int(logits[0].argmax())
    draws_1 = [_draw(Sampler(), logits[1:2], [_req("s", temperature=1.0, seed=3)])[0] for _ in range(3)]
    assert len(set(draws_1)) == 1 and draws_1[0] == a[1]


def test_seeded_stream_does_not_depend_on_neighbours():
    torch.manual_seed(1)
    rows = [torch.randn(64) for _ in range(20)]
    solo_sampler, crowd_sampler = Sampler(), Sampler(seed=5)
    me = _req("me", temperature=1.0, seed=11)
    solo = [_draw(solo_sampler, r[None], [me])[0] for r in rows]
    crowd = []
    for k, r in enumerate(rows):
        noise = torch.randn(2, 64)
        batch = torch.stack([noise[0], r, noise[1]])
        others = [_req("x", temperature=1.0), _req("y", temperature=0.5, seed=2)]
        reqs = [others[0], me, others[1]] if k % 2 else [others[1], others[0], me]
        batch = batch if k % 2 else torch.stack([noise[1], noise[0], r])
        crowd.append(_draw(crowd_sampler, batch, reqs)[reqs.index(me)])
    assert solo == crowd


def test_min_tokens_blocks_stop_tokens():
    logits = torch.zeros(1, 10)
    logits[0, 2] = 100.0  # EOS would win
    r = Request("m", [1], SamplingParams(temperature=0, min_tokens=3, max_tokens=5), eos_token_ids=(2,))
    assert _draw(Sampler(), logits.clone(), [r])[0] != 2
    r.all_token_ids += [5, 5, 5]
    assert _draw(Sampler(), logits.clone(), [r])[0] == 2


def test_greedy_tokens_are_where_probs_puts_its_one_hot():
    """Row by row at each row's output position: the stop token is masked before min_tokens
    (offsets 0 and 1 of a request with 1 output token and min_tokens 3), not after, and the
    logits handed in are left as they were."""
    logits = torch.zeros(4, 10)
    logits[:, 2] = 100.0  # EOS would win
    logits[:, 7] = 50.0
    r = Request("m", [1], SamplingParams(temperature=0, min_tokens=3, max_tokens=9), eos_token_ids=(2,))
    r.all_token_ids += [5]
    rows, offsets = [r] * 4, [0, 1, 2, 3]
    before = logits.clone()
    tokens = Sampler().greedy_tokens(logits, rows, offsets)
    assert tokens.tolist() == [7, 7, 2, 2]
    assert torch.equal(tokens, Sampler().probs(logits, rows, offsets).argmax(-1))
    assert torch.equal(logits, before)


def test_draws_follow_the_filtered_distribution():
    """The exponential race samples exactly softmax(logits / T) after top-k / top-p."""
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -30.0]])
    sampler = Sampler(seed=0)
    for params in ({"temperature": 0.7}, {"temperature": 1.3, "top_k": 3}, {"temperature": 1.0, "top_p": 0.8}):
        req = _req("d", **params)
        want = sampler.filter_logits(logits.clone(), [req]).softmax(-1)[0]
        n = 20_000
        counts = torch.zeros(6)
        for tok in _draw(sampler, logits.expand(n, 6).clone(), [req] * n):
            counts[tok] += 1
        freq = counts / n
        # 5 standard errors at n=20,000 is at most 0.018; impossible tokens are never drawn
        assert torch.all((freq - want).abs() <= 5 * (want * (1 - want) / n).sqrt() + 1e-9), (params, freq, want)


def test_unusable_rows_fail_alone():
    logits = torch.randn(4, 16)
    logits[1, 3] = float("nan")
    logits[2] = float("-inf")
    logits[3, 0] = float("inf")
    reqs = [_req(str(i), temperature=t) for i, t in enumerate((0.0, 0.0, 1.0, 1.0))]
    tokens, failed = Sampler(seed=1)(logits, reqs)
    assert sorted(failed) == [1, 2, 3] and "non-finite" in failed[1]
    assert tokens[0] == int(logits[0].argmax())


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_sampling_runs_where_the_logits_are(device):
    """Every parameter tensor is built on the logits' device; seeded draws agree across
    batch compositions on that device."""
    logits = torch.randn(4, 32, device=device)
    reqs = [
        _req("a", temperature=0.0), _req("b", temperature=0.8, top_k=5, seed=7),
        _req("c", temperature=1.2, top_p=0.5), _req("d", temperature=1.0, top_k=3, top_p=0.9, min_tokens=2),
    ]
    tokens = _draw(Sampler(seed=0), logits, reqs)
    assert len(tokens) == 4 and all(0 <= t < 32 for t in tokens)
    again = _draw(Sampler(), logits[1:2], [_req("b", temperature=0.8, top_k=5, seed=7)])
    assert again[0] == tokens[1]


def test_filters_build_nothing_on_another_device():
    """On the meta device a CPU tensor meeting the logits would raise: the filters must not
    create one."""
    logits = torch.empty(3, 50, device="meta")
    reqs = [_req(str(i), temperature=0.5 + i, top_k=4, top_p=0.9) for i in range(3)]
    out = Sampler().filter_logits(logits, reqs)
    assert out.device.type == "meta" and out.shape == (3, 50)


def test_zeros_in_the_noise_never_draw_a_token_of_probability_zero(monkeypatch):
    """Some devices' exponential_ emits an exact 0 now and then; 0 / 0 would be a NaN that argmax
    takes. With every noise value 0, a top-k row still draws one of its k tokens."""
    import torch

    from minivllm.request import Request
    from minivllm.sample.sampler import Sampler
    from minivllm.sampling_params import SamplingParams

    monkeypatch.setattr(torch.Tensor, "exponential_", lambda self, *a, **k: self.zero_())
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    reqs = [Request(f"r{i}", [1], SamplingParams(temperature=1.0, top_k=3, seed=i if i % 2 else None))
            for i in range(4)]
    tokens, failed = Sampler(seed=0)(logits, reqs)
    assert not failed
    top3 = logits.topk(3).indices.tolist()
    assert all(t in top3[i] for i, t in enumerate(tokens))
