"""Turn a :class:`SchedulerOutput` into one flat forward pass and sampled tokens.

For every scheduled request the runner appends its new tokens to one flat batch, with their
positions and the cache slot each token's K/V goes to (looked up in the request's block
table). It computes logits only for rows that sample (the last real token of each request
whose prompt is fully computed), not for every prompt token.
"""

from __future__ import annotations

import torch

from minivllm.attention.cache_ops import copy_blocks
from minivllm.attention.metadata import AttentionMetadata
from minivllm.core.scheduler import SchedulerOutput
from minivllm.engine.sampler import Sampler
from minivllm.model.llama import LlamaFamilyModel
from minivllm.request import Request


class ModelRunner:
    def __init__(
        self,
        model: LlamaFamilyModel,
        kv_cache_manager,
        sampler: Sampler,
        pad_token_id: int = 0,
        kv_cache_dtype: torch.dtype | None = None,
    ):
        self.model = model
        self.kv = kv_cache_manager
        self.sampler = sampler
        self.pad_token_id = pad_token_id
        self.device = model.lm_head.weight.device
        self.block_size = kv_cache_manager.block_size
        self.kv_caches = model.allocate_kv_cache(
            kv_cache_manager.num_blocks, self.block_size, dtype=kv_cache_dtype
        )

    def prepare_inputs(self, out: SchedulerOutput) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int]]:
        """Flat ``input_ids``, ``positions``, attention metadata, and the rows to sample."""
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_lens, seq_lens, tables, sample_rows = [], [], [], []
        for s in out.scheduled:
            req = s.request
            start, n, pad = s.num_computed, s.num_new, s.num_padding
            ids = self.kv.get_block_ids(req.request_id)
            row0 = len(input_ids)
            if n == 1 and not pad:  # decode: the common case, keep it cheap
                input_ids.append(req.all_token_ids[start])
                positions.append(start)
                slots.append(ids[start // bs] * bs + start % bs)
            else:
                input_ids.extend(req.all_token_ids[start : start + n])
                positions.extend(range(start, start + n + pad))
                slots.extend(ids[p // bs] * bs + p % bs for p in range(start, start + n))
                if pad:
                    input_ids.extend([self.pad_token_id] * pad)
                    slots.extend([-1] * pad)  # computed, never stored
            query_lens.append(n + pad)
            seq_lens.append(start + n + pad)
            tables.append(ids)
            if s.sample:
                sample_rows.append(row0 + n - 1)
        meta = AttentionMetadata.build(query_lens, seq_lens, tables, slots, bs, self.device)
        ids_t = torch.tensor(input_ids, dtype=torch.long, device=self.device)
        pos_t = torch.tensor(positions, dtype=torch.long, device=self.device)
        return ids_t, pos_t, meta, sample_rows

    @torch.inference_mode()
    def compute_logits(self, out: SchedulerOutput) -> tuple[list[Request], torch.Tensor | None]:
        """Copy-on-write copies, then the forward pass. Returns the requests that sample this
        step and their logits ``[num_sampling, vocab]`` (float32)."""
        if out.blocks_to_copy:
            copy_blocks(self.kv_caches, out.blocks_to_copy)
        if out.is_empty:
            return [], None
        input_ids, positions, meta, sample_rows = self.prepare_inputs(out)
        hidden = self.model(input_ids, positions, meta)
        sampling = [s.request for s in out.scheduled if s.sample]
        if not sampling:
            return [], None
        return sampling, self.model.compute_logits(hidden[sample_rows]).float()

    @torch.inference_mode()
    def execute(
        self, out: SchedulerOutput, fork_children: dict[str, list[Request]] | None = None
    ) -> dict[str, int]:
        """Run the step; return ``{request_id: sampled token}``.

        ``fork_children`` (parallel sampling): for a request id that samples this step, also
        draw one token for each listed child from the same logits row, each with the child's
        own settings and generator. The prompt is computed once for all of them.
        """
        sampling, logits = self.compute_logits(out)
        if not sampling:
            return {}
        if fork_children:
            rows, extra = [], []
            for i, req in enumerate(sampling):
                for child in fork_children.get(req.request_id, ()):
                    rows.append(i)
                    extra.append(child)
            if extra:
                logits = torch.cat([logits, logits[rows]])
                sampling = sampling + extra
        tokens = self.sampler(logits, sampling)
        return {r.request_id: t for r, t in zip(sampling, tokens, strict=True)}
