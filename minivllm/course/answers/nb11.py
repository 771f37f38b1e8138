"""Notebook 11's answers: the 2026 stack (speculative decoding, an 8-bit KV cache)."""

from __future__ import annotations

from minivllm.course.answers import question

P_EXAMPLE = (0.5, 0.3, 0.2)  # the target's row in the notebook's worked example
Q_EXAMPLE = (0.2, 0.6, 0.2)  # the draft's


@question("nb11.by_hand", "target p = [0.5, 0.3, 0.2], draft q = [0.2, 0.6, 0.2], one draft: how often is it "
          "kept, what fills its place when it is not, and how many tokens does a step give on average?")
def by_hand(p: tuple[float, ...] = P_EXAMPLE, q: tuple[float, ...] = Q_EXAMPLE) -> str:
    kept_mass = [min(a, b) for a, b in zip(p, q, strict=True)]
    keep = sum(kept_mass)
    leftover = [max(a - b, 0.0) for a, b in zip(p, q, strict=True)]
    residual = [x / sum(leftover) for x in leftover]
    emitted = [m + (1 - keep) * r for m, r in zip(kept_mass, residual, strict=True)]
    per_token = ", ".join(
        f"token {x}: kept {q[x]:.1f} x min(1, {p[x]:.1f}/{q[x]:.1f}) = {kept_mass[x]:.2f}" for x in range(len(p))
    )
    return (
        f"**Kept {keep:.0%} of the time**; {per_token}, which sum to {keep:.2f}. "
        f"**After a rejection the token is drawn from max(p - q, 0)** = "
        f"{[round(x, 2) for x in leftover]}, renormalised {[round(x, 2) for x in residual]}: here always "
        f"token {residual.index(max(residual))}, the only one the draft proposes less often than the "
        f"target wants it. Check: the step emits token x with probability min(p, q)(x) + "
        f"{1 - keep:.1f} x residual(x) = {[round(x, 2) for x in emitted]}, which is p. "
        f"**On average {1 + keep:.1f} tokens per step**: the draft when kept, then always one more "
        f"(the bonus token from the second row, or the residual's token)."
    )
