"""Notebook 05's answers: paged attention in PyTorch."""

from __future__ import annotations

from minivllm.course.answers import question


@question("nb05.slots", "blocks of 16, 21 tokens cached, 5 new, block table [7, 2]: which slots do the new "
          "tokens go to, and which positions does the third new token attend to?")
def slots() -> str:
    block_size, cached, new, table = 16, 21, 5, [7, 2]
    positions = list(range(cached, cached + new))
    slots_ = [table[p // block_size] * block_size + p % block_size for p in positions]
    third = positions[2]
    return (
        f"The new tokens sit at positions {positions[0]}..{positions[-1]}: all in logical block "
        f"{positions[0] // block_size}, which is physical block {table[positions[0] // block_size]}, at "
        f"offsets {positions[0] % block_size}..{positions[-1] % block_size}. Their slots, "
        f"`table[pos // 16] * 16 + pos % 16`: **{slots_}**.\n\n"
        f"The third new token is position {third}: it attends to **positions 0..{third}** "
        f"({third + 1} keys), the {cached} cached ones and the first three new ones, itself included, "
        f"and not to positions {third + 1}..{positions[-1]}, which come after it. Its causal-mask row "
        f"over the sequence's {cached + new} positions is True for the first {third + 1}."
    )
