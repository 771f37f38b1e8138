"""Scheduling policies: who is admitted first, and who is preempted when memory runs out.

A policy answers three questions for the scheduler (``minivllm.core.scheduler``):

* ``waiting_key(request)``: the order of the waiting queue (smallest key admitted first);
* ``choose_victim(running)``: which running request gives its KV blocks back when a running
  request cannot grow;
* ``may_preempt(incoming, victim)``: may a waiting request, that does not fit, take the place
  of a running one?

``"fcfs"`` (first come, first served; never preempts for an admission) and ``"priority"``
(lower ``Request.priority`` first, ties by arrival, as in vLLM; a more important arrival
preempts the least important running request, as vLLM V0 did: V1 lets no waiting request push
a running one out, and preempts only when a running request cannot grow) are built in; any object with these three methods and a
``name`` can be passed as ``scheduling_policy=`` to ``LLM`` or ``Simulator``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from minivllm.request import Request


@runtime_checkable
class SchedulingPolicy(Protocol):
    name: str

    def waiting_key(self, request: Request) -> tuple: ...

    def choose_victim(self, running: list[Request]) -> Request: ...

    def may_preempt(self, incoming: Request, victim: Request) -> bool: ...


class FCFSPolicy:
    """Arrival order. The newest running request is preempted first (it has done the least
    work), and a waiting request never pushes a running one out."""

    name = "fcfs"

    def waiting_key(self, request: Request) -> tuple:
        return (request.arrival_time,)

    def choose_victim(self, running: list[Request]) -> Request:
        return running[-1]

    def may_preempt(self, incoming: Request, victim: Request) -> bool:
        return False


class PriorityPolicy:
    """Lower ``priority`` value first (as in vLLM), ties broken by arrival time."""

    name = "priority"

    def waiting_key(self, request: Request) -> tuple:
        return (request.priority, request.arrival_time)

    def choose_victim(self, running: list[Request]) -> Request:
        return max(running, key=self.waiting_key)

    def may_preempt(self, incoming: Request, victim: Request) -> bool:
        return self.waiting_key(incoming) < self.waiting_key(victim)


POLICIES = {"fcfs": FCFSPolicy, "priority": PriorityPolicy}


def make_policy(policy) -> SchedulingPolicy:
    """A policy object from a name (``"fcfs"``, ``"priority"``) or a policy object."""
    if isinstance(policy, str):
        if policy not in POLICIES:
            raise ValueError(f"scheduling_policy={policy!r} is not one of {tuple(POLICIES)}")
        return POLICIES[policy]()
    from minivllm.core.interfaces import check_implements

    check_implements(policy, SchedulingPolicy, "scheduling_policy")
    return policy
