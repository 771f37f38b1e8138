"""The description of one flat batch that attention needs, passed explicitly to every layer.

A step's batch is the concatenation of each scheduled sequence's *new* tokens (a whole prompt,
a prompt chunk, or one decode token). Nothing is padded. For sequence ``i``:

* its new tokens are rows ``query_start_loc[i] : query_start_loc[i + 1]`` of the flat batch;
* ``seq_lens[i]`` counts every token whose K/V will be in the cache after this step, so the
  tokens already cached before the step number ``seq_lens[i] - query_len_i`` (the *context*);
* ``block_tables[i, j]`` is the physical block that holds its logical block ``j``;
* ``slot_mapping[t] = block * block_size + offset`` is where token ``t``'s K/V is written
  (``-1``: do not write, used for padding tokens). Padding rows are always the *last* rows of
  their sequence (static batching pads a prompt at its end; an idle seat is a sequence of one
  padding row), so the positions a sequence has written are a prefix, ``readable_lens()`` long.

The new tokens of a sequence occupy its last ``query_len`` positions, so new token ``j``
(0-based) sits at position ``seq_len - query_len + j`` and attends to positions ``<=`` that.

The lengths also travel as plain Python lists (``query_lens_cpu``, ``seq_lens_cpu``): a backend
that plans its work per sequence (which rows are decodes, how long each context is) reads them
on the host, instead of copying ``seq_lens`` back from the GPU, which would stall the device.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from minivllm.transfer import flatten_table, to_device


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64, -1 = skip
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    seq_lens: torch.Tensor  # [num_seqs] int32
    block_tables: torch.Tensor  # [num_seqs, max_blocks_per_seq] int32 (unused entries: 0)
    max_query_len: int
    max_seq_len: int
    block_size: int
    # per-step values a backend derives once and reuses in every layer (e.g. masks)
    backend_cache: dict = field(default_factory=dict, repr=False, compare=False)
    # Host-side copies (plain lists) of the per-sequence lengths; None when the metadata was
    # made from tensors only (a backend then reads them back once per step).
    query_lens_cpu: list[int] | None = None  # [num_seqs] new tokens per sequence
    seq_lens_cpu: list[int] | None = None  # [num_seqs] same values as seq_lens
    num_skipped_slots: int | None = None  # how many slot_mapping entries are -1 (padding)

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])

    def readable_lens(self) -> torch.Tensor:
        """``[num_seqs]`` int32, on the device: how many leading positions of each sequence hold
        K/V it wrote, i.e. ``seq_lens`` minus the sequence's padding rows. Those rows' slots are
        never written and may hold anything, yet they lie inside ``seq_len``: a backend that
        reads a sequence's positions for all its rows at once (one gather, one kernel tile)
        reads only these. Computed without a device-to-host copy, once per step."""
        cached = self.backend_cache.get("readable_lens")
        if cached is not None:
            return cached
        if self.num_skipped_slots == 0:
            readable = self.seq_lens
        else:
            num_tokens = self.slot_mapping.shape[0]
            device = self.slot_mapping.device
            starts = self.query_start_loc[1:].to(device)
            seq_of_token = torch.searchsorted(starts, torch.arange(num_tokens, device=device, dtype=starts.dtype),
                                              right=True)
            padding = torch.zeros(self.num_seqs, dtype=torch.int32, device=device)
            padding.index_add_(0, seq_of_token, (self.slot_mapping < 0).int())
            readable = self.seq_lens - padding.to(self.seq_lens.device)
        self.backend_cache["readable_lens"] = readable
        return readable

    @classmethod
    def build(
        cls,
        query_lens: list[int],
        seq_lens: list[int],
        block_tables: list[list[int]],
        slot_mapping: list[int],
        block_size: int,
        device: torch.device | str = "cpu",
    ) -> AttentionMetadata:
        """Build the tensors from plain lists (what the model runner has in hand), in one copy
        to ``device`` that does not block (:func:`minivllm.transfer.to_device`); the length
        lists are kept as they are for backends that plan on the host."""
        if not (len(query_lens) == len(seq_lens) == len(block_tables)):
            raise ValueError(
                f"query_lens ({len(query_lens)}), seq_lens ({len(seq_lens)}) and block_tables "
                f"({len(block_tables)}) must describe the same number of sequences"
            )
        starts = [0]
        for n in query_lens:
            starts.append(starts[-1] + n)
        # wide enough for every position read (padded static-batch rows can read past their
        # own blocks; those rows point at block 0 and their results are discarded)
        max_seq = max(seq_lens, default=0)
        width = max(max((len(t) for t in block_tables), default=0), -(-max_seq // block_size), 1)
        slots_t, starts_t, seq_lens_t, table = to_device(
            [(slot_mapping, torch.int64), (starts, torch.int32), (seq_lens, torch.int32),
             (flatten_table(block_tables, width), torch.int32)], device)
        return cls(
            slot_mapping=slots_t,
            query_start_loc=starts_t,
            seq_lens=seq_lens_t,
            block_tables=table.view(len(block_tables), width),
            max_query_len=max(query_lens, default=0),
            max_seq_len=max(seq_lens, default=0),
            block_size=block_size,
            query_lens_cpu=list(query_lens),
            seq_lens_cpu=list(seq_lens),
            num_skipped_slots=sum(1 for slot in slot_mapping if slot < 0),
        )
