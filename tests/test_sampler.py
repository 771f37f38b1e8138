"""The sampler's filters against transformers' logits warpers, and its per-request seeding."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from minivllm.engine.sampler import Sampler
from minivllm.request import Request
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


def test_greedy_rows_take_the_argmax_and_seeded_rows_are_reproducible():
    logits = torch.randn(3, 64)
    reqs = [_req("g", temperature=0), _req("s", temperature=1.0, seed=3), _req("u", temperature=1.0)]
    a = Sampler()(logits, reqs)
    assert a[0] == int(logits[0].argmax())
    draws_1 = [Sampler()(logits[1:2], [_req("s", temperature=1.0, seed=3)])[0] for _ in range(3)]
    assert len(set(draws_1)) == 1 and draws_1[0] == a[1]


def test_seeded_stream_does_not_depend_on_neighbours():
    torch.manual_seed(1)
    rows = [torch.randn(64) for _ in range(20)]
    solo_sampler, crowd_sampler = Sampler(), Sampler(seed=5)
    me = _req("me", temperature=1.0, seed=11)
    solo = [solo_sampler(r[None], [me])[0] for r in rows]
    crowd = []
    for r in rows:
        noise = torch.randn(2, 64)
        batch = torch.stack([noise[0], r, noise[1]])
        crowd.append(crowd_sampler(batch, [_req("x", temperature=1.0), me, _req("y", temperature=0.5, seed=2)])[1])
    assert solo == crowd


def test_min_tokens_blocks_stop_tokens():
    logits = torch.zeros(1, 10)
    logits[0, 2] = 100.0  # EOS would win
    r = Request("m", [1], SamplingParams(temperature=0, min_tokens=3, max_tokens=5), eos_token_ids=(2,))
    assert Sampler()(logits.clone(), [r])[0] != 2
    r.all_token_ids += [5, 5, 5]
    assert Sampler()(logits.clone(), [r])[0] == 2
