"""A decode step that a CUDA graph can capture: static inputs per batch-size bucket.

A captured graph replays the kernels it recorded, with the addresses and sizes it recorded. So
the forward it captures must take its inputs from buffers that never move, must have shapes that
do not depend on the step's data, and must not read anything back to the host (a read-back would
be recorded as nothing, and a host decision taken on it frozen). The engine's ordinary step
builds fresh tensors from the plan every time (``ModelRunner.prepare_inputs``), sized to the step,
with ``max_seq_len`` read off the plan: none of that can be captured.

:class:`GraphDecode` keeps, for each *bucket* of batch sizes (1, 2, 4, 8, then multiples of 8 up
to ``max_batch``, as vLLM pads), one set of device buffers: token ids, positions, cache slots,
sequence lengths, a block table as wide as ``max_model_len`` needs, and the
:class:`~minivllm.attention.AttentionMetadata` over them, with ``max_seq_len = max_model_len`` so
that the split-KV choice of the decode kernel is a constant of the bucket. A decode step of ``n``
sequences is copied into the smallest bucket ``>= n`` (outside the graph: one host-to-device copy,
then small device copies into the static slices); the rows past ``n`` are idle seats, as vLLM
pads them: token 0 at position 0, slot ``-1`` (never written), one token of context in block 0
(read, and thrown away). Then the forward runs on the bucket's buffers, eagerly, or, when
``capture`` is on (a CUDA device only), by replaying the graph captured for that bucket the first
time it was used. Its output rows ``:n`` are the step's hidden states.

Only the ``"triton"`` backend's decode path qualifies: its launch grid depends on shapes and on
``max_seq_len``, never on the data. ``tests/engine/test_graph_decode.py`` checks on the CPU, with
the kernels interpreted, that a bucket's forward is the same operators on the same shapes whatever
the contents, reads nothing back, and that running it again on the same buffers with new contents
equals a fresh run to the bit, with and without the 8-bit cache. The engine option
``cuda_graphs`` (off by default) hooks it into ``ModelRunner.forward``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minivllm.attention.metadata import AttentionMetadata
from minivllm.transfer import flatten_table, to_device


def batch_buckets(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 8 up to ``max_batch`` (which is always the last)."""
    sizes = [b for b in (1, 2, 4) if b < max_batch] + list(range(8, max_batch + 1, 8))
    if not sizes or sizes[-1] != max_batch:
        sizes.append(max_batch)
    return sorted(set(sizes))


@dataclass
class StaticInputs:
    """One bucket's device buffers and the metadata over them (never reallocated)."""

    size: int
    input_ids: torch.Tensor  # [B] int64
    positions: torch.Tensor  # [B] int64
    slot_mapping: torch.Tensor  # [B] int64
    seq_lens: torch.Tensor  # [B] int32
    block_tables: torch.Tensor  # [B, max_blocks] int32
    meta: AttentionMetadata
    hidden: torch.Tensor | None = None  # [B, hidden]: the forward's output (the graph's, once captured)
    graph: object | None = None  # torch.cuda.CUDAGraph, once captured


class GraphDecode:
    """``run(scheduler_output) -> hidden [n, hidden]``, or ``None`` for a step it does not take
    (not all decodes, speculative drafts, padding, more than ``max_batch`` sequences)."""

    def __init__(self, model, block_size: int, max_model_len: int, max_batch: int, capture: bool = False):
        backend = model.attention_backend
        if getattr(backend, "name", None) != "triton":
            raise ValueError(f"graph-ready decode needs the 'triton' attention backend, not "
                             f"{getattr(backend, 'name', type(backend).__name__)!r}")
        self.model = model
        self.device = model.lm_head.weight.device
        if capture and self.device.type != "cuda":
            raise ValueError(f"capturing CUDA graphs needs a CUDA device, the model is on {self.device}")
        self.capture = capture
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.max_blocks = -(-max_model_len // block_size)
        self.buckets = batch_buckets(max_batch)
        self.static = {b: self._allocate(b) for b in self.buckets}
        self.pool = None  # the graphs' shared memory pool (CUDA)

    def _allocate(self, size: int) -> StaticInputs:
        dev = self.device

        def zeros(*shape, dtype):
            return torch.zeros(*shape, dtype=dtype, device=dev)

        slots = torch.full((size,), -1, dtype=torch.long, device=dev)
        seq_lens = torch.ones(size, dtype=torch.int32, device=dev)
        tables = zeros(size, self.max_blocks, dtype=torch.int32)
        starts = torch.arange(size + 1, dtype=torch.int32, device=dev)
        meta = AttentionMetadata(
            slot_mapping=slots, query_start_loc=starts, seq_lens=seq_lens, block_tables=tables,
            max_query_len=1, max_seq_len=self.max_model_len, block_size=self.block_size,
            query_lens_cpu=[1] * size, seq_lens_cpu=None, num_skipped_slots=None,
        )
        return StaticInputs(size, zeros(size, dtype=torch.long), zeros(size, dtype=torch.long), slots, seq_lens,
                            tables, meta)

    def bucket(self, n: int) -> int | None:
        return next((b for b in self.buckets if b >= n), None)

    def takes(self, out) -> bool:
        """A plain decode step that fits a bucket."""
        n = len(out.requests)
        return (0 < n <= self.buckets[-1] and not out.num_padding and not out.spec_token_ids
                and all(k == 1 for k in out.num_new)
                and all(len(ids) <= self.max_blocks for ids in out.block_ids))

    def fill(self, out) -> StaticInputs:
        """Copy the step's decode rows into its bucket's buffers (rows past ``n``: idle seats)."""
        bs = self.block_size
        n = len(out.requests)
        st = self.static[self.bucket(n)]
        ids, pos, slots, lens = [], [], [], []
        for req, start, table in zip(out.requests, out.num_computed, out.block_ids, strict=True):
            ids.append(req.all_token_ids[start])
            pos.append(start)
            slots.append(table[start // bs] * bs + start % bs)
            lens.append(start + 1)
        width = max(len(t) for t in out.block_ids)
        (flat,) = to_device([(ids + pos + slots + lens + flatten_table(out.block_ids, width), torch.long)],
                            self.device)
        st.input_ids[:n].copy_(flat[:n])
        st.positions[:n].copy_(flat[n : 2 * n])
        st.slot_mapping[:n].copy_(flat[2 * n : 3 * n])
        st.seq_lens[:n].copy_(flat[3 * n : 4 * n])
        st.block_tables[:n, :width].copy_(flat[4 * n :].view(n, width))
        if n < st.size:  # idle seats: nothing written, one position of block 0 read
            st.input_ids[n:].zero_()
            st.positions[n:].zero_()
            st.slot_mapping[n:].fill_(-1)
            st.seq_lens[n:].fill_(1)
            st.block_tables[n:, 0].zero_()
        return st

    def forward(self, st: StaticInputs) -> torch.Tensor:
        """The model on the bucket's buffers: eager, or the bucket's graph replayed (captured on
        its first use)."""
        st.meta.backend_cache.clear()
        if not self.capture:
            st.hidden = self.model(st.input_ids, st.positions, st.meta)
            return st.hidden
        if st.graph is None:
            self._capture(st)
        st.graph.replay()
        return st.hidden

    def _capture(self, st: StaticInputs) -> None:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm up: Triton compiles, the allocator settles
            for _ in range(2):
                self.model(st.input_ids, st.positions, st.meta)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            st.hidden = self.model(st.input_ids, st.positions, st.meta)
        self.pool = graph.pool()
        st.graph = graph

    @torch.inference_mode()
    def run(self, out) -> torch.Tensor | None:
        if not self.takes(out):
            return None
        n = len(out.requests)
        return self.forward(self.fill(out))[:n]
