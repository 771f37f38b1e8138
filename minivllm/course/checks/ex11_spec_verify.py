"""Cases for ex11_spec_verify: the verifier of speculative decoding, for one request.

What is graded is what the contract promises, not one way of getting there:

* **exactness**, statistically: for made-up target and draft distributions (one per position of
  a short sequence, so that a row read at the wrong position shows), many trials with fresh
  random numbers each; the first emitted token must be distributed as ``p_0``, the first two
  (over as many steps as it takes to emit two) as ``p_0 x p_1``, and the number of drafts kept in
  the first step as the exact law ``P(a >= j) = prod_{i<j} beta_i``, where ``beta_i`` is the
  chance to keep a reached draft (``sum_x min(p_i(x), q_i(x))`` for a draft model, ``p_i(d)``
  for a guess). Each is a chi-square test against the exact distribution, with fixed seeds and a
  threshold at a p-value of ``1e-6``: a correct verifier, whichever way it uses its random
  numbers, fails one of these tests about once in a hundred thousand seeds, and every plausible
  slip in ``tests/test_course.py`` fails by orders of magnitude;
* exact properties, on inputs where exactness and optimality leave one answer whatever the
  random numbers: the shape of the result, the docstring's example, greedy rows (the greedy
  tokens, whatever the drafts), a draft the target rules out, the target equal to the draft
  (everything kept), a rejection whose leftover mass is rounding, determinism, untouched
  inputs, ``ValueError`` on bad shapes;
* the engine: the tiny model served with the student's verifier, greedy (again one answer),
  must give the tokens of the engine without speculation and the acceptance counts of
  minivllm's own verifier.

No case compares with minivllm's verifier on random numbers that leave a choice: a verifier
that uses its uniforms or its noise another way (keeping a draft when ``u`` is *above* some
threshold, drawing a token by inverting a distribution function) is as right, and passes
(``tests/exercises/test_ex11_spec_verify.py`` holds such answers). The uniforms of the exact
cases stay a little away from 0 and 1, so that equivalent comparisons that round differently
agree. Expected values come from the distributions the cases build and from minivllm's engine,
never from the reference answer.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import cache

import torch

from minivllm.course.grading import Case, case, expect, expect_raises
from minivllm.course.verifier import VerifierOutputError, check_emitted

CASES: list[Case] = []
P_VALUE = 1e-6  # a chi-square test fails below this
TRIALS = 6000  # per distribution case


# --- the statistical rig ----------------------------------------------------------------------
@dataclass(frozen=True)
class Setting:
    """Position ``j`` of a sequence has target ``p[j]`` and draft ``q[j]`` (``q`` None: the
    drafts are the fixed guesses ``guess[j]``), whatever came before it; a step starting at
    position ``s`` verifies ``k`` drafts against rows ``p[s .. s + k]``."""

    name: str
    k: int
    p: torch.Tensor  # [k + 2, V] float64
    q: torch.Tensor | None  # [k + 2, V] float64, or None
    guess: tuple[int, ...] = ()  # [k + 2] when q is None

    def keep_chance(self, j: int) -> float:
        if self.q is None:
            return float(self.p[j, self.guess[j]])
        return float(torch.minimum(self.p[j], self.q[j]).sum())

    def accepted_law(self) -> list[float]:
        """P(a = j), j = 0 .. k, for the first step."""
        reach = [1.0]
        for j in range(self.k):
            reach.append(reach[-1] * self.keep_chance(j))
        return [reach[j] - (reach[j + 1] if j < self.k else 0.0) for j in range(self.k + 1)]


def _dist(gen: torch.Generator, vocab: int, zeros: int = 0, sharp: float = 1.0) -> torch.Tensor:
    w = torch.rand(vocab, generator=gen, dtype=torch.float64) ** sharp + 0.02
    if zeros:
        w[torch.randperm(vocab, generator=gen)[:zeros]] = 0.0
    return w / w.sum()


@cache
def settings() -> dict[str, Setting]:
    gen = torch.Generator().manual_seed(11)
    out = {}
    k, vocab = 3, 4
    p = torch.stack([_dist(gen, vocab, zeros=int(j == 1)) for j in range(k + 2)])
    q = torch.stack([_dist(gen, vocab) for _ in range(k + 2)])
    out["draft"] = Setting("draft model, k = 3, 4 tokens, one ruled out at row 1", k, p, q)
    # an overconfident draft: its distributions are sharper versions of distributions of its own
    p = torch.stack([_dist(gen, vocab) for _ in range(k + 2)])
    q = torch.stack([_dist(gen, vocab, sharp=4.0) for _ in range(k + 2)])
    out["sharp"] = Setting("overconfident draft model, k = 3", k, p, q)
    k = 2
    p = torch.stack([_dist(gen, vocab, zeros=int(j == 2)) for j in range(k + 2)])
    guess = tuple(int(torch.argmax(p[j])) if j % 2 == 0 else int(torch.argmin(p[j])) for j in range(k + 2))
    out["ngram"] = Setting("n-gram guesses (draft_probs None), k = 2", k, p, None, guess)
    p = torch.stack([_dist(gen, vocab) for _ in range(2)])
    out["k0"] = Setting("no drafts (k = 0)", 0, p, None, (0, 0))
    return out


@dataclass
class Tally:
    first: torch.Tensor  # [V] counts of the first emitted token
    pairs: torch.Tensor  # [V, V] counts of the first two
    accepted: torch.Tensor  # [k + 1] counts of the drafts kept in the first step


def _call(ex, target, drafts, q, uniforms, noise) -> list[int]:
    got = ex.verify_drafts(target, drafts, q, uniforms, noise)
    try:
        return check_emitted(got, drafts, target.shape[1])
    except VerifierOutputError as err:
        raise AssertionError(f"drafts {drafts}: {err}") from None


def _step(ex, s: Setting, start: int, gen: torch.Generator, dtype: torch.dtype) -> list[int]:
    """One verification at position ``start`` with fresh drafts and random numbers; checks that
    no token comes from a row that rules it out."""
    k, vocab = s.k, s.p.shape[1]
    rows = slice(start, start + k + 1)
    if s.q is None:
        drafts = list(s.guess[start : start + k])
        q = None
    else:
        drafts = [int(torch.multinomial(s.q[start + i], 1, generator=gen)) for i in range(k)]
        q = s.q[start : start + k].to(dtype)
    uniforms = torch.rand(k, generator=gen, dtype=torch.float64).to(dtype)
    noise = torch.empty(k + 1, vocab, dtype=torch.float64).exponential_(generator=gen).clamp_(min=1e-30).to(dtype)
    emitted = _call(ex, s.p[rows].to(dtype), drafts, q, uniforms, noise)
    for i, t in enumerate(emitted):
        if float(s.p[start + i, t]) == 0.0:
            raise AssertionError(f"token {t} emitted at row {i}, where the target gives it probability 0 "
                                 f"(drafts {drafts}, uniforms {uniforms.tolist()})")
    return emitted


@cache
def _tally(ex, key: str, dtype: torch.dtype = torch.float32) -> Tally:
    s = settings()[key]
    vocab = s.p.shape[1]
    gen = torch.Generator().manual_seed(2026)
    first = torch.zeros(vocab)
    pairs = torch.zeros(vocab, vocab)
    accepted = torch.zeros(s.k + 1)
    for _ in range(TRIALS):
        out = _step(ex, s, 0, gen, dtype)
        accepted[len(out) - 1] += 1
        while len(out) < 2:
            out += _step(ex, s, len(out), gen, dtype)
        first[out[0]] += 1
        pairs[out[0], out[1]] += 1
    return Tally(first, pairs, accepted)


def chi_square(observed: torch.Tensor, probs: torch.Tensor) -> tuple[float, int, float]:
    """Pearson's statistic of ``observed`` counts against ``probs``, cells expecting fewer than 5
    merged (cells of probability 0 must be empty), its degrees of freedom and its p-value."""
    observed, probs = observed.flatten().double(), probs.flatten().double()
    n = float(observed.sum())
    if bool((observed[probs == 0] > 0).any()):
        return math.inf, 0, 0.0
    expected = n * probs
    small = (expected < 5) & (probs > 0)
    obs = torch.cat([observed[expected >= 5], observed[small].sum().reshape(1)])
    exp = torch.cat([expected[expected >= 5], expected[small].sum().reshape(1)])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    df = len(exp) - 1
    stat = float(((obs - exp) ** 2 / exp).sum())
    p_value = float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64),
                                            torch.tensor(stat / 2.0, dtype=torch.float64))) if df else 1.0
    return stat, df, p_value


def expect_distributed(observed: torch.Tensor, probs: torch.Tensor, what: str) -> None:
    stat, df, p_value = chi_square(observed, probs)
    if p_value < P_VALUE:
        n = int(observed.sum())
        got = [round(float(x) / n, 3) for x in observed.flatten()]
        want = [round(float(x), 3) for x in probs.flatten()]
        raise AssertionError(
            f"{what}: over {n:,} trials the frequencies {got} are not the target's {want} "
            f"(chi-square {stat:.1f} on {df} degrees of freedom, p = {p_value:.1e} < {P_VALUE:g})"
        )


def _first_two(s: Setting) -> torch.Tensor:
    return torch.outer(s.p[0], s.p[1])


def _distribution_cases(key: str, hint_first: str, hint_count: str) -> None:
    s = settings()[key]

    @case(CASES, f"{s.name}: first token ~ p_0", "verify_drafts", hint_first)
    def _(ex):
        expect_distributed(_tally(ex, key).first, s.p[0], "the first emitted token")

    @case(CASES, f"{s.name}: first two tokens ~ p_0 x p_1", "verify_drafts",
          "the second token must follow the target's row after the first, whether it is a kept draft, "
          "the token after a rejection (next step) or the token after all drafts: which row does each "
          "come from?")
    def _(ex):
        expect_distributed(_tally(ex, key).pairs, _first_two(s), "the first two emitted tokens (joint)")

    if s.k:
        @case(CASES, f"{s.name}: drafts kept per step (mean {sum(j * w for j, w in enumerate(s.accepted_law())):.3f})",
              "verify_drafts", hint_count)
        def _(ex):
            counts = _tally(ex, key).accepted
            law = torch.tensor(s.accepted_law(), dtype=torch.float64)
            mean = float((counts * torch.arange(s.k + 1)).sum() / counts.sum())
            expect_distributed(counts, law, f"the number of drafts kept (mean {mean:.3f}, exactly "
                                            f"{float((law * torch.arange(s.k + 1)).sum()):.3f})")


_distribution_cases(
    "draft", "for each token x, add the chance the step emits x by keeping a draft x and the chance it "
             "emits x after a rejection: the sum must be p(x); what must a rejection supply?",
    "too few or too many drafts kept: no exact rule keeps a draft more often than the overlap "
    "sum_x min(p(x), q(x)); reach it, and end the step at the first rejection",
)
_distribution_cases(
    "sharp", "where the draft proposes x more often than the target wants it (q(x) > p(x)), keeping every "
             "draft x emits too many x's",
    "each draft has its own uniform; keep going only while drafts are kept",
)
_distribution_cases(
    "ngram", "a guess is fixed: as if it were drawn from a distribution that puts all its mass on it; "
             "what is left of p for a rejection to supply?",
    "a fixed guess d is emitted by keeping it at most p(d) of the time",
)
_distribution_cases(
    "k0", "no drafts: the one token is drawn from row 0 with its noise", "",
)


# --- exact properties -------------------------------------------------------------------------
def _t(rows, dtype=torch.float32) -> torch.Tensor:
    return torch.tensor(rows, dtype=dtype)


def _noise(gen: torch.Generator, rows: int, vocab: int) -> torch.Tensor:
    return torch.empty(rows, vocab).exponential_(generator=gen).clamp_(min=1e-30)


def _uniforms(gen: torch.Generator, k: int) -> torch.Tensor:
    """Uniform on [2**-10, 1 - 2**-10]: where one answer is right whatever the uniforms, a rule
    written ``u < p / q``, ``u * q < p`` or ``1 - u < p / q`` gives it, however each rounds."""
    return torch.rand(k, generator=gen) * (1 - 2**-9) + 2**-10


@case(CASES, "the docstring's worked example, for any random numbers", "verify_drafts",
      "row 0 likes token 0 more than the draft did (0.5 >= 0.4); row 1 rules token 0 out; what is left "
      "of row 1 once the draft's own proposals are accounted for?")
def _(ex):
    gen = torch.Generator().manual_seed(0)
    target = _t([[0.5, 0.3, 0.2], [0.0, 0.4, 0.6], [0.2, 0.2, 0.6]])
    draft = _t([[0.4, 0.4, 0.2], [0.4, 0.4, 0.2]])
    for trial in range(40):
        u = _uniforms(gen, 2)
        got = _call(ex, target, [0, 0], draft, u, _noise(gen, 3, 3))
        expect(got, [0, 2], f"uniforms {[round(x, 4) for x in u.tolist()]} (draw {trial})")


@case(CASES, "greedy rows: the greedy tokens, whatever the drafts", "verify_drafts",
      "one-hot target rows: a draft is kept exactly when it is the row's argmax, and the token after "
      "is the argmax of its row")
def _(ex):
    gen = torch.Generator().manual_seed(1)
    vocab = 50
    for trial, (k, one_hot) in enumerate(itertools.product(range(6), (False, True))):
        for _ in range(8):
            best = torch.randint(vocab, (k + 1,), generator=gen).tolist()
            target = torch.zeros(k + 1, vocab)
            target[torch.arange(k + 1), best] = 1.0
            drafts = [b if float(torch.rand(1, generator=gen)) < 0.7 else (b + 1) % vocab for b in best[:k]]
            q = None
            if not one_hot:
                q = torch.rand(k, vocab, generator=gen) + 0.01
                q[torch.arange(k), drafts] += 2.0  # the drafts were likely under q
                q /= q.sum(dim=1, keepdim=True)
            want = []
            for b, d in zip(best, drafts, strict=False):
                if d != b:
                    break
                want.append(d)
            want.append(best[len(want)])
            got = _call(ex, target, drafts, q, _uniforms(gen, k), _noise(gen, k + 1, vocab))
            expect(got, want, f"k = {k}, {'guesses' if one_hot else 'draft model'}, argmaxes {best}, "
                              f"drafts {drafts} (case {trial})")


@case(CASES, "a draft the target rules out is never kept, even with a uniform of 0", "verify_drafts",
      "a token with p(d) = 0 may never be emitted at that row, not even for a uniform at the end of its "
      "range, nor as the token in the draft's place")
def _(ex):
    gen = torch.Generator().manual_seed(2)
    target = _t([[0.0, 0.5, 0.5, 0.0], [0.25] * 4])
    for q in (_t([[0.7, 0.1, 0.1, 0.1]]), None):
        for u in (0.0, 0.5, 0.999999):
            got = _call(ex, target, [0], q, _t([u]), _noise(gen, 2, 4))
            if len(got) != 1 or got[0] not in (1, 2):
                raise AssertionError(f"target row 0 {target[0].tolist()} rules out draft 0, uniform {u}, "
                                     f"draft_probs {None if q is None else q.tolist()}: expected one token, "
                                     f"1 or 2, got {got}")


@case(CASES, "the target equals the draft: every draft kept, then one from the last row", "verify_drafts",
      "p = q leaves exactness no reason to reject anything; after the last draft, one token comes from "
      "the row that follows it")
def _(ex):
    gen = torch.Generator().manual_seed(3)
    p = torch.stack([_dist(gen, 5) for _ in range(4)]).float()
    drafts = [int(torch.multinomial(p[i], 1, generator=gen)) for i in range(3)]
    last = torch.zeros(5)
    for _ in range(TRIALS // 3):
        u = _uniforms(gen, 3)
        got = _call(ex, p, drafts, p[:3].clone(), u, _noise(gen, 4, 5))
        if got[:3] != drafts or len(got) != 4:
            raise AssertionError(f"p == q: expected the 3 drafts {drafts} then one token, got {got} "
                                 f"(uniforms {u.tolist()})")
        last[got[3]] += 1
    expect_distributed(last, p[3].double(), "the token after the last draft")


@case(CASES, "a rejection that rounding leaves nothing to draw from", "verify_drafts",
      "when the draft's row covers the target's everywhere (rows that sum to 1 only up to rounding), what "
      "is left after a rejection can be all zeros, and the argmax of a row of zeros is token 0, which is "
      "no draw: the token must still be one the target allows")
def _(ex):
    gen = torch.Generator().manual_seed(4)
    third = 1 / 3
    p = _t([[0.0, 0.5, 0.25, 0.25], [0.0, third, third, third]])  # token 0 ruled out at both rows
    # the draft proposed token 0, which the target rules out: rejected whatever the rule; the
    # draft's row is the target's plus 2**-24 on token 0 (a sum of 1 up to float32 rounding)
    covering = p[:1].clone()
    covering[0, 0] = 2**-24
    # the draft proposed token 1 with one float32 step more than the target gives it: rejected
    # for a few uniforms (which ones depends on the rule), and then nothing is left either
    above = p[:1].clone()
    above[0, 1] = torch.nextafter(above[0, 1], torch.tensor(2.0))
    for draft, q, uniforms in ((0, covering, (0.0, 0.5, 1 - 2**-24)),
                               (1, above, (2**-24, 2**-23, 0.5, 1 - 2**-23, 1 - 2**-24))):
        for u in uniforms:
            for _ in range(10):
                got = _call(ex, p, [draft], q, _t([u]), _noise(gen, 2, 4))
                if 0 in got:
                    raise AssertionError(f"target {p.tolist()}, draft {draft} from {q.tolist()}, uniform {u}: "
                                         f"got {got}; token 0 has target probability 0")


@case(CASES, "float64 rows, the same laws", "verify_drafts",
      "nothing in the contract depends on the dtype: do not convert to float32 or to Python floats wrongly")
def _(ex):
    s = settings()["draft"]
    expect_distributed(_tally(ex, "draft", torch.float64).first, s.p[0], "the first emitted token (float64)")


@case(CASES, "deterministic, inputs untouched", "verify_drafts",
      "use only the random numbers given (no torch.rand of your own) and change no argument in place")
def _(ex):
    gen = torch.Generator().manual_seed(5)
    s = settings()["draft"]
    for trial in range(30):
        drafts = [int(torch.multinomial(s.q[i], 1, generator=gen)) for i in range(s.k)]
        args = (s.p[: s.k + 1].float(), drafts, s.q[: s.k].float(), torch.rand(s.k, generator=gen),
                _noise(gen, s.k + 1, s.p.shape[1]))
        copies = [a.clone() if isinstance(a, torch.Tensor) else list(a) for a in args]
        torch.manual_seed(trial)
        once = _call(ex, *args)
        torch.manual_seed(trial + 1000)
        again = _call(ex, *args)
        expect(again, once, f"the same arguments twice (trial {trial})")
        for name, a, c in zip(("target_probs", "draft_tokens", "draft_probs", "uniforms", "noise"), args, copies,
                              strict=True):
            same = torch.equal(a, c) if isinstance(a, torch.Tensor) else a == c
            if not same:
                raise AssertionError(f"{name} was changed by the call")


@case(CASES, "shapes that do not fit raise ValueError", "verify_drafts",
      "k = len(draft_tokens): target_probs and noise [k + 1, V], draft_probs [k, V], uniforms [k]")
def _(ex):
    p, q = torch.full((3, 4), 0.25), torch.full((2, 4), 0.25)
    u, e = torch.full((2,), 0.5), torch.ones(3, 4)
    bad = {
        "target_probs with k rows": (p[:2], [0, 1], q, u, e),
        "target_probs with k + 2 rows": (torch.full((4, 4), 0.25), [0, 1], q, u, e),
        "one uniform short": (p, [0, 1], q, u[:1], e),
        "noise with k rows": (p, [0, 1], q, u, e[:2]),
        "draft_probs with k + 1 rows": (p, [0, 1], torch.full((3, 4), 0.25), u, e),
    }
    for note, args in bad.items():
        expect_raises(ValueError, lambda args=args: ex.verify_drafts(*args), note)


# --- the engine -------------------------------------------------------------------------------
ENGINE_PROMPTS = [
    "Once upon a time there was a little girl named Mia. Mia had a red ball. Once upon a time",
    "Tom went to the market and bought an apple. Tom went to the market and",
    "The little fox lived in a den at the edge of the forest. The little fox",
]


@cache
def _reference_runs(dtype: str) -> dict[str, tuple[list[list[int]], dict]]:
    from minivllm import LLM, SamplingParams

    greedy = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    runs = {}
    plain = LLM(dtype=dtype, seed=0)
    runs["plain"] = ([o.outputs[0].token_ids for o in plain.generate(ENGINE_PROMPTS, greedy, use_tqdm=False)], {})
    for method, config in _spec_configs().items():
        llm = LLM(dtype=dtype, seed=0, speculative_config=config)
        outs = llm.generate(ENGINE_PROMPTS, greedy, use_tqdm=False)
        runs[method] = ([o.outputs[0].token_ids for o in outs], _spec_stats(llm))
    return runs


def _spec_configs() -> dict[str, dict]:
    import minivllm

    draft_dir = getattr(minivllm, "TINY_DRAFT_MODEL_DIR", minivllm.TINY_MODEL_DIR)
    return {
        "ngram": {"method": "ngram", "num_speculative_tokens": 4},
        "draft_model": {"method": "draft_model", "model": str(draft_dir), "num_speculative_tokens": 3},
    }


def _spec_stats(llm) -> dict:
    s = llm.stats().summary()
    return {key: s[key] for key in ("spec_draft_tokens", "spec_accepted_tokens")}


@case(CASES, "serving the tiny model: greedy, n-gram and draft-model drafts", "verify_drafts",
      "greedy output must be the engine's without speculation, and the drafts kept minivllm's: a greedy "
      "draft is kept exactly when it is the argmax")
def _(ex):
    from minivllm import LLM, SamplingParams
    from minivllm.course.runtime import configure
    from minivllm.course.verifier import use_verifier

    _call(ex, torch.tensor([[0.5, 0.5]]), [], None, torch.zeros(0), torch.ones(1, 2))  # a stub stops here
    _, dtype = configure()
    runs = _reference_runs(dtype)
    greedy = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    for method, config in _spec_configs().items():
        llm = LLM(dtype=dtype, seed=0, speculative_config=config)
        use_verifier(llm, ex.verify_drafts)
        outs = llm.generate(ENGINE_PROMPTS, greedy, use_tqdm=False)
        for i, (o, want) in enumerate(zip(outs, runs["plain"][0], strict=True)):
            expect(list(o.outputs[0].token_ids), list(want), f"{method} drafts, prompt {i}: greedy tokens")
        stats = _spec_stats(llm)
        if stats["spec_draft_tokens"] == 0:
            raise AssertionError(f"{method}: no drafts were verified")
        expect(stats, runs[method][1], f"{method}: drafts proposed and kept (minivllm's verifier: {runs[method][1]})")


@case(CASES, "serving the tiny model: sampled requests", "verify_drafts",
      "a sampled request keeps some drafts and ends with its max_tokens tokens")
def _(ex):
    from minivllm import LLM, SamplingParams
    from minivllm.course.runtime import configure
    from minivllm.course.verifier import use_verifier

    _call(ex, torch.tensor([[0.5, 0.5]]), [], None, torch.zeros(0), torch.ones(1, 2))  # a stub stops here
    _, dtype = configure()
    params = SamplingParams(max_tokens=24, temperature=0.8, top_k=40, seed=7, ignore_eos=True)
    llm = LLM(dtype=dtype, seed=0, speculative_config=_spec_configs()["draft_model"])
    use_verifier(llm, ex.verify_drafts)
    outs = llm.generate(ENGINE_PROMPTS, params, use_tqdm=False)
    for i, o in enumerate(outs):
        expect(len(o.outputs[0].token_ids), 24, f"prompt {i}: tokens generated")
    stats = _spec_stats(llm)
    if not 0 < stats["spec_accepted_tokens"] <= stats["spec_draft_tokens"]:
        raise AssertionError(f"drafts proposed and kept: {stats}")
