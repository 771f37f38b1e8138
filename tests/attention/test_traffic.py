"""The traffic model of the Triton kernels (``minivllm/attention/traffic.py``), against counts
worked out by hand, and the chapter's §4.2 "~5 %" seen from the bytes."""

from __future__ import annotations

import pytest

from minivllm.attention import traffic
from minivllm.attention.triton_decode import choose_num_splits


def test_decode_bytes_by_hand():
    # 2 sequences of 40 and 17 tokens, 8 query heads over 2 KV heads, head_dim 64, fp16, blocks of 16
    (t,) = traffic.decode_traffic([40, 17], 8, 2, 64, block_size=16, dtype_bytes=2, num_splits=1)
    assert t.reads == {
        "queries": 2 * 2 * 4 * 64 * 2,  # (seq, KV head) programs x group x head_dim x 2 bytes
        "block table": 2 * (3 + 2) * 4,  # each KV head's program reads its sequence's entries
        "seq_lens": 2 * 2 * 4,
        "K/V rows": 2 * 2 * (40 + 17) * 64 * 2,  # K and V, every KV head, every position
    }
    assert t.writes == {"output": 2 * 8 * 64 * 2}
    assert t.seconds(traffic.H100_BANDWIDTH) == t.bytes / 3.35e12


def test_split_decode_writes_partials_the_merge_reads():
    launches = traffic.decode_traffic([4096], 32, 8, 128)
    splits = choose_num_splits(1, 8, 4096, 16)
    assert splits > 1 and [t.kernel for t in launches] == ["paged_decode (split)", "merge_splits"]
    decode, merge = launches
    assert decode.writes == merge.reads == {"split partials": 32 * splits * 128 * 4, "log-sum-exp": 32 * splits * 4}
    assert merge.writes == {"output": 32 * 128 * 2}


def test_int8_rows_and_cache_write():
    f16 = traffic.cache_write_traffic(10, 8, 128, dtype_bytes=2, num_skipped=2)
    i8 = traffic.cache_write_traffic(10, 8, 128, dtype_bytes=2, kv_int8=True, num_skipped=2)
    assert f16.reads == i8.reads == {"K/V rows": 2 * 8 * 8 * 128 * 2, "slots": 10 * 8}
    assert f16.writes["K/V rows"] == 2 * 8 * 8 * 128 * 2 and i8.writes["K/V rows"] == 2 * 8 * 8 * (128 + 4)
    (d,) = traffic.decode_traffic([64], 8, 8, 128, kv_int8=True, num_splits=1)
    assert d.reads["K/V rows"] == 2 * 8 * 64 * 132


def test_prefill_query_blocks_reread_the_context():
    from minivllm.attention.triton_prefill import BLOCK_M_TARGET

    # one KV head, group 1: query blocks of BLOCK_M_TARGET tokens; a 2-block prompt over 100 cached tokens
    q, ctx = 2 * BLOCK_M_TARGET, 100
    t = traffic.prefill_traffic([q], [ctx + q], 1, 1, 64, dtype_bytes=2)
    reach = [ctx + BLOCK_M_TARGET, ctx + q]
    assert t.reads["K/V rows"] == 2 * sum(reach) * 64 * 2
    assert t.reads["queries"] == t.writes["output"] == q * 64 * 2


@pytest.mark.parametrize("batch, context", [(1, 4096), (64, 4096), (8, 32768)])
def test_block_table_is_hundredths_of_a_percent(batch, context):
    """§4.2: the indirection's bytes are 4 per (block, KV head) against 16 x 128 x 2 x 2 of K/V."""
    launches = traffic.decode_step_traffic(batch, context, 32, 8, 128)
    decode = next(t for t in launches if t.kernel.startswith("paged_decode"))
    share = decode.fraction("block table")
    assert share == pytest.approx(4 / (2 * 16 * 128 * 2), rel=0.1)  # 0.049 %, less the queries and partials
    assert share < 0.001
    assert "| paged_decode" in traffic.table(launches)
