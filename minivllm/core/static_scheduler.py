"""The naive baseline: static batching (what a server without iteration-level scheduling does).

Take up to ``B`` waiting requests, pad every prompt to the batch's longest prompt, prefill them
together, then decode all of them in lock step until the *last* one finishes. A request that
finishes early keeps its seat: its slot is computed every step (a thrown-away token) until the
batch ends. Only then is the next batch formed. Nothing here is estimated: the padding tokens
and the idle slots are real rows of the real forward pass, so their cost shows up in measured
time.

Each admitted request reserves KV room for its worst case (prompt + ``max_tokens``, capped at
``max_model_len``), as a static server must, so it never needs preemption.
"""

from __future__ import annotations

from minivllm.core.messages import RequestDelta
from minivllm.core.scheduler import SchedulerBase, SchedulerConfig, SchedulerOutput
from minivllm.request import Request, RequestStatus


class StaticBatchScheduler(SchedulerBase):
    """The scheduler protocol over static batches; ``max_num_seqs`` is the static batch size
    ``B``. The token budget is ignored: a static server prefills the whole padded batch at once.
    It cannot fork requests (it is no ``ForkingScheduler``: parallel sampling runs its ``n``
    samples as separate requests, and beam search is refused)."""

    def __init__(self, config: SchedulerConfig, kv_cache_manager):
        super().__init__(config, kv_cache_manager)
        if self.policy.name != "fcfs":
            raise ValueError("the static batching baseline supports only scheduling_policy='fcfs'")
        self.batch: list[Request] = []  # current batch, finished members included
        self.num_batches = 0

    def has_unfinished_requests(self) -> bool:
        return any(not r.is_finished for r in self.batch) or self.num_waiting > 0

    def _worst_case_tokens(self, req: Request) -> int:
        return min(req.num_tokens + req.max_tokens, self.config.max_model_len)

    def _form_batch(self) -> list[Request]:
        self.batch = []
        while self.num_waiting and len(self.batch) < self.config.max_num_seqs:
            req = self._peek_waiting()
            extra = self._worst_case_tokens(req) - req.num_tokens
            if self.kv.allocate_slots(req, req.num_tokens, num_lookahead_tokens=extra) is None:
                if not self.batch:
                    raise RuntimeError(
                        f"request {req.request_id} needs KV room for {self._worst_case_tokens(req)} "
                        f"tokens and the cache cannot hold it even alone"
                    )
                break
            self._pop_waiting()
            req.status = RequestStatus.RUNNING
            self.batch.append(req)
        if self.batch:
            self.num_batches += 1
        return self.batch

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        out.finished_req_ids = self._take_ended_ids()
        block_ids = self.kv.get_block_ids
        if all(r.is_finished for r in self.batch):
            batch = self._form_batch()
            if not batch:
                return out
            longest = max(r.num_tokens for r in batch)
            for r in batch:
                pad = longest - r.num_tokens
                r.num_computed_tokens = r.num_tokens
                out.add(r, 0, r.num_tokens, block_ids(r.request_id), pad)
            self.running = list(batch)
            return out
        for r in self.batch:
            if r.is_finished:  # idle seat: one thrown-away row at the request's last position
                out.add(r, r.num_computed_tokens, 0, block_ids(r.request_id), 1)
            else:
                out.add(r, r.num_computed_tokens, 1, block_ids(r.request_id))
                r.num_computed_tokens += 1
        return out

    def update_from_output(self, plan: SchedulerOutput, new_token_ids: dict[str, list[int]]) -> list[RequestDelta]:
        deltas = super().update_from_output(plan, new_token_ids)
        self._end_batch_if_done()
        return deltas

    def finish_requests(self, request_ids, status):
        ended = super().finish_requests(request_ids, status)
        self._end_batch_if_done()
        return ended

    def _end_batch_if_done(self) -> None:
        if self.batch and all(r.is_finished for r in self.batch):
            for r in self.batch:  # the batch is over: now its seats and memory are free
                self.kv.free(r)
            self.batch = []

    def _release(self, req: Request) -> None:
        # Keep the finished request's blocks until its batch ends (its seat stays occupied);
        # they are freed by _end_batch_if_done. An aborted request that never got a seat has none.
        self.requests.pop(req.request_id, None)
        self._ended_ids.add(req.request_id)
        if req not in self.batch:
            self.kv.free(req)

    def live_requests(self) -> list[Request]:
        return self.batch
