"""The model runner's side of speculative decoding: verify a step's drafts, propose the next.

A request whose entry carries ``k`` drafts (``SchedulerOutput.spec_token_ids``) was fed its last
token and the drafts, so the forward pass left ``k + 1`` rows of logits for it. :meth:`verify`
turns them into the target's distributions (the same temperature, top-k, top-p and
``min_tokens`` rule the sampler applies, row by row) and applies the rejection rule
(:func:`minivllm.spec_decode.rejection.verify`); when every request of the step is greedy and the
verifier is minivllm's own, that rule is "keep each draft while it is its row's argmax"
(:func:`~minivllm.spec_decode.rejection.verify_greedy`, from :meth:`Sampler.greedy_tokens`), with no
distribution built. :meth:`propose` then drafts each request's next
step from its tokens as they will be once the scheduler has appended this step's: by n-gram
lookup or with the draft model.

Which requests speculate: every request that samples, except those that want log-probabilities
of their tokens (they decode one token per step; beam search asks for them). Parallel samples
(``n > 1``) speculate too: copy-on-write copies the draft model's blocks with the target's.
"""

from __future__ import annotations

import logging

import torch

from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.request import Request
from minivllm.sample.sampler import Sampler, unusable_rows
from minivllm.spec_decode.config import SpeculativeConfig
from minivllm.spec_decode.draft_model import DraftModelProposer, DraftRequest
from minivllm.spec_decode.ngram import propose_ngram
from minivllm.spec_decode.rejection import verify, verify_greedy

logger = logging.getLogger("minivllm")


class SpeculativeDecoder:
    def __init__(self, config: SpeculativeConfig, sampler: Sampler, max_model_len: int,
                 draft: DraftModelProposer | None = None, device_type: str = "cpu"):
        if (config.method == "draft_model") != (draft is not None):
            raise ValueError(f"speculative method {config.method!r} and draft model {draft!r} do not match")
        self.config = config
        self.sampler = sampler
        self.max_model_len = max_model_len
        self.draft = draft
        # the rejection rule, batched over a step's requests (speculative_config's verifier)
        self.verify_fn = config.verifier or verify
        self._draft_probs: dict[str, torch.Tensor] = {}  # request id -> q of its pending drafts
        self.batch_limit = config.batch_limit(device_type)  # no drafts in a step with more requests

    @staticmethod
    def speculates(request: Request) -> bool:
        return request.sampling_params.logprobs is None

    def begin_step(self, out: SchedulerOutput) -> None:
        """Forget what ended requests left, and the draft K/V of requests that start over."""
        for rid in out.finished_req_ids:
            self._draft_probs.pop(rid, None)
        if self.draft is not None:  # a preempted request comes back in other blocks
            self.draft.forget(out.finished_req_ids)
            self.draft.forget(r.request_id for r in out.preempted)
            self.draft.forget(r.request_id for r, c in zip(out.requests, out.num_computed, strict=True) if c == 0)

    # --- verification ------------------------------------------------------------------------
    def target_probs(self, logits: torch.Tensor, entries: list[tuple[Request, list[int]]]) -> torch.Tensor:
        """``[R, V]``: for each request, the distribution the sampler would draw its next tokens
        from, one row per position (row ``j`` is output token ``num_output_tokens + j``):
        :meth:`Sampler.probs`, the sampler's own rule."""
        return self.sampler.probs(logits, *_rows_of(entries))

    def random_numbers(self, probs: torch.Tensor, entries) -> tuple[torch.Tensor, torch.Tensor]:
        """One uniform and one row of ``Exp(1)`` noise per row, each request's from its
        :meth:`Sampler.generator` (seeded by its seed and output length); greedy rows need none."""
        num_rows = probs.shape[0]
        uniforms = torch.full((num_rows,), 0.5, device=probs.device)
        noise = torch.ones_like(probs)
        row = 0
        for req, drafts in entries:
            n = len(drafts) + 1
            if not req.sampling_params.greedy:
                gen = self.sampler.generator(req, probs.device)
                uniforms[row : row + n] = torch.rand(n, generator=gen, device=probs.device)
                noise[row : row + n].exponential_(generator=gen)
            row += n
        return uniforms, noise.clamp_(min=torch.finfo(noise.dtype).tiny)

    def verify(self, logits: torch.Tensor, entries: list[tuple[Request, list[int]]]
               ) -> tuple[dict[str, list[int]], dict[str, str]]:
        """``logits [R, V]`` (each entry's ``k + 1`` rows in order) -> request id -> the tokens it
        emits (accepted drafts, then one sampled token), and request id -> why it failed (a row
        with NaN or inf logits fails its request alone)."""
        logits = logits.float()
        failed: dict[str, str] = {}
        if not bool(torch.isfinite(logits).all()):
            bad = unusable_rows(logits).tolist()
            row, kept, keep_rows = 0, [], []
            for req, drafts in entries:
                n = len(drafts) + 1
                if any(bad[row : row + n]):
                    failed[req.request_id] = "the model produced non-finite logits (NaN or inf) for this request"
                else:
                    kept.append((req, drafts))
                    keep_rows.extend(range(row, row + n))
                row += n
            entries = kept
            logits = logits[torch.tensor(keep_rows, dtype=torch.long, device=logits.device)]
        if not entries:
            return {}, failed
        if self.verify_fn is verify and all(req.sampling_params.greedy for req, _ in entries):
            for req, _ in entries:  # a greedy draft's q is one-hot at the draft: not needed here
                self._draft_probs.pop(req.request_id, None)
            targets = self.sampler.greedy_tokens(logits, *_rows_of(entries)).tolist()  # the step's one read back
            emitted = verify_greedy(targets, [d for _, d in entries])
            return {req.request_id: toks for (req, _), toks in zip(entries, emitted, strict=True)}, failed
        probs = self.target_probs(logits, entries)
        draft_probs = self._pending_draft_probs(entries, probs)
        uniforms, noise = self.random_numbers(probs, entries)
        emitted = self.verify_fn(probs, [d for _, d in entries], draft_probs, uniforms, noise)
        return {req.request_id: toks for (req, _), toks in zip(entries, emitted, strict=True)}, failed

    def _pending_draft_probs(self, entries, probs: torch.Tensor) -> torch.Tensor | None:
        if self.draft is None:
            return None
        q = torch.zeros_like(probs)
        row = 0
        for req, drafts in entries:
            stored = self._draft_probs.pop(req.request_id, None)
            if stored is None or stored.shape[0] < len(drafts):
                raise RuntimeError(f"request {req.request_id!r} verifies drafts whose distribution was not kept")
            q[row : row + len(drafts)] = stored[: len(drafts)]
            row += len(drafts) + 1
        return q

    # --- proposals -----------------------------------------------------------------------------
    def propose(self, out: SchedulerOutput, emitted: dict[str, list[int]]) -> dict[str, list[int]]:
        """Drafts for the next step of every request in ``emitted`` (request id -> the tokens this
        step gives it) that speculates; none when more requests than ``batch_limit`` sampled. A
        draft model that fails proposes nothing this step: the requests go on without drafts
        (drafts only ever change speed, never the output)."""
        if self.batch_limit is not None and len(emitted) > self.batch_limit:
            return {}  # a batch this large gains less from drafts than they cost (SpeculativeConfig)
        wanted: list[DraftRequest] = []
        tables = dict(zip((r.request_id for r in out.requests), out.block_ids, strict=True))
        for req in out.requests:
            new = emitted.get(req.request_id)
            if new is None or not self.speculates(req):
                continue
            tokens = req.all_token_ids + new
            k = self.config.num_drafts(req.length_limit, self.max_model_len, len(tokens))
            if k:
                wanted.append(DraftRequest(req, tokens, tables[req.request_id], k))
        if not wanted:
            return {}
        if self.draft is None:
            cfg = self.config
            proposals = {
                it.request.request_id: propose_ngram(it.token_ids, it.num_drafts, cfg.prompt_lookup_max,
                                                     cfg.prompt_lookup_min)
                for it in wanted
            }
            return {rid: d for rid, d in proposals.items() if d}
        for it in wanted:  # the draft's K/V is right only up to the tokens the request keeps
            self.draft.rewind(it.request.request_id, len(it.token_ids) - 1)
        try:
            result = self.draft.propose(wanted)
        except Exception as err:  # noqa: BLE001 - drafts are optional; the output is unaffected
            logger.warning("the draft model failed (%s: %s); no drafts this step", type(err).__name__, err)
            self.draft.forget([it.request.request_id for it in wanted])
            return {}
        proposals = {}
        for rid, (tokens, q) in result.items():
            if tokens:
                proposals[rid] = tokens
                self._draft_probs[rid] = q
        return proposals


def _rows_of(entries: list[tuple[Request, list[int]]]) -> tuple[list[Request], list[int]]:
    """Each verification row's request and output offset: an entry with ``k`` drafts has
    ``k + 1`` rows, row ``j`` for its output token ``num_output_tokens + j``."""
    requests = [req for req, drafts in entries for _ in range(len(drafts) + 1)]
    offsets = [j for _, drafts in entries for j in range(len(drafts) + 1)]
    return requests, offsets
