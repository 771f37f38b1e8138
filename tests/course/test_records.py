"""The recorded figures a notebook falls back on come from the goals table of docs/benchmarks.md."""

from __future__ import annotations

import pytest

from minivllm.course.records import goal_rows

MADE_UP = """# Benchmarks

## The goals at a glance

| goal | measured | met? | section |
|---|---|---|---|
| fast beside vLLM | 2.0x (day 2) | yes | [a](#a) |
| small KV | 96 % | yes | [b](#b) |
| beside a competitor | 6x vLLM | yes | [d](#d) |
| tokens identical to vLLM's | 128/128 | yes | [c](#c) |

## Later
| goal about vLLM in another table | x | no | y |
"""


def test_only_the_rows_that_name_the_topic_and_only_the_goals_table():
    table = goal_rows("vLLM", MADE_UP).splitlines()
    assert table == [
        "| goal | measured | met? |",
        "| --- | --- | --- |",
        "| fast beside vLLM | 2.0x (day 2) | yes |",
        "| beside a competitor | 6x vLLM | yes |",
        "| tokens identical to vLLM's | 128/128 | yes |",
    ]


def test_no_table_or_no_match_is_an_error():
    with pytest.raises(ValueError, match="names 'TPU'"):
        goal_rows("TPU", MADE_UP)
    with pytest.raises(ValueError, match="goals at a glance"):
        goal_rows("vLLM", "# Benchmarks\n")


def test_the_course_records_a_comparison_with_vllm():
    rows = goal_rows("vLLM").splitlines()[2:]
    assert rows and all("vLLM" in "".join(row.split("|")[1:3]) for row in rows)
