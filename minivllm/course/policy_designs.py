"""Other designs of notebook 09's ``ChatFirstPolicy``, which the notebook scores against the
check's bar after the exercise: two of them miss it, one clears it. They live here, not in a
cell, so that the notebook can show their code folded (a cell's code is never folded) and
nobody reading it meets a passing policy before writing their own."""

from __future__ import annotations


class ShortestBudgetFirst:
    # Queue by max_tokens (smallest first); victim: the largest budget; push-outs only across
    # the 2,048-token line, so never both ways.
    name = "shortest-budget-first"

    def waiting_key(self, r):
        budget = r.sampling_params.max_tokens
        return (r.priority, budget if budget is not None else float("inf"), r.arrival_time)

    def choose_victim(self, running):
        return max(running, key=self.waiting_key)

    def may_preempt(self, incoming, victim):
        def long(r):
            return r.sampling_params.max_tokens is None or r.sampling_params.max_tokens > 2048

        return (incoming.priority, long(incoming)) < (victim.priority, long(victim))


class QueueJumpOnly(ShortestBudgetFirst):
    # The same queue, but FCFS's victim (the newest) and no push-outs.
    name = "queue jump, FCFS victim"

    def choose_victim(self, running):
        return running[-1]

    def may_preempt(self, incoming, victim):
        return False


class NoPushOuts:
    # A policy's queue and victim (the reference's, in the notebook), but no push-outs (vLLM
    # V1's rule): a waiting request waits until a running one cannot grow and gives its blocks
    # back.
    name = "reference, no push-outs"

    def __init__(self, policy):
        self.policy = policy

    def waiting_key(self, r):
        return self.policy.waiting_key(r)

    def choose_victim(self, running):
        return self.policy.choose_victim(running)

    def may_preempt(self, incoming, victim):
        return False
