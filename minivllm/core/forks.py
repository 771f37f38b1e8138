"""Parallel sampling (``n > 1``): the siblings that wait for their leader's first token.

A request with ``n`` samples enters the engine core as a *leader* and ``n - 1`` *siblings*. Only
the leader is scheduled: it computes the prompt once. In the step that samples its first token
the executor draws a first token for each sibling from the same row of logits (the plan's
``forks`` names them), and the step loop then forks each sibling off the leader
(``ForkingScheduler.fork_request``): it shares the leader's blocks copy-on-write from then on.
Until that step a sibling is in no queue of the scheduler; it waits here.

:class:`PendingForks` is that waiting room's bookkeeping -- adding, finding and ending waiting
siblings -- kept by the forking scheduler (``Scheduler.forks``), which names them in the plan of
their leader's sampling step. Forking them then is the step loop's (``EngineCore.step``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from minivllm.request import Request, RequestStatus


class PendingForks:
    """``leader request id -> its siblings that have not forked off it yet``."""

    def __init__(self) -> None:
        self.waiting: dict[str, list[Request]] = {}

    def __bool__(self) -> bool:
        return bool(self.waiting)

    def __len__(self) -> int:
        """Siblings waiting, over every leader."""
        return sum(len(kids) for kids in self.waiting.values())

    def add(self, leader_id: str, siblings: Sequence[Request]) -> None:
        if siblings:
            self.waiting[leader_id] = list(siblings)

    def holds(self, request_id: str) -> bool:
        """Whether ``request_id`` names a waiting sibling."""
        return any(request_id == kid.request_id for kids in self.waiting.values() for kid in kids)

    def of(self, leader_id: str) -> list[Request]:
        return self.waiting.get(leader_id, [])

    def take(self, leader_id: str) -> list[Request]:
        """The leader's waiting siblings, which leave the waiting room (they fork now)."""
        return self.waiting.pop(leader_id, [])

    def discard(self, leader_id: str, sibling: Request) -> None:
        """``sibling`` no longer waits for ``leader_id`` (it forked); nothing if it did not."""
        kids = self.waiting.get(leader_id)
        if kids and sibling in kids:
            kids.remove(sibling)
            if not kids:
                del self.waiting[leader_id]

    def end(self, request_ids: Iterable[str], status: RequestStatus) -> list[Request]:
        """End the siblings of the leaders named in ``request_ids`` and the siblings named
        themselves, with ``status``; returns them (they are in no scheduler queue, so this is
        all there is to ending them)."""
        ids = set(request_ids)
        ended: list[Request] = []
        for leader_id in list(self.waiting):
            kids = self.waiting[leader_id]
            gone = kids if leader_id in ids else [k for k in kids if k.request_id in ids]
            if not gone:
                continue
            ended.extend(gone)
            left = [k for k in kids if k not in gone]
            if left:
                self.waiting[leader_id] = left
            else:
                del self.waiting[leader_id]
        for kid in ended:
            kid.status = status
        return ended
