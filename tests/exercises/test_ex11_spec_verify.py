"""Grade exercise 11 (`pytest -m ex11`): beyond the notebook's cases (`test_cases.py`), greedy
rows on random inputs, the rig that plugs a per-request verifier into the engine, and correct
answers other than minivllm's (they use the random numbers another way) passing every case.

Imports `exercises/ex11_spec_verify.py` (your work) by default, `solutions/` with
`MINIVLLM_SOLUTIONS=1` or `--solutions`.
"""

from __future__ import annotations

import textwrap

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minivllm import course
from minivllm.course.grading import run_case
from minivllm.course.loader import load_path
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
    """The docstring's example, through minivllm's own verifier, for any random numbers: [0, 2]."""
    target = torch.tensor([[0.5, 0.3, 0.2], [0.0, 0.4, 0.6], [0.2, 0.2, 0.6]])
    draft = torch.tensor([[0.4, 0.4, 0.2], [0.4, 0.4, 0.2], [0.0, 0.0, 0.0]])  # the last row unused
    for seed in range(20):
        gen = torch.Generator().manual_seed(seed)
        uniforms = torch.rand(3, generator=gen)
        noise = torch.empty(3, 3).exponential_(generator=gen)
        assert verify(target, [[0, 0]], draft, uniforms, noise) == [[0, 2]]


# Correct verifiers that are not minivllm's: each is exact and keeps drafts as often as any exact
# verifier can, but turns the random numbers into decisions another way, so that on the same
# numbers it often emits other tokens than minivllm's. The grader must pass them all.
SHAPES = """
    k = len(draft_tokens)
    if target_probs.dim() != 2 or target_probs.shape[0] != k + 1:
        raise ValueError(f"target_probs {list(target_probs.shape)} for {k} drafts")
    if uniforms.shape != (k,) or noise.shape != target_probs.shape:
        raise ValueError(f"uniforms {list(uniforms.shape)}, noise {list(noise.shape)}")
    if draft_probs is not None and draft_probs.shape != (k, target_probs.shape[1]):
        raise ValueError(f"draft_probs {list(draft_probs.shape)}")
"""
ALTERNATIVES = {
    # keeps a draft when its uniform is *above* 1 - p/q, with a division; q built one-hot for a
    # guess; the leftover written p - min(p, q)
    "upper_uniform": """
def verify_drafts(target_probs, draft_tokens, draft_probs, uniforms, noise):
    SHAPES
    for i, d in enumerate(draft_tokens):
        p = target_probs[i]
        if draft_probs is None:
            q = torch.zeros_like(p)
            q[d] = 1.0
        else:
            q = draft_probs[i]
        if 1.0 - float(uniforms[i]) < float(p[d]) / float(q[d]):
            continue
        rest = p - torch.minimum(p, q)
        if float(rest.sum()) <= 0.0:
            rest = p
        return [int(t) for t in draft_tokens[:i]] + [int(torch.argmax(rest / noise[i]))]
    return [int(t) for t in draft_tokens] + [int(torch.argmax(target_probs[k] / noise[k]))]
""",
    # the keep test in logarithms; every draw by inverting the weights' distribution function at
    # the uniform 1 - exp(-e) made of the row's first Exp(1) number (the others go unused)
    "inverse_cdf": """
def _draw(weights, e):
    w = weights.double()
    if not float(w.sum()) > 0.0:
        return None
    c = torch.cumsum(w, 0)
    v = -torch.expm1(-e.double())  # U(0, 1)
    i = int(torch.searchsorted(c, v * c[-1], right=True))
    return min(i, int(torch.nonzero(w > 0).max()))  # v * total rounded up to the total


def verify_drafts(target_probs, draft_tokens, draft_probs, uniforms, noise):
    SHAPES
    for i, d in enumerate(draft_tokens):
        p = target_probs[i].double()
        p_d = float(p[d])
        q_d = 1.0 if draft_probs is None else float(draft_probs[i, d])
        u = float(uniforms[i])
        if p_d > 0.0 and (u == 0.0 or math.log(u) < math.log(p_d) - math.log(q_d)):
            continue
        if draft_probs is None:
            rest = p.clone()
            rest[d] = 0.0
        else:
            rest = (p - draft_probs[i].double()).clamp(min=0.0)
        t = _draw(rest, noise[i, 0])
        return [int(x) for x in draft_tokens[:i]] + [_draw(p, noise[i, 0]) if t is None else t]
    return [int(x) for x in draft_tokens] + [_draw(target_probs[k], noise[k, 0])]
""",
}


def _alternative(name: str, tmp_path):
    source = "import math\n\nimport torch\n\n" + textwrap.dedent(ALTERNATIVES[name]).replace(
        "    SHAPES\n", textwrap.indent(textwrap.dedent(SHAPES), "    "))
    path = tmp_path / f"alt_{name}.py"
    path.write_text(source)
    return load_path(path, NAME, f"alternative_{name}")


@pytest.mark.parametrize("name", sorted(ALTERNATIVES))
def test_a_different_correct_verifier_passes_every_case(name, tmp_path):
    alt = _alternative(name, tmp_path)
    failed = [f"{c.name}: {r.message}" for c in course.cases_for(NAME) if not (r := run_case(c, alt)).passed]
    assert not failed, "\n".join(failed)


@pytest.mark.parametrize("name", sorted(ALTERNATIVES))
def test_the_alternative_is_not_minivllms_rule_in_disguise(name, tmp_path):
    """On the same random numbers it often emits other tokens than minivllm's verifier."""
    alt = _alternative(name, tmp_path)
    gen = torch.Generator().manual_seed(0)
    differ = 0
    for _ in range(200):
        p = torch.rand(3, 6, generator=gen).softmax(-1)
        q = torch.rand(2, 6, generator=gen).softmax(-1)
        drafts = [int(torch.multinomial(q[i], 1, generator=gen)) for i in range(2)]
        u, e = torch.rand(2, generator=gen), torch.empty(3, 6).exponential_(generator=gen)
        mine = alt.verify_drafts(p, drafts, q, u, e)
        theirs = verify(p, [drafts], torch.cat([q, torch.zeros(1, 6)]), torch.cat([u, torch.zeros(1)]), e)[0]
        differ += mine != theirs
    assert differ > 40, f"only {differ} of 200 steps differ from minivllm's"


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
