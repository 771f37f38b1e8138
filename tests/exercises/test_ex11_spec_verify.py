"""Grade exercise 11 (`pytest -m ex11`): beyond the notebook's cases (`test_cases.py`), greedy
steps on random inputs, the rig that plugs a step verifier into the engine, the work rule against
minivllm's own verifier, and correct answers other than minivllm's (they use the random numbers
another way, and lay the step out another way) passing every case.

Imports `exercises/ex11_spec_verify.py` (your work) by default, `solutions/` with
`MINIVLLM_SOLUTIONS=1` or `--solutions`.
"""

from __future__ import annotations

import textwrap
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minivllm import course
from minivllm.course.checks import ex11_spec_verify as checks
from minivllm.course.grading import run_case
from minivllm.course.loader import load_path
from minivllm.course.verifier import (
    VerifierOutputError,
    check_emitted,
    check_step,
    checked,
    with_verifier,
)
from minivllm.spec_decode.rejection import verify

NAME = "ex11_spec_verify"


@st.composite
def greedy_step(draw):
    vocab = draw(st.integers(2, 40))
    requests = []
    for _ in range(draw(st.integers(1, 6))):
        k = draw(st.integers(0, 5))
        best = draw(st.lists(st.integers(0, vocab - 1), min_size=k + 1, max_size=k + 1))
        drafts = [b if draw(st.booleans()) else draw(st.integers(0, vocab - 1)) for b in best[:k]]
        requests.append((best, drafts))
    return vocab, requests, draw(st.booleans()), draw(st.integers(0, 2**31 - 1))


@settings(max_examples=100, deadline=None)
@given(greedy_step())
def test_greedy_steps_give_the_greedy_tokens(ex, case):
    """One-hot target rows, several requests a step: each request's drafts up to its first that
    is not the argmax, then the argmax, whatever the draft's distribution and the random numbers."""
    vocab, requests, guesses, seed = case
    gen = torch.Generator().manual_seed(seed)
    rows = [b for best, _ in requests for b in best]
    target = torch.zeros(len(rows), vocab)
    target[torch.arange(len(rows)), rows] = 1.0
    q = None
    if not guesses:
        q = torch.rand(len(rows), vocab, generator=gen) + 1e-3
        q /= q.sum(dim=1, keepdim=True)
    uniforms = torch.rand(len(rows), generator=gen)
    noise = torch.empty(len(rows), vocab).exponential_(generator=gen)
    want = []
    for best, drafts in requests:
        a = next((i for i, (b, d) in enumerate(zip(best, drafts, strict=False)) if b != d), len(drafts))
        want.append([*drafts[:a], best[a]])
    assert ex.verify_step(target, [d for _, d in requests], q, uniforms, noise) == want


def test_the_worked_example_is_minivllms():
    """The docstring's example, through minivllm's own verifier, for any random numbers."""
    target, drafts, draft, want = checks.worked_example()
    for seed in range(20):
        gen = torch.Generator().manual_seed(seed)
        uniforms = torch.rand(6, generator=gen)
        noise = torch.empty(6, 4).exponential_(generator=gen)
        assert verify(target, drafts, draft, uniforms, noise) == want


def test_minivllms_verifier_keeps_to_the_work_rule():
    """The budgets are met by the engine's own verifier, on the very steps the check counts."""
    engine = SimpleNamespace(verify_step=verify)
    for draft_model in (True, False):
        for n in checks.WORK_STEPS:
            work, transfers = checks.work_of(engine, checks.work_step(n, draft_model, seed=n))
            assert work.operations <= checks.MAX_OPERATIONS and transfers.count <= checks.MAX_TRANSFERS


def test_the_work_rule_sees_a_loop_over_requests():
    """The same right answers, one request at a time, run operations and transfers per request."""

    def per_request(target_probs, draft_tokens, draft_probs, uniforms, noise):
        out, row = [], 0
        for drafts in draft_tokens:
            n = len(drafts) + 1
            q = None if draft_probs is None else draft_probs[row : row + n]
            out += verify(target_probs[row : row + n], [drafts], q, uniforms[row : row + n], noise[row : row + n])
            row += n
        return out

    step = checks.work_step(checks.WORK_STEPS[-1], True, seed=1)
    work, transfers = checks.work_of(SimpleNamespace(verify_step=per_request), step)
    assert work.operations > 10 * checks.MAX_OPERATIONS and transfers.count > 10 * checks.MAX_TRANSFERS


# Correct verifiers that are not minivllm's: each is exact and keeps drafts as often as any exact
# verifier can, but turns the random numbers into decisions another way, so that on the same
# numbers it often emits other tokens than minivllm's; and each finds a request's first stop its
# own way (a running count of stops; the rows laid out as a padded grid). The grader must pass them.
SHAPES = """
if target_probs.dim() != 2:
    raise ValueError(f"target_probs {list(target_probs.shape)}")
num_rows = target_probs.shape[0]
need = sum(len(d) + 1 for d in draft_tokens)
if num_rows != need or uniforms.shape != (num_rows,) or noise.shape != target_probs.shape:
    raise ValueError(f"{num_rows} rows for R = {need}; uniforms {list(uniforms.shape)}, noise {list(noise.shape)}")
if draft_probs is not None and draft_probs.shape != target_probs.shape:
    raise ValueError(f"draft_probs {list(draft_probs.shape)}")
"""
ALTERNATIVES = {
    # keeps a draft when its uniform is *above* 1 - p/q, with a division; q built one-hot for a
    # guess; the leftover written p - min(p, q); a request's kept drafts counted with a running
    # sum of stops over the whole step
    "upper_uniform": """
def verify_step(target_probs, draft_tokens, draft_probs, uniforms, noise):
    SHAPES
    device = target_probs.device
    flat, owner, starts = [], [], []
    for r, drafts in enumerate(draft_tokens):
        starts.append(len(flat))
        flat += [int(d) for d in drafts] + [0]
        owner += [r] * (len(drafts) + 1)
    last = torch.zeros(num_rows, dtype=torch.bool, device=device)
    last[[s + len(d) for s, d in zip(starts, draft_tokens)]] = True
    d = torch.tensor(flat, dtype=torch.long, device=device)[:, None]
    if draft_probs is None:
        q = torch.zeros_like(target_probs).scatter(1, d, 1.0)
    else:
        q = draft_probs
    p_d, q_d = target_probs.gather(1, d)[:, 0], q.gather(1, d)[:, 0]
    kept = ~last & (1.0 - uniforms < p_d / q_d)
    rest = target_probs - torch.minimum(target_probs, q)
    rest = torch.where(last[:, None] | (rest.sum(1, keepdim=True) <= 0), target_probs, rest)
    token = torch.argmax(torch.where(rest > 0, rest / noise, -1.0), dim=1)
    # a request's kept drafts: its rows before its first stop, counted with a running sum of stops
    stops = (~kept).long()
    run = torch.cumsum(stops, 0)
    owner_t = torch.tensor(owner, dtype=torch.long, device=device)
    start_t = torch.tensor(starts, dtype=torch.long, device=device)
    before = (run - stops)[start_t]
    a = torch.zeros(len(starts), dtype=torch.long, device=device).index_add(
        0, owner_t, (run == before[owner_t]).long())
    out = torch.stack([a, token[start_t + a]]).tolist()
    return [[int(x) for x in drafts[:n]] + [t] for drafts, n, t in zip(draft_tokens, out[0], out[1])]
""",
    # the keep test in logarithms; every draw by inverting the weights' distribution function at
    # the uniform 1 - exp(-e) made of the row's first Exp(1) number (the others go unused); the
    # rows laid out as a [requests, k_max + 1] grid padded with each request's last row
    "inverse_cdf": """
def _draw(weights, e):
    # inverts each row's distribution function at the uniform 1 - exp(-e)
    w = weights.double()
    c = torch.cumsum(w, 1)
    v = -torch.expm1(-e.double())
    i = torch.searchsorted(c, (v * c[:, -1])[:, None], right=True)[:, 0]
    top = torch.where(w > 0, torch.arange(w.shape[1], device=w.device), 0).amax(1)
    return torch.minimum(i, top)  # v * total rounded up to the total


def verify_step(target_probs, draft_tokens, draft_probs, uniforms, noise):
    SHAPES
    device = target_probs.device
    flat, grid, width = [], [], max(len(d) for d in draft_tokens) + 1 if draft_tokens else 1
    for drafts in draft_tokens:
        s = len(flat)
        flat += [int(d) for d in drafts] + [-1]
        grid.append([s + min(i, len(drafts)) for i in range(width)])  # padded with the last row
    d = torch.tensor(flat, dtype=torch.long, device=device)
    has = d >= 0
    idx = d.clamp(min=0)[:, None]
    p = target_probs.double()
    log_p = torch.log(p.gather(1, idx)[:, 0])
    if draft_probs is None:
        log_q = torch.zeros_like(log_p)
        rest = p.scatter(1, idx, 0.0)
    else:
        log_q = torch.log(draft_probs.double().gather(1, idx)[:, 0])
        rest = (p - draft_probs.double()).clamp(min=0.0)
    u = uniforms.double()
    kept = has & (log_p > -math.inf) & ((u == 0) | (torch.log(u) < log_p - log_q))
    rest = torch.where(has[:, None] & (rest.sum(1, keepdim=True) > 0), rest, p)
    token = _draw(rest, noise[:, 0])
    g = torch.tensor(grid, dtype=torch.long, device=device).reshape(len(draft_tokens), width)
    a = (~kept[g]).int().argmax(1)  # the first row that is not kept
    a_l = a.tolist()
    t_l = token[g.gather(1, a[:, None])[:, 0]].tolist()
    return [[int(x) for x in drafts[:n]] + [t] for drafts, n, t in zip(draft_tokens, a_l, t_l)]
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
    p = torch.rand(300, 6, generator=gen).softmax(-1)
    q = torch.rand(300, 6, generator=gen).softmax(-1)
    drafts = [[int(torch.multinomial(q[3 * r + i], 1, generator=gen)) for i in range(2)] for r in range(100)]
    u, e = torch.rand(300, generator=gen), torch.empty(300, 6).exponential_(generator=gen)
    mine, theirs = alt.verify_step(p, drafts, q, u, e), verify(p, drafts, q, u, e)
    differ = sum(a != b for a, b in zip(mine, theirs, strict=True))
    assert differ > 20, f"only {differ} of 100 requests differ from minivllm's"


def test_checked_hands_the_arguments_over_as_they_are():
    seen = []

    def record(*args):
        seen.append(args)
        return [[*d, 0] for d in args[1]]

    args = (torch.full((4, 2), 0.5), [[1, 0], []], None, torch.zeros(4), torch.ones(4, 2))
    assert checked(record)(*args) == [[1, 0, 0], [0]]
    assert all(a is b for a, b in zip(seen[0], args, strict=True))


@pytest.mark.parametrize("emitted, message", [
    ([[1, 2], [0]], None),
    ([[1, 2]], "2 requests needs 2 lists"),
    ([[1, 2], [0, 0]], "request 1: with 0 drafts"),
    ([[2, 0], [0]], "request 0: all tokens but the last"),
    ("12", "one list of token ids per request"),
])
def test_check_step_names_the_request(emitted, message):
    if message is None:
        assert check_step(emitted, [[1, 2], []], 5) == [[1, 2], [0]]
    else:
        with pytest.raises(VerifierOutputError, match=message):
            check_step(emitted, [[1, 2], []], 5)


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


def test_a_verifier_must_be_callable_and_the_config_a_dict():
    from minivllm import LLM

    with pytest.raises(TypeError, match="must be callable"):
        with_verifier({"method": "ngram", "num_speculative_tokens": 2}, 3)
    with pytest.raises(TypeError, match="must be a dict"):
        with_verifier("ngram", lambda *args: [[0]])
    with pytest.raises(TypeError, match=r"speculative_config\['verifier'\] must be callable"):
        LLM(dtype="float32", speculative_config={"method": "ngram", "num_speculative_tokens": 2, "verifier": 3})
