"""Cases for ex11_spec_verify: the verifier of speculative decoding, a whole step at once.

What is graded is what the contract promises, not one way of getting there:

* **exactness**, statistically: for made-up target and draft distributions (one per position of
  a short sequence, so that a row read at the wrong position shows), thousands of trials, each a
  request of its own in one big step (the requests of different settings interleaved, so that a
  row read from the wrong request shows too), with fresh random numbers each; a request's first
  emitted token must be distributed as ``p_0``, its first two (over as many steps as it takes to
  emit two) as ``p_0 x p_1``, and the number of drafts kept in its first step as the exact law
  ``P(a >= j) = prod_{i<j} beta_i``, where ``beta_i`` is the chance to keep a reached draft
  (``sum_x min(p_i(x), q_i(x))`` for a draft model, ``p_i(d)`` for a guess). Each is a chi-square
  test against the exact distribution, with fixed seeds and a threshold at a p-value of ``1e-6``:
  a correct verifier, whichever way it uses its random numbers, fails one of these tests about
  once in a hundred thousand seeds, and every plausible slip in ``tests/course/test_course.py`` fails by
  orders of magnitude;
* exact properties, on inputs where exactness and optimality leave one answer whatever the
  random numbers, on single-request steps and on mixed ones (requests with different ``k``,
  ``k = 0`` among them, greedy and sampled requests side by side): the shape of the result, the
  docstring's example, greedy rows (the greedy tokens, whatever the drafts), a draft the target
  rules out, requests that end their steps independently, the target equal to the draft
  (everything kept), a rejection whose leftover mass is rounding, determinism, untouched inputs,
  ``ValueError`` on bad shapes;
* **the work rule**, counted (:func:`minivllm.course.work.count_work`, and a count of the values
  read back to the host): a step of 2 requests and one of 300 each within the stub's budgets of
  operations and transfers;
* the engine: the tiny model served with the student's verifier, greedy (again one answer),
  must give the tokens of the engine without speculation and the acceptance counts of
  minivllm's own verifier.

No case compares with minivllm's verifier on random numbers that leave a choice: a verifier
that uses its uniforms or its noise another way (keeping a draft when ``u`` is *above* some
threshold, drawing a token by inverting a distribution function) is as right, and passes
(``tests/exercises/test_ex11_spec_verify.py`` holds such answers). The uniforms of the exact
cases stay a little away from 0 and 1, so that equivalent comparisons that round differently
agree. A request's last row of ``draft_probs`` (which holds no distribution) is filled with a
distribution of its own, and its spare uniform with a random number, so that reading them shows.
Expected values come from the distributions the cases build and from minivllm's engine, never
from the reference answer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import torch
from torch.overrides import TorchFunctionMode

from minivllm.course.grading import Case, case, expect, expect_raises
from minivllm.course.verifier import VerifierOutputError, check_step
from minivllm.course.work import Work, count_work

CASES: list[Case] = []
FUNC = "verify_step"
P_VALUE = 1e-6  # a chi-square test fails below this
TRIALS = 6000  # requests per distribution setting
MAX_OPERATIONS = 60  # the contract's work rule (point 5)
MAX_TRANSFERS = 3
WORK_STEPS = (2, 300)  # requests in the two steps the work rule is counted on


# --- building steps ---------------------------------------------------------------------------
@dataclass
class Request:
    """One request of a step: its ``k + 1`` target rows, its drafts, their ``k`` draft rows (None
    for guesses), its ``k`` uniforms and its ``k + 1`` noise rows."""

    target: torch.Tensor
    drafts: list[int]
    q: torch.Tensor | None
    uniforms: torch.Tensor
    noise: torch.Tensor


@dataclass
class Step:
    target: torch.Tensor
    drafts: list[list[int]]
    q: torch.Tensor | None
    uniforms: torch.Tensor
    noise: torch.Tensor

    def args(self) -> tuple:
        return self.target, self.drafts, self.q, self.uniforms, self.noise


def _spare(vocab: int, dtype: torch.dtype) -> torch.Tensor:
    """What fills a request's last row of ``draft_probs``: a distribution no row is drawn from
    (more mass on the last tokens), so that a verifier that reads it emits the wrong law."""
    w = torch.arange(1, vocab + 1, dtype=torch.float64) ** 2
    return (w / w.sum()).to(dtype)


def pack(requests: list[Request], gen: torch.Generator | None = None) -> Step:
    """The step's flat tensors, request after request; a guesses' step (every ``q`` None) has
    ``draft_probs`` None. The spare uniforms are random (``gen``) or 0.5."""
    if not requests:
        raise ValueError("a step needs a request")
    guesses = {r.q is None for r in requests}
    if len(guesses) != 1:
        raise ValueError("a step's requests all have draft distributions, or none has")
    vocab, dtype = requests[0].target.shape[1], requests[0].target.dtype
    spare_u = (torch.rand(len(requests), generator=gen, dtype=torch.float64) if gen is not None
               else torch.full((len(requests),), 0.5, dtype=torch.float64)).to(requests[0].uniforms.dtype)
    targets, qs, us, noises = [], [], [], []
    for r, extra in zip(requests, spare_u, strict=True):
        targets.append(r.target)
        noises.append(r.noise)
        us.extend([r.uniforms, extra.reshape(1)])
        if r.q is not None:
            qs.extend([r.q.to(dtype), _spare(vocab, dtype)[None]])
    return Step(torch.cat(targets), [list(r.drafts) for r in requests], torch.cat(qs) if qs else None,
                torch.cat(us), torch.cat(noises))


def _call_step(ex, step: Step) -> list[list[int]]:
    got = ex.verify_step(*step.args())
    try:
        return check_step(got, step.drafts, step.target.shape[1])
    except VerifierOutputError as err:
        raise AssertionError(str(err)) from None


def _call(ex, target, drafts, q, uniforms, noise) -> list[int]:
    """A step of one request."""
    return _call_step(ex, pack([Request(target, list(drafts), q, uniforms, noise)]))[0]


def _ruled_out(step: Step, emitted: list[list[int]], rows_p: list[torch.Tensor] | None = None) -> None:
    """No token comes from a row that gives it probability 0 (``rows_p``: each request's exact
    rows, float64; default: the step's own)."""
    row = 0
    for r, (drafts, out) in enumerate(zip(step.drafts, emitted, strict=True)):
        p = step.target[row : row + len(drafts) + 1] if rows_p is None else rows_p[r]
        for i, t in enumerate(out):
            if float(p[i, t]) == 0.0:
                raise AssertionError(f"request {r}: token {t} emitted at its row {i}, where the target gives it "
                                     f"probability 0 (drafts {drafts}, emitted {out})")
        row += len(drafts) + 1


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
    out["k0"] = Setting("no drafts (k = 0), among draft-model requests", 0, p, None, (0, 0))
    return out


# The settings verified together: each group is one step (then a second one for the requests
# that emitted one token only), its requests interleaved setting by setting.
GROUPS = {"draft": ("draft", "sharp", "k0"), "sharp": ("draft", "sharp", "k0"), "k0": ("draft", "sharp", "k0"),
          "ngram": ("ngram",)}


@dataclass
class Tally:
    first: torch.Tensor  # [V] counts of the first emitted token
    pairs: torch.Tensor  # [V, V] counts of the first two
    accepted: torch.Tensor  # [k + 1] counts of the drafts kept in the first step


def _trial_step(keys: list[str], starts: list[int], gen: torch.Generator, dtype: torch.dtype,
                draft_model: bool) -> tuple[Step, list[torch.Tensor]]:
    """One step whose request ``j`` is a fresh trial of setting ``keys[j]`` at position ``starts[j]``,
    and each request's exact (float64) target rows."""
    requests, exact_rows = [], []
    by_slot: dict[tuple[str, int], list[int]] = {}
    for j, (key, start) in enumerate(zip(keys, starts, strict=True)):
        by_slot.setdefault((key, start), []).append(j)
    drafts: list[list[int]] = [[] for _ in keys]
    for (key, start), members in by_slot.items():  # the drafts of every trial of a slot in one draw
        s = settings()[key]
        if s.k == 0:
            continue
        if s.q is None:
            for j in members:
                drafts[j] = list(s.guess[start : start + s.k])
        else:
            drawn = torch.multinomial(s.q[start : start + s.k], len(members), replacement=True, generator=gen)
            for j, row in zip(members, drawn.T.tolist(), strict=True):
                drafts[j] = row
    for j, (key, start) in enumerate(zip(keys, starts, strict=True)):
        s = settings()[key]
        k, vocab = s.k, s.p.shape[1]
        rows = s.p[start : start + k + 1]
        exact_rows.append(rows)
        q = None
        if draft_model:
            q = (s.q[start : start + k] if s.q is not None else torch.zeros(0, vocab, dtype=torch.float64)).to(dtype)
        requests.append(Request(rows.to(dtype), drafts[j], q, torch.empty(k, dtype=dtype),
                                torch.empty(k + 1, vocab, dtype=dtype)))
    step = pack(requests, gen)
    step.uniforms = torch.rand(step.uniforms.shape[0], generator=gen, dtype=torch.float64).to(dtype)
    step.noise = (torch.empty(step.noise.shape, dtype=torch.float64).exponential_(generator=gen)
                  .clamp_(min=1e-30).to(dtype))
    return step, exact_rows


def _verified(ex, step: Step, exact_rows: list[torch.Tensor]) -> list[list[int]]:
    emitted = _call_step(ex, step)
    _ruled_out(step, emitted, exact_rows)
    return emitted


@cache
def _first_trials(group: tuple[str, ...], dtype: torch.dtype) -> tuple[Step, list[torch.Tensor], torch.Tensor]:
    """The first step of a group's trials (the same for every verifier graded: built once, a
    copy given to each), and the random generator's state after it."""
    gen = torch.Generator().manual_seed(2026)
    keys = [key for _ in range(TRIALS) for key in group]
    step, exact_rows = _trial_step(keys, [0] * len(keys), gen, dtype, settings()[group[0]].q is not None)
    return step, exact_rows, gen.get_state()


@cache
def _tallies(ex, group: tuple[str, ...], dtype: torch.dtype = torch.float32) -> dict[str, Tally]:
    draft_model = settings()[group[0]].q is not None
    keys = [key for _ in range(TRIALS) for key in group]
    first, exact_rows, state = _first_trials(group, dtype)
    gen = torch.Generator()
    gen.set_state(state)
    copy = Step(first.target.clone(), [list(d) for d in first.drafts], None if first.q is None else first.q.clone(),
                first.uniforms.clone(), first.noise.clone())
    outs = _verified(ex, copy, exact_rows)
    first_step = [len(o) - 1 for o in outs]
    while short := [j for j, o in enumerate(outs) if len(o) < 2]:
        more = _verified(ex, *_trial_step([keys[j] for j in short], [len(outs[j]) for j in short], gen, dtype,
                                          draft_model))
        for j, extra in zip(short, more, strict=True):
            outs[j] = outs[j] + extra
    tallies = {}
    for key in group:
        s = settings()[key]
        vocab = s.p.shape[1]
        t = Tally(torch.zeros(vocab), torch.zeros(vocab, vocab), torch.zeros(s.k + 1))
        for j in (j for j, kj in enumerate(keys) if kj == key):
            t.accepted[first_step[j]] += 1
            t.first[outs[j][0]] += 1
            t.pairs[outs[j][0], outs[j][1]] += 1
        tallies[key] = t
    return tallies


def _tally(ex, key: str, dtype: torch.dtype = torch.float32) -> Tally:
    return _tallies(ex, GROUPS[key], dtype)[key]


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

    @case(CASES, f"{s.name}: first token ~ p_0", FUNC, hint_first)
    def _(ex):
        expect_distributed(_tally(ex, key).first, s.p[0], "the first emitted token")

    @case(CASES, f"{s.name}: first two tokens ~ p_0 x p_1", FUNC,
          "the second token must follow the target's row after the first, whether it is a kept draft, "
          "the token after a rejection (next step) or the token after all drafts: which row does each "
          "come from?")
    def _(ex):
        expect_distributed(_tally(ex, key).pairs, _first_two(s), "the first two emitted tokens (joint)")

    if s.k:
        @case(CASES, f"{s.name}: drafts kept per step (mean {sum(j * w for j, w in enumerate(s.accepted_law())):.3f})",
              FUNC, hint_count)
        def _(ex):
            counts = _tally(ex, key).accepted
            law = torch.tensor(s.accepted_law(), dtype=torch.float64)
            mean = float((counts * torch.arange(s.k + 1)).sum() / counts.sum())
            expect_distributed(counts, law, f"the number of drafts kept (mean {mean:.3f}, exactly "
                                            f"{float((law * torch.arange(s.k + 1)).sum()):.3f})")


# --- exact properties -------------------------------------------------------------------------
def _t(rows, dtype=torch.float32) -> torch.Tensor:
    return torch.tensor(rows, dtype=dtype)


def _noise(gen: torch.Generator, rows: int, vocab: int) -> torch.Tensor:
    return torch.empty(rows, vocab).exponential_(generator=gen).clamp_(min=1e-30)


def _uniforms(gen: torch.Generator, k: int) -> torch.Tensor:
    """Uniform on [2**-10, 1 - 2**-10]: where one answer is right whatever the uniforms, a rule
    written ``u < p / q``, ``u * q < p`` or ``1 - u < p / q`` gives it, however each rounds."""
    return torch.rand(k, generator=gen) * (1 - 2**-9) + 2**-10


def worked_example() -> tuple[torch.Tensor, list[list[int]], torch.Tensor, list[list[int]]]:
    """The docstring's example: target rows, drafts, draft rows, and its one right answer."""
    target = _t([[0.1, 0.6, 0.3, 0.0], [0.2, 0.2, 0.1, 0.5], [0.0, 0.0, 1.0, 0.0],
                 [0.0, 0.0, 0.0, 1.0],
                 [0.0, 0.0, 1.0, 0.0], [0.3, 0.3, 0.2, 0.2]])
    draft = _t([[0.2, 0.5, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25], [0.0] * 4,
                [0.0] * 4,
                [0.7, 0.1, 0.1, 0.1], [0.0] * 4])
    return target, [[1, 3], [], [0]], draft, [[1, 3, 2], [3], [2]]


@case(CASES, "the docstring's worked example, for any random numbers", FUNC,
      "three requests, R = 2 + 1 + 0 + 1 + 1 + 1 = 6 rows: which rows are request 1's? The drafts of "
      "request 0 are tokens the target wants at least as much as the draft did; request 2's is one it "
      "rules out")
def _(ex):
    gen = torch.Generator().manual_seed(0)
    target, drafts, draft, want = worked_example()
    for trial in range(40):
        u = _uniforms(gen, 6)
        got = _call_step(ex, Step(target, drafts, draft, u, _noise(gen, 6, 4)))
        expect(got, want, f"uniforms {[round(x, 4) for x in u.tolist()]} (draw {trial})")


def _greedy_request(gen: torch.Generator, vocab: int, k: int, draft_model: bool) -> tuple[Request, list[int]]:
    """One-hot target rows; drafts that are the argmax 70% of the time; its one right answer."""
    best = torch.randint(vocab, (k + 1,), generator=gen).tolist()
    target = torch.zeros(k + 1, vocab)
    target[torch.arange(k + 1), best] = 1.0
    drafts = [b if float(torch.rand(1, generator=gen)) < 0.7 else (b + 1) % vocab for b in best[:k]]
    q = None
    if draft_model:
        q = torch.rand(k, vocab, generator=gen) + 0.01
        q[torch.arange(k), drafts] += 2.0  # the drafts were likely under q
        q /= q.sum(dim=1, keepdim=True)
    want = []
    for b, d in zip(best, drafts, strict=False):
        if d != b:
            break
        want.append(d)
    want.append(best[len(want)])
    return Request(target, drafts, q, _uniforms(gen, k), _noise(gen, k + 1, vocab)), want


def _sampled_request(gen: torch.Generator, vocab: int, k: int, draft_model: bool) -> Request:
    target = torch.rand(k + 1, vocab, generator=gen).softmax(-1)
    q = torch.rand(k, vocab, generator=gen).softmax(-1) if draft_model else None
    drafts = (torch.randint(vocab, (k,), generator=gen) if q is None
              else torch.multinomial(q, 1, generator=gen)[:, 0] if k else torch.zeros(0, dtype=torch.long)).tolist()
    return Request(target, drafts, q, _uniforms(gen, k), _noise(gen, k + 1, vocab))


@case(CASES, "greedy rows, one request a step: the greedy tokens, whatever the drafts", FUNC,
      "one-hot target rows: a draft is kept exactly when it is the row's argmax, and the token after "
      "is the argmax of its row")
def _(ex):
    gen = torch.Generator().manual_seed(1)
    for k in range(6):
        for draft_model in (False, True):
            for _ in range(3):
                req, want = _greedy_request(gen, 50, k, draft_model)
                got = _call(ex, req.target, req.drafts, req.q, req.uniforms, req.noise)
                expect(got, want, f"k = {k}, {'draft model' if draft_model else 'guesses'}, drafts {req.drafts}")


@case(CASES, "a mixed step: greedy requests with k = 0 .. 5 between sampled ones", FUNC,
      "each request is judged on its own rows only: find, for every request at once, its first row "
      "that is not kept (its last row at the latest), without a loop over rows, and take that row's "
      "token; a rejection in one request ends that request's step alone")
def _(ex):
    gen = torch.Generator().manual_seed(7)
    for draft_model in (False, True):
        requests, wants = [], []
        for j in range(60):
            k = (j * 7) % 6
            if j % 3 == 1:
                requests.append(_sampled_request(gen, 50, k, draft_model))
                wants.append(None)
            else:
                req, want = _greedy_request(gen, 50, k, draft_model)
                requests.append(req)
                wants.append(want)
        step = pack(requests, gen)
        got = _call_step(ex, step)
        _ruled_out(step, got)
        for r, (req, want) in enumerate(zip(requests, wants, strict=True)):
            if want is not None:
                expect(got[r], want, f"{'draft model' if draft_model else 'guesses'}, request {r} of "
                                     f"{len(requests)} (k = {len(req.drafts)}, greedy, drafts {req.drafts})")


@case(CASES, "requests end their steps independently", FUNC,
      "a request's first rejection ends its own step: the requests after it go on, each to its own "
      "first rejection or its own last row")
def _(ex):
    gen = torch.Generator().manual_seed(8)
    vocab = 6

    def one_hot(tokens):
        rows = torch.zeros(len(tokens), vocab)
        rows[torch.arange(len(tokens)), tokens] = 1.0
        return rows

    # (target argmaxes, drafts): the first request rejects its first draft, the others keep all
    # theirs or stop at their own mismatch
    layout = [([4, 0, 0], [3, 0]), ([2], []), ([1, 2, 3, 5], [1, 2, 3]), ([5], []), ([2, 4], [2]),
              ([0, 1, 3], [0, 2]), ([3], []), ([1, 5, 2, 4, 0], [1, 5, 2, 4])]
    wants = []
    for argmaxes, drafts in layout:
        a = next((i for i, (b, d) in enumerate(zip(argmaxes, drafts, strict=False)) if b != d), len(drafts))
        wants.append([*drafts[:a], argmaxes[a]])
    for draft_model in (False, True):
        requests = []
        for argmaxes, drafts in layout:
            k = len(drafts)
            q = torch.full((k, vocab), 1 / vocab) if draft_model else None
            requests.append(Request(one_hot(argmaxes), drafts, q, _uniforms(gen, k), _noise(gen, k + 1, vocab)))
        got = _call_step(ex, pack(requests, gen))
        expect(got, wants, f"{'draft model' if draft_model else 'guesses'}: drafts {[d for _, d in layout]}, "
                           f"target argmaxes {[a for a, _ in layout]}")


@case(CASES, "a draft the target rules out is never kept, even with a uniform of 0", FUNC,
      "a token with p(d) = 0 may never be emitted at that row, not even for a uniform at the end of its "
      "range, nor as the token in the draft's place")
def _(ex):
    gen = torch.Generator().manual_seed(2)
    target = _t([[0.0, 0.5, 0.5, 0.0], [0.25] * 4])
    for q in (_t([[0.7, 0.1, 0.1, 0.1]]), None):
        requests = [Request(target, [0], q, _t([u]), _noise(gen, 2, 4)) for u in (0.0, 0.5, 0.999999)]
        for one, u in zip(requests, (0.0, 0.5, 0.999999), strict=True):
            got = [_call(ex, one.target, one.drafts, one.q, one.uniforms, one.noise)]
            got += _call_step(ex, pack([one, one], gen))
            for g in got:
                if len(g) != 1 or g[0] not in (1, 2):
                    raise AssertionError(f"target row 0 {target[0].tolist()} rules out draft 0, uniform {u}, "
                                         f"draft_probs {None if q is None else q.tolist()}: expected one token, "
                                         f"1 or 2, got {g}")


@case(CASES, "the target equals the draft: every draft kept, then one from the last row", FUNC,
      "p = q leaves exactness no reason to reject anything; after a request's last draft, one token comes "
      "from the row that follows it, its own last row")
def _(ex):
    gen = torch.Generator().manual_seed(3)
    p = torch.stack([_dist(gen, 5) for _ in range(4)]).float()
    drafts = [int(torch.multinomial(p[i], 1, generator=gen)) for i in range(3)]
    per_k = TRIALS // 6
    requests = [Request(p[: k + 1], drafts[:k], p[:k].clone(), _uniforms(gen, k), _noise(gen, k + 1, 5))
                for _ in range(per_k) for k in range(4)]
    got = _call_step(ex, pack(requests, gen))
    last = torch.zeros(4, 5)
    for req, out in zip(requests, got, strict=True):
        k = len(req.drafts)
        if out[:k] != req.drafts or len(out) != k + 1:
            raise AssertionError(f"p == q: expected the {k} drafts {req.drafts} then one token, got {out} "
                                 f"(uniforms {req.uniforms.tolist()})")
        last[k, out[k]] += 1
    for k in range(4):
        expect_distributed(last[k], p[k].double(), f"the token after the last of {k} drafts")


@case(CASES, "a rejection that rounding leaves nothing to draw from", FUNC,
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
    requests = [Request(p, [draft], q, _t([u]), _noise(gen, 2, 4))
                for draft, q, uniforms in ((0, covering, (0.0, 0.5, 1 - 2**-24)),
                                           (1, above, (2**-24, 2**-23, 0.5, 1 - 2**-23, 1 - 2**-24)))
                for u in uniforms for _ in range(10)]
    got = _call_step(ex, pack(requests, gen))
    for req, out in zip(requests, got, strict=True):
        if 0 in out:
            raise AssertionError(f"target {p.tolist()}, draft {req.drafts} from {req.q.tolist()}, uniform "
                                 f"{req.uniforms.tolist()}: got {out}; token 0 has target probability 0")


@case(CASES, "an exact 0 in the noise never draws a token of probability 0", FUNC,
      "some devices' generators emit an exact 0 now and then: 0 / 0 is NaN, and argmax takes a NaN; a "
      "token of weight 0 must lose the race whatever its noise")
def _(ex):
    gen = torch.Generator().manual_seed(6)
    for draft_model in (True, False):
        requests = []
        for k in (0, 1, 2, 3):
            for _ in range(8):
                target = torch.stack([_dist(gen, 6, zeros=3) for _ in range(k + 1)]).float()
                q = (torch.stack([_dist(gen, 6, zeros=2) for _ in range(k)]).float() if k
                     else torch.zeros(0, 6)) if draft_model else None
                drafts = (torch.multinomial(q, 1, generator=gen)[:, 0].tolist() if (q is not None and k)
                          else torch.randint(6, (k,), generator=gen).tolist())
                noise = _noise(gen, k + 1, 6)
                noise[torch.rand(noise.shape, generator=gen) < 0.4] = 0.0  # exact zeros, everywhere
                requests.append(Request(target, drafts, q, _uniforms(gen, k), noise))
        step = pack(requests, gen)
        _ruled_out(step, _call_step(ex, step))


@case(CASES, "deterministic, inputs untouched", FUNC,
      "use only the random numbers given (no torch.rand of your own) and change no argument in place")
def _(ex):
    gen = torch.Generator().manual_seed(5)
    for trial in range(10):
        draft_model = trial % 2 == 0
        step = pack([_sampled_request(gen, 8, k, draft_model) for k in (3, 0, 1, 4, 2)], gen)
        args = step.args()
        copies = [a.clone() if isinstance(a, torch.Tensor) else [list(d) for d in a] if isinstance(a, list) else a
                  for a in args]
        torch.manual_seed(trial)
        once = _call_step(ex, step)
        torch.manual_seed(trial + 1000)
        again = _call_step(ex, step)
        expect(again, once, f"the same arguments twice (trial {trial})")
        for name, a, c in zip(("target_probs", "draft_tokens", "draft_probs", "uniforms", "noise"), args, copies,
                              strict=True):
            same = torch.equal(a, c) if isinstance(a, torch.Tensor) else a == c
            if not same:
                raise AssertionError(f"{name} was changed by the call")


@case(CASES, "shapes that do not fit raise ValueError", FUNC,
      "R = sum over requests of (k_r + 1): target_probs, noise and draft_probs [R, V], uniforms [R]")
def _(ex):
    drafts = [[0, 1], [], [2]]  # R = 3 + 1 + 2 = 6
    p, q = torch.full((6, 4), 0.25), torch.full((6, 4), 0.25)
    u, e = torch.full((6,), 0.5), torch.ones(6, 4)
    bad = {
        "target_probs one row short of R": (p[:5], drafts, q[:5], u[:5], e[:5]),
        "target_probs with k_r rows per request": (p[:3], drafts, q[:3], u[:3], e[:3]),
        "target_probs one row past R": (torch.full((7, 4), 0.25), drafts, torch.full((7, 4), 0.25),
                                        torch.full((7,), 0.5), torch.ones(7, 4)),
        "target_probs 1-D": (p[0], [[]], None, u[:1], e[0]),
        "one uniform short": (p, drafts, q, u[:5], e),
        "uniforms [R, 1]": (p, drafts, q, u[:, None], e),
        "noise one row short": (p, drafts, q, u, e[:5]),
        "draft_probs with k_r rows per request": (p, drafts, q[:3], u, e),
    }
    for note, args in bad.items():
        expect_raises(ValueError, lambda args=args: ex.verify_step(*args), note)


# --- the work rule ----------------------------------------------------------------------------
TRANSFERS = frozenset({"tolist", "item", "numpy", "__int__", "__float__", "__bool__", "__index__", "__array__"})


class _Transfers(TorchFunctionMode):
    """Counts the calls that read a tensor's values back into Python."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.names: dict[str, int] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in TRANSFERS:
            self.count += 1
            self.names[name] = self.names.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def work_step(num_requests: int, draft_model: bool, seed: int) -> Step:
    """A step of sampled requests with 0 to 4 drafts each over 64 tokens."""
    gen = torch.Generator().manual_seed(seed)
    return pack([_sampled_request(gen, 64, (3 * j + seed) % 5, draft_model) for j in range(num_requests)], gen)


def work_of(ex, step: Step) -> tuple[Work, _Transfers]:
    """What one call of the student's ``verify_step`` does on ``step``; its result must be well formed."""
    transfers = _Transfers()
    with transfers:
        got, work = count_work(ex.verify_step, *step.args())
    try:
        check_step(got, step.drafts, step.target.shape[1])
    except VerifierOutputError as err:
        raise AssertionError(str(err)) from None
    return work, transfers


@case(CASES, f"work: at most {MAX_OPERATIONS} operations and {MAX_TRANSFERS} transfers a step, "
             f"for {WORK_STEPS[0]} requests as for {WORK_STEPS[1]}", FUNC,
      "decide every row at once: one comparison tests every draft of every request, one draw races every "
      "row's weights; then find each request's first row that is not kept with an operation over all rows "
      "(a reduction per request, a cumulative product, or the rows laid out as a [requests, k_max + 1] "
      "grid), and read the decisions back to the host once")
def _(ex):
    for draft_model in (True, False):
        counts = {}
        for n in WORK_STEPS:
            step = work_step(n, draft_model, seed=n)
            work, transfers = work_of(ex, step)
            counts[n] = (work, transfers, step.target.shape[0])
        kind = "draft-model" if draft_model else "guesses'"
        said = "; ".join(f"{n} requests ({rows} rows): {w.operations} operations, {t.count} transfers"
                         f"{' ' + str(t.names) if t.count else ''}" for n, (w, t, rows) in counts.items())
        for work, transfers, _rows in counts.values():
            if work.operations > MAX_OPERATIONS:
                grows = counts[WORK_STEPS[-1]][0].operations > counts[WORK_STEPS[0]][0].operations
                raise AssertionError(
                    f"{kind} steps: {said}. A step may run at most {MAX_OPERATIONS} tensor operations whatever its "
                    f"size" + (": the count grows with the step, so some operation runs once per request or per "
                               "row (a Python loop over them)" if grows else ""))
            if transfers.count > MAX_TRANSFERS:
                raise AssertionError(
                    f"{kind} steps: {said}. A step may read values back to the host at most {MAX_TRANSFERS} "
                    "times (.tolist(), .item(), int(), float(), bool() of a tensor): gather every decision on the "
                    "device, then transfer them together")


# --- the laws, statistically (after the cheaper cases, which say more of a slip) -----------
_distribution_cases(
    "draft", "for each token x, add the chance the step emits x by keeping a draft x and the chance it "
             "emits x after a rejection: the sum must be p(x); what must a rejection supply?",
    "too few or too many drafts kept: no exact rule keeps a draft more often than the overlap "
    "sum_x min(p(x), q(x)); reach it, and end each request's step at its own first rejection",
)
_distribution_cases(
    "sharp", "where the draft proposes x more often than the target wants it (q(x) > p(x)), keeping every "
             "draft x emits too many x's",
    "each draft has its own uniform; a request goes on only while its drafts are kept",
)
_distribution_cases(
    "ngram", "a guess is fixed: no distribution was drawn from; what is the most often it can be kept, "
             "and what is left of p for a rejection to supply?",
    "a fixed guess d is emitted by keeping it at most p(d) of the time",
)
_distribution_cases(
    "k0", "a request without drafts has one row, its last: the one token is drawn from that row's p with "
          "its noise (its draft_probs row holds no distribution)", "",
)


@case(CASES, "float64 rows, the same laws", FUNC,
      "nothing in the contract depends on the dtype: do not convert to float32 or to Python floats wrongly")
def _(ex):
    s = settings()["draft"]
    expect_distributed(_tally(ex, "draft", torch.float64).first, s.p[0], "the first emitted token (float64)")


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
        "ngram": {"method": "ngram", "num_speculative_tokens": 4, "disable_by_batch_size": None},
        "draft_model": {"method": "draft_model", "model": str(draft_dir), "num_speculative_tokens": 3, "disable_by_batch_size": None},
    }


def _spec_stats(llm) -> dict:
    s = llm.stats().summary()
    return {key: s[key] for key in ("spec_draft_tokens", "spec_accepted_tokens")}


def _stub_stops_here(ex) -> None:
    _call(ex, torch.tensor([[0.5, 0.5]]), [], None, torch.zeros(0), torch.ones(1, 2))


@case(CASES, "serving the tiny model: greedy, n-gram and draft-model drafts", FUNC,
      "greedy output must be the engine's without speculation, and the drafts kept minivllm's: a greedy "
      "draft is kept exactly when it is the argmax")
def _(ex):
    from minivllm import LLM, SamplingParams
    from minivllm.course.runtime import configure
    from minivllm.course.verifier import with_verifier

    _stub_stops_here(ex)
    _, dtype = configure()
    runs = _reference_runs(dtype)
    greedy = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    for method, config in _spec_configs().items():
        llm = LLM(dtype=dtype, seed=0, speculative_config=with_verifier(config, ex.verify_step))
        outs = llm.generate(ENGINE_PROMPTS, greedy, use_tqdm=False)
        for i, (o, want) in enumerate(zip(outs, runs["plain"][0], strict=True)):
            expect(list(o.outputs[0].token_ids), list(want), f"{method} drafts, prompt {i}: greedy tokens")
        stats = _spec_stats(llm)
        if stats["spec_draft_tokens"] == 0:
            raise AssertionError(f"{method}: no drafts were verified")
        expect(stats, runs[method][1], f"{method}: drafts proposed and kept (minivllm's verifier: {runs[method][1]})")


@case(CASES, "serving the tiny model: sampled requests", FUNC,
      "a sampled request keeps some drafts and ends with its max_tokens tokens")
def _(ex):
    from minivllm import LLM, SamplingParams
    from minivllm.course.runtime import configure
    from minivllm.course.verifier import with_verifier

    _stub_stops_here(ex)
    _, dtype = configure()
    params = SamplingParams(max_tokens=24, temperature=0.8, top_k=40, seed=7, ignore_eos=True)
    llm = LLM(dtype=dtype, seed=0, speculative_config=with_verifier(_spec_configs()["draft_model"], ex.verify_step))
    outs = llm.generate(ENGINE_PROMPTS, params, use_tqdm=False)
    for i, o in enumerate(outs):
        expect(len(o.outputs[0].token_ids), 24, f"prompt {i}: tokens generated")
    stats = _spec_stats(llm)
    if not 0 < stats["spec_accepted_tokens"] <= stats["spec_draft_tokens"]:
        raise AssertionError(f"drafts proposed and kept: {stats}")
