"""The executor that runs a step for real: one flat forward pass, then sampling.

For every scheduled request the runner appends its new tokens to one flat batch, with their
positions and the cache slot each token's K/V goes to (``block * block_size + offset``, looked
up in the block table that the :class:`~minivllm.core.scheduler_output.SchedulerOutput`
carries: the runner never asks the KV cache manager anything). It computes logits only for
rows that sample (the last real token of each request whose prompt is fully computed) and for
prompt rows whose log-probabilities were asked for, not for every prompt token.

A failure after the forward pass is attributed to its row where it can be: if sampling the
batch raises, each row is sampled alone and only the rows that still fail are reported in
``ModelRunnerOutput.failed``; a request whose log-probabilities cannot be computed fails alone
the same way. Only a failure nobody can attribute (the forward pass) fails the whole step.
"""

from __future__ import annotations

import torch

from minivllm.attention.cache_ops import copy_blocks
from minivllm.attention.metadata import AttentionMetadata
from minivllm.core.interfaces import ModelRunnerOutput
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.model.llama import LlamaFamilyModel
from minivllm.request import Request
from minivllm.sample.sampler import Sampler, compute_logprobs
from minivllm.spec_decode.decoder import SpeculativeDecoder
from minivllm.transfer import select_rows, to_device


class ModelRunner:
    """``execute(scheduler_output) -> ModelRunnerOutput`` over a model and its paged caches."""

    def __init__(
        self,
        model: LlamaFamilyModel,
        num_blocks: int,
        block_size: int,
        sampler: Sampler,
        pad_token_id: int = 0,
        kv_cache_dtype: torch.dtype | None = None,
        speculative: SpeculativeDecoder | None = None,
    ):
        self.model = model
        self.sampler = sampler
        self.pad_token_id = pad_token_id
        self.device = model.lm_head.weight.device
        self.block_size = block_size
        self.kv_caches = model.allocate_kv_cache(num_blocks, block_size, dtype=kv_cache_dtype)
        self.speculative = speculative
        self.graph_decode = None  # a GraphDecode (engine/graph_decode.py) that takes plain decode steps

    def prepare_inputs(
        self, out: SchedulerOutput
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int]]:
        """Flat ``input_ids [T]``, ``positions [T]``, attention metadata, and the row of each
        entry's last real token."""
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_lens, seq_lens, last_rows = [], [], []
        pads, spec = out.num_padding, out.spec_token_ids
        for req, start, n, ids in zip(out.requests, out.num_computed, out.num_new, out.block_ids, strict=True):
            pad = pads.get(req.request_id, 0) if pads else 0
            if n == 1 and not pad:  # decode: the common case, keep it cheap
                input_ids.append(req.all_token_ids[start])
                positions.append(start)
                slots.append(ids[start // bs] * bs + start % bs)
            else:
                if spec and req.request_id in spec:  # its last token, then the drafts it verifies
                    input_ids.append(req.all_token_ids[start])
                    input_ids.extend(spec[req.request_id])
                else:
                    input_ids.extend(req.all_token_ids[start : start + n])
                positions.extend(range(start, start + n + pad))
                slots.extend(ids[p // bs] * bs + p % bs for p in range(start, start + n))
                if pad:
                    input_ids.extend([self.pad_token_id] * pad)
                    slots.extend([-1] * pad)  # computed, never stored
            last_rows.append(len(input_ids) - pad - 1)
            query_lens.append(n + pad)
            seq_lens.append(start + n + pad)
        meta = AttentionMetadata.build(query_lens, seq_lens, out.block_ids, slots, bs, self.device)
        ids_t, pos_t = to_device([(input_ids, torch.long), (positions, torch.long)], self.device)
        return ids_t, pos_t, meta, last_rows

    @torch.inference_mode()
    def forward(self, out: SchedulerOutput) -> tuple[torch.Tensor, list[int]] | None:
        """Copy-on-write copies, then the forward pass. Returns ``(hidden [T, hidden], the last
        real row of each entry)``, or ``None`` for an empty step."""
        if out.blocks_to_copy:
            copy_blocks(self.kv_caches, out.blocks_to_copy)
            if self.speculative is not None and self.speculative.draft is not None:
                copy_blocks(self.speculative.draft.kv_caches, out.blocks_to_copy)
        if out.is_empty:
            return None
        if self.graph_decode is not None:
            hidden = self.graph_decode.run(out)
            if hidden is not None:
                return hidden, list(range(hidden.shape[0]))
        input_ids, positions, meta, last_rows = self.prepare_inputs(out)
        return self.model(input_ids, positions, meta), last_rows

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        """Run the step; sample a token for every request that samples (and for the siblings
        in ``out.forks``, each from its leader's row with its own settings)."""
        result = ModelRunnerOutput()
        if self.speculative is not None:
            self.speculative.begin_step(out)
        forward = self.forward(out)
        if forward is None:
            return result
        hidden, last_rows = forward
        self._prompt_logprobs(out, hidden, result)
        spec = out.spec_token_ids
        picked = [(row, req) for row, s, req in zip(last_rows, out.sample, out.requests, strict=True) if s]
        verifying = [(req, spec[req.request_id], row) for row, req in picked if req.request_id in spec] if spec else []
        if verifying:  # entries that verify drafts take k + 1 rows; the others sample one row
            picked = [(row, req) for row, req in picked if req.request_id not in spec]
        rows, sampling = [row for row, _ in picked], [req for _, req in picked]
        if rows:
            self._sample_rows(hidden, rows, sampling, out, result)
        if verifying:
            self._verify_drafts(hidden, verifying, result)
        if self.speculative is not None:
            result.draft_token_ids = self.speculative.propose(out, result.new_token_ids)
        return result

    def _sample_rows(self, hidden: torch.Tensor, rows: list[int], sampling: list[Request], out: SchedulerOutput,
                     result: ModelRunnerOutput) -> None:
        """One token for each of ``sampling`` from its row (and for the siblings in ``out.forks``,
        each from its leader's row with its own settings)."""
        logits = self.model.compute_logits(select_rows(hidden, rows)).float()
        if out.forks:  # parallel sampling: siblings draw from their leader's row
            extra_rows, extra = [], []
            for i, req in enumerate(sampling):
                for kid in out.forks.get(req.request_id, ()):
                    extra_rows.append(i)
                    extra.append(kid)
            if extra:
                logits = torch.cat([logits, logits[extra_rows]])
                sampling = sampling + extra
        tokens, failed = self._sample(logits, sampling)
        result.logprobs.update(self._sample_logprobs(logits, sampling, tokens, failed))
        for i, req in enumerate(sampling):
            if i in failed:
                result.failed[req.request_id] = failed[i]
            elif req.request_id not in result.failed:  # its prompt logprobs may have failed
                result.new_token_ids[req.request_id] = [tokens[i]]

    def _verify_drafts(self, hidden: torch.Tensor, verifying: list[tuple[Request, list[int], int]],
                       result: ModelRunnerOutput) -> None:
        """Speculative decoding: each entry's last ``k + 1`` rows verify its ``k`` drafts."""
        rows = [r for _, drafts, last in verifying for r in range(last - len(drafts), last + 1)]
        entries = [(req, drafts) for req, drafts, _ in verifying]
        try:
            logits = self.model.compute_logits(select_rows(hidden, rows))
            emitted, failed = self.speculative.verify(logits, entries)
        except Exception as err:  # noqa: BLE001 - these requests' own failure
            emitted, failed = {}, {req.request_id: _describe(err) for req, _ in entries}
        result.failed.update(failed)
        result.new_token_ids.update(emitted)

    def _sample(self, logits: torch.Tensor, sampling: list[Request]) -> tuple[list[int], dict[int, str]]:
        """The sampler over ``logits [N, V]``; if it raises, each row alone, so that the error
        stays with the rows that cause it."""
        try:
            return self.sampler(logits, sampling)
        except Exception as err:  # noqa: BLE001 - attributed below, row by row
            if len(sampling) == 1:
                return [-1], {0: _describe(err)}
        tokens, failed = [], {}
        for i in range(len(sampling)):
            try:
                row_tokens, row_failed = self.sampler(logits[i : i + 1], sampling[i : i + 1])
            except Exception as err:  # noqa: BLE001 - this row's own failure
                row_tokens, row_failed = [-1], {0: _describe(err)}
            tokens.append(row_tokens[0])
            if row_failed:
                failed[i] = row_failed[0]
        return tokens, failed

    @staticmethod
    def _sample_logprobs(logits, sampling: list[Request], tokens: list[int], failed: dict[int, str]) -> dict:
        """Request id -> log-probabilities of its sampled token, for the rows that asked; a row
        whose computation fails joins ``failed`` instead."""
        out: dict = {}
        want = [i for i, r in enumerate(sampling) if r.sampling_params.logprobs is not None and i not in failed]

        def compute(rows: list[int]) -> None:
            entries = compute_logprobs(
                logits[rows], [tokens[i] for i in rows], [sampling[i].sampling_params.logprobs for i in rows]
            )
            out.update((sampling[i].request_id, e) for i, e in zip(rows, entries, strict=True))

        if not want:
            return out
        try:
            compute(want)
        except Exception:  # noqa: BLE001 - attributed below, row by row
            for i in want:
                try:
                    compute([i])
                except Exception as err:  # noqa: BLE001 - this row's own failure
                    failed[i] = _describe(err)
        return out

    def _prompt_logprobs(self, out: SchedulerOutput, hidden: torch.Tensor, result: ModelRunnerOutput) -> None:
        """Log-probabilities of the prompt tokens this step computes, for the requests that
        asked (``prompt_logprobs``): row ``p`` predicts prompt token ``p + 1``."""
        row = 0
        pads = out.num_padding
        for req, start, n in zip(out.requests, out.num_computed, out.num_new, strict=True):
            k = req.sampling_params.prompt_logprobs
            num_prompt = req.num_prompt_tokens
            if k is not None and start < num_prompt - 1:
                stop = min(start + n, num_prompt - 1)  # the last prompt row predicts an output
                targets = req.all_token_ids[start + 1 : stop + 1]
                entries: list = [None] if start == 0 else []
                try:
                    logits = self.model.compute_logits(hidden[row : row + stop - start])
                    entries.extend(compute_logprobs(logits, targets, [k] * len(targets)))
                except Exception as err:  # noqa: BLE001 - this request's own failure
                    result.failed[req.request_id] = _describe(err)
                else:
                    result.prompt_logprobs[req.request_id] = (0 if start == 0 else start + 1, entries)
            elif k is not None and start == 0:
                result.prompt_logprobs[req.request_id] = (0, [None])
            row += n + (pads.get(req.request_id, 0) if pads else 0)


def _describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"
