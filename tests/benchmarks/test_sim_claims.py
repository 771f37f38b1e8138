"""``benchmarks/chapter_claims.py --quick`` runs as a script and prints a row for every claim."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "chapter_claims.py"

# (section, a phrase of the claim's paraphrase): one per claim the issue asks for, and more
EXPECTED = [
    ("2.1", "9 500"),  # the padding example
    ("2.2", "~15 % of an ideal"),  # static B=8 vs ideal batched decode
    ("3.3", "B_eff ~0.3 B"),
    ("2.2", "30,000-token outlier"),
    ("3", "Orca"),
    ("1, 8", "5-24x"),
    ("4.3", "~96 % paged"),
    ("1", "batch ~32"),
    ("4", "~1.2 MB of KV per token"),
    ("4", "~20 such max-length slots"),
    ("6", "~12 GB"),
    ("4.4", "~60 GB"),
    ("7", "~35 GB weights"),
    ("7", "2,000-5,000 tokens/s"),
    ("7", "0.1-0.5 ms"),
    ("7", "tokens per dollar"),
    ("6", "4-8 concurrent reasoning"),
    ("7", "30k-thinking-token query"),
    ("3.1", "chunked prefill"),
]


@pytest.fixture(scope="module")
def quick_output() -> str:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def table_rows(text: str) -> list[list[str]]:
    """Rows of the main claims table: from its header to the first blank line."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| § |"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    assert all(len(r) == 5 for r in rows), "a row does not have 5 cells (a '|' inside a cell?)"
    return rows


def test_command_line_is_printed(quick_output):
    assert quick_output.splitlines()[0] == "$ python benchmarks/chapter_claims.py --quick"


def test_every_claim_has_a_row_with_a_figure_and_a_verdict(quick_output):
    rows = table_rows(quick_output)
    for section, phrase in EXPECTED:
        match = [r for r in rows if r[0] == section and phrase in r[1]]
        assert len(match) == 1, f"no single row for §{section} '{phrase}'"
        _, _, ours, setup, verdict = match[0]
        assert any(ch.isdigit() for ch in ours), f"§{section} '{phrase}': no figure in {ours!r}"
        assert setup, f"§{section} '{phrase}': no setup"
        assert verdict.startswith(("**agree**", "**disagree**")), verdict
        if verdict.startswith("**disagree**"):
            assert len(verdict) > len("**disagree**: ") + 10, f"§{section}: a disagreement needs a reason"
    assert len(rows) == len(EXPECTED)


def test_numbers_that_do_not_depend_on_the_trace(quick_output):
    rows = {(r[0], r[1][:30]): r for r in table_rows(quick_output)}
    text = "\n".join(" ".join(r) for r in rows.values())
    assert "**12.6 %** useful" in text  # 9,577 / 76,000
    assert "**320 KiB/token**" in text  # Llama-3 70B GQA-8 in 16-bit
    assert "**4.9 GB** at int8" in text  # 30k tokens
    assert "**3,968 blocks** = 31 x 128" in text  # prefix sharing in the real KVCacheManager
