"""Grade exercise 11 (`pytest -m ex11`): beyond the notebook's cases (`test_cases.py`), greedy
rows on random inputs, and the rig that plugs a per-request verifier into the engine.

Imports `exercises/ex11_spec_verify.py` (your work) by default, `solutions/` with
`MINIVLLM_SOLUTIONS=1` or `--solutions`.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minivllm.course.verifier import VerifierOutputError, batched, check_emitted, use_verifier
from minivllm.spec_decode.rejection import verify

NAME = "ex11_spec_verify"


@st.composite
def greedy_case(draw):
    vocab = draw(st.integers(2, 40))
    k = draw(st.integers(0, 6))
    best = draw(st.lists(st.integers(0, vocab - 1), min_size=k + 1, max_size=k + 1))
    drafts = [b if draw(st.booleans()) else draw(st.integers(0, vocab - 1)) for b in best[:k]]
    seed = draw(st.integers(0, 2**31 - 1))
    return vocab, best, drafts, draw(st.booleans()), seed


@settings(max_examples=150, deadline=None)
@given(greedy_case())
def test_greedy_rows_give_the_greedy_tokens(ex, case):
    """One-hot target rows: the drafts up to the first that is not the argmax, then the argmax,
    whatever the draft's distribution and the random numbers."""
    vocab, best, drafts, guesses, seed = case
    k = len(drafts)
    gen = torch.Generator().manual_seed(seed)
    target = torch.zeros(k + 1, vocab)
    target[torch.arange(k + 1), best] = 1.0
    q = None
    if not guesses:
        q = torch.rand(k, vocab, generator=gen) + 1e-3
        q /= q.sum(dim=1, keepdim=True)
    uniforms = torch.rand(k, generator=gen)
    noise = torch.empty(k + 1, vocab).exponential_(generator=gen)
    want = []
    for b, d in zip(best, drafts, strict=False):
        if d != b:
            break
        want.append(d)
    want.append(best[len(want)])
    assert ex.verify_drafts(target, drafts, q, uniforms, noise) == want


def test_the_worked_example_is_minivllms():
    """The docstring's example, through minivllm's own verifier (any noise): [0, 2]."""
    target = torch.tensor([[0.5, 0.3, 0.2], [0.0, 0.4, 0.6], [0.2, 0.2, 0.6]])
    draft = torch.tensor([[0.4, 0.4, 0.2], [0.0, 0.8, 0.2], [0.0, 0.0, 0.0]])  # the last row unused
    for seed in range(10):
        noise = torch.empty(3, 3).exponential_(generator=torch.Generator().manual_seed(seed))
        assert verify(target, [[0, 1]], draft, torch.tensor([0.9, 0.7, 0.5]), noise) == [[0, 2]]


def test_the_batched_form_hands_each_request_its_own_rows_as_copies():
    seen = []

    def record(target, drafts, q, uniforms, noise):
        seen.append((target.clone(), list(drafts), None if q is None else q.clone(), uniforms.clone(), noise.clone()))
        target.zero_()  # a copy: the engine's tensor keeps its values
        return [*drafts, 0]

    probs = torch.arange(14.0).reshape(7, 2)
    q = probs + 100
    uniforms = torch.arange(7.0) / 10
    noise = probs + 1000
    out = batched(record)(probs, [[1, 0], [], [1, 1]], q, uniforms, noise)
    assert out == [[1, 0, 0], [0], [1, 1, 0]]
    assert probs.equal(torch.arange(14.0).reshape(7, 2))
    rows = [(0, 3), (3, 4), (4, 7)]
    for (target, drafts, q_rows, u, e), (a, b) in zip(seen, rows, strict=True):
        assert target.equal(torch.arange(14.0).reshape(7, 2)[a:b])
        assert q_rows.equal(q[a : b - 1]) and u.equal(uniforms[a : b - 1]) and e.equal(noise[a:b])


@pytest.mark.parametrize("emitted, message", [
    ((1, 2), None),
    ([1, 2, 3, 0], "between 1 and 3"),
    ([], "between 1 and 3"),
    ([2, 0], "the drafts in order"),
    ([1.0], "Python ints"),
    ([torch.tensor(1)], "Python ints"),
    ([7], "outside the vocabulary"),
    ("1", "a list of token ids"),
])
def test_check_emitted_names_what_is_wrong(emitted, message):
    if message is None:
        assert check_emitted(emitted, [1, 2], 5) == [1, 2]
    else:
        with pytest.raises(VerifierOutputError, match=message):
            check_emitted(emitted, [1, 2], 5)


def test_use_verifier_needs_an_engine_that_speculates():
    from minivllm import LLM

    with pytest.raises(ValueError, match="speculative_config"):
        use_verifier(LLM(dtype="float32"), lambda *args: [0])
