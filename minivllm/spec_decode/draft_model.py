"""Drafts from a smaller model that shares the target's tokenizer.

The draft model keeps its own K/V cache, with the target's block tables: the same block ids,
the same slots, other tensors (its layers and heads are its own). So the scheduler's one block
table per request serves both models, and a block the scheduler frees is free for both.

For a request that has ``L`` tokens after a step, proposing ``k`` drafts takes ``k`` passes of the
draft model, each batched over every request that proposes:

1. the tokens whose draft K/V is missing (the whole prompt the first time; afterwards the one or
   two tokens the last verification added), ending with token ``L - 1``: its logits give ``d_1``;
2. ``d_1`` at position ``L``, which gives ``d_2``; and so on up to ``d_k``.

The last pass writes the draft's K/V at position ``L + k - 2``: those lookahead slots are
reserved by the scheduler (``SpeculativeConfig.num_lookahead_tokens``). K/V written for drafts
that the target then rejects is simply written again: :meth:`DraftModelProposer.rewind` forgets
it.

A greedy request takes the draft model's argmax (so ``q`` is one-hot); any other request samples
its drafts from the draft model's distribution with the request's temperature, top-k and top-p,
and that distribution ``q`` goes to the rejection rule with them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from minivllm.attention.metadata import AttentionMetadata
from minivllm.model.llama import LlamaFamilyModel
from minivllm.request import Request
from minivllm.sample.sampler import DRAFT_STREAM, Sampler
from minivllm.transfer import select_rows, to_device


@dataclass
class DraftRequest:
    """One request to propose for: its tokens after this step, its block table, how many drafts."""

    request: Request
    token_ids: list[int]
    block_ids: list[int]
    num_drafts: int


class DraftModelProposer:
    def __init__(self, model: LlamaFamilyModel, num_blocks: int, block_size: int, sampler: Sampler,
                 kv_cache_dtype: torch.dtype | None = None):
        self.model = model
        self.block_size = block_size
        self.sampler = sampler
        self.device = model.lm_head.weight.device
        self.kv_caches = model.allocate_kv_cache(num_blocks, block_size, dtype=kv_cache_dtype)
        self._num_valid: dict[str, int] = {}  # request id -> positions whose draft K/V is right

    def forget(self, request_ids) -> None:
        """Requests that ended (or start over after a preemption): their draft K/V is gone."""
        for rid in request_ids:
            self._num_valid.pop(rid, None)

    def rewind(self, request_id: str, num_tokens: int) -> None:
        """Only the first ``num_tokens`` positions of the request hold tokens it kept."""
        valid = self._num_valid.get(request_id)
        if valid is not None and valid > num_tokens:
            self._num_valid[request_id] = num_tokens

    @torch.inference_mode()
    def propose(self, items: list[DraftRequest]) -> dict[str, tuple[list[int], torch.Tensor]]:
        """Request id -> ``(drafts, q [len(drafts), V])`` for every item."""
        bs = self.block_size
        drafts: dict[str, list[int]] = {it.request.request_id: [] for it in items}
        probs: dict[str, list[torch.Tensor]] = {rid: [] for rid in drafts}
        active = [it for it in items if it.num_drafts > 0]
        step = 0
        while active:
            feeds, starts = [], []
            for it in active:
                rid, length = it.request.request_id, len(it.token_ids)
                if step == 0:  # the tokens whose draft K/V is missing, ending with token length - 1
                    start = min(self._num_valid.get(rid, 0), length - 1)
                    feeds.append(it.token_ids[start:])
                else:  # the draft the last pass made
                    start = length + step - 1
                    feeds.append([drafts[rid][-1]])
                starts.append(start)
            query_lens, seq_lens, tables, slots, input_ids, positions = [], [], [], [], [], []
            for it, feed, start in zip(active, feeds, starts, strict=True):
                input_ids.extend(feed)
                positions.extend(range(start, start + len(feed)))
                slots.extend(it.block_ids[p // bs] * bs + p % bs for p in range(start, start + len(feed)))
                query_lens.append(len(feed))
                seq_lens.append(start + len(feed))
                tables.append(it.block_ids)
            meta = AttentionMetadata.build(query_lens, seq_lens, tables, slots, bs, self.device)
            last_rows = [end - 1 for end in itertools.accumulate(query_lens)]
            ids_t, pos_t = to_device([(input_ids, torch.long), (positions, torch.long)], self.device)
            hidden = self.model(ids_t, pos_t, meta)
            logits = self.model.compute_logits(select_rows(hidden, last_rows)).float()
            requests = [it.request for it in active]
            # row i proposes output token number num_output_tokens + offsets[i] of its request
            offsets = [len(it.token_ids) - it.request.num_tokens + step for it in active]
            q = self.sampler.probs(logits, requests, offsets)
            tokens = self._draw(q, requests, step).tolist()
            still = []
            for i, it in enumerate(active):
                rid = it.request.request_id
                drafts[rid].append(tokens[i])
                probs[rid].append(q[i])
                self._num_valid[rid] = seq_lens[i]
                if len(drafts[rid]) < it.num_drafts:
                    still.append(it)
            active = still
            step += 1
        vocab = self.model.config.vocab_size
        return {
            rid: (d, torch.stack(probs[rid]) if d else torch.empty(0, vocab, device=self.device))
            for rid, d in drafts.items()
        }

    def _draw(self, q: torch.Tensor, requests: list[Request], step: int) -> torch.Tensor:
        """One token per row from ``q`` by the exponential race, with the sampler's noise from the
        draft stream (``draw`` = the draft's position)."""
        if all(r.sampling_params.greedy for r in requests):  # q is one-hot: its argmax is the draw
            return q.argmax(dim=-1)
        noise = self.sampler.exponential(q, requests, DRAFT_STREAM, draw=step)
        return (q / noise).argmax(dim=-1)
