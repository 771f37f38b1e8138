"""Notebook 11's answers: the 2026 stack (speculative decoding, an 8-bit KV cache).

Section 5 builds the verifier's rule in three questions (how often a draft can be kept, what a
rejection must supply, what changes for a fixed guess), each answer computed here from the
notebook's numbers with the budget argument the notebook teaches; a fourth reads the layout of a
whole step's rows."""

from __future__ import annotations

from minivllm.course.answers import question

P_EXAMPLE = (0.5, 0.3, 0.2)  # the target's row in the notebook's puzzle
Q_EXAMPLE = (0.2, 0.6, 0.2)  # the draft's
GUESS_EXAMPLE = 1  # the n-gram guess of the third question
STEP_EXAMPLE = ((5, 7), (), (2,))  # the drafts of the step whose layout the fourth question reads


def _fmt(values) -> str:
    return "[" + ", ".join(f"{v:.2f}" for v in values) + "]"


@question("nb11.budget", "target p = [0.5, 0.3, 0.2], draft q = [0.2, 0.6, 0.2], one draft: how often can it "
          "be kept at most, and with what probability must a draft of each token be kept to get there?")
def budget(p: tuple[float, ...] = P_EXAMPLE, q: tuple[float, ...] = Q_EXAMPLE) -> str:
    caps = [min(a, b) for a, b in zip(p, q, strict=True)]
    keep = [min(1.0, a / b) for a, b in zip(p, q, strict=True)]
    lines = "; ".join(
        f"token {x}: budget min({p[x]:.1f}, {q[x]:.1f}) = {caps[x]:.2f}, so a draft of it is kept with "
        f"probability {caps[x]:.2f} / {q[x]:.1f} = {keep[x]:.2f}" for x in range(len(p))
    )
    return (
        f"**At most {sum(caps):.0%} of the time**, the overlap: keeping a draft of token x emits x at most "
        f"q(x) of the time (the draft must propose x) and at most p(x) (else x comes out too often), so "
        f"the chance to keep is at most the sum of min(p(x), q(x)) = {sum(caps):.2f}. It is reached only "
        f"if every token uses its whole budget, which fixes the chance of keeping a draft *given* that it "
        f"is token x to min(p(x), q(x)) / q(x) = min(1, p(x) / q(x)): {lines}. "
        f"**keep = {_fmt(keep)}**: a token the draft proposes no more often than the target wants it "
        "is always kept; one it proposes too often is kept just often enough to fill its budget."
    )


@question("nb11.rest", "with the best keep rule, which distribution must the token after a rejection have, "
          "and why is it a distribution at all?")
def rest(p: tuple[float, ...] = P_EXAMPLE, q: tuple[float, ...] = Q_EXAMPLE) -> str:
    caps = [min(a, b) for a, b in zip(p, q, strict=True)]
    left = [a - c for a, c in zip(p, caps, strict=True)]
    reject = 1 - sum(caps)
    residual = [v / sum(left) for v in left]
    emitted = [c + reject * r for c, r in zip(caps, residual, strict=True)]
    return (
        f"**What keeping leaves of p**: p(x) - min(p(x), q(x)) = max(p(x) - q(x), 0) = {_fmt(left)}. "
        f"These are non-negative, and they add up to 1 - {sum(caps):.2f} = {reject:.2f}, exactly the chance "
        f"of a rejection; so after a rejection the token is drawn with these weights, renormalised "
        f"{_fmt(residual)} (the *residual*): here always token {residual.index(max(residual))}, the only one "
        f"the draft proposes less often than the target wants it. Check: keeping emits {_fmt(caps)}, "
        f"rejections {reject:.2f} x {_fmt(residual)}; together {_fmt(emitted)}, which is p. With the noise "
        f"row, argmax(weights / noise) draws from weights that need not sum to 1. A step gives "
        f"{1 + sum(caps):.1f} tokens on average: the draft when kept, then always one more."
    )


@question("nb11.guess", "an n-gram guess d = 1 for the target p = [0.5, 0.3, 0.2]: how often can it be kept, "
          "and what must follow a rejection?")
def guess(p: tuple[float, ...] = P_EXAMPLE, d: int = GUESS_EXAMPLE) -> str:
    q = [1.0 if x == d else 0.0 for x in range(len(p))]
    caps = [min(a, b) for a, b in zip(p, q, strict=True)]
    left = [a - c for a, c in zip(p, caps, strict=True)]
    residual = [v / sum(left) for v in left]
    return (
        f"**Kept {p[d]:.0%} of the time, then the rest of p without the guess.** A fixed guess is a draft "
        f"whose q puts all its mass on it, q = {_fmt(q)}: the overlap is min(p, q) summed = p(d) = "
        f"{sum(caps):.2f}, so the guess is kept with probability min(1, p(d) / 1) = {p[d]:.2f}. What keeping "
        f"leaves is p with d's entry set to 0, {_fmt(left)}, of total 1 - p(d) = {sum(left):.2f}, the chance "
        f"of a rejection; renormalised {_fmt(residual)}. A rejected guess is never emitted in its own place."
    )


@question("nb11.step", "a step verifies requests with the drafts [[5, 7], [], [2]]: which rows of its tensors "
          "are whose, which uniforms decide nothing, and how many tokens can the step emit?")
def step(draft_tokens: tuple[tuple[int, ...], ...] = STEP_EXAMPLE) -> str:
    parts, last_rows, row = [], [], 0
    for r, drafts in enumerate(draft_tokens):
        rows = list(range(row, row + len(drafts) + 1))
        judged = ", ".join(f"row {i} judges draft {d}" for i, d in zip(rows, drafts, strict=False))
        parts.append(f"request {r}: rows {rows[0]}..{rows[-1]}" if len(rows) > 1 else f"request {r}: row {rows[0]}")
        if judged:
            parts[-1] += f" ({judged})"
        last_rows.append(rows[-1])
        row += len(drafts) + 1
    most = sum(len(d) + 1 for d in draft_tokens)
    return (
        f"**R = {row} rows**: {'; '.join(parts)}. Each request's last row (rows {last_rows}) proposes "
        f"nothing: its uniform decides nothing and its draft_probs row holds no distribution; it is the "
        f"row a request's last token comes from when every draft before it was kept. The step emits "
        f"between **{len(draft_tokens)}** tokens (one per request, every draft rejected) and **{most}** "
        f"(every draft kept, R in all), whatever the other requests do."
    )
