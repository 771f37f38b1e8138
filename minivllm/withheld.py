"""minivllm's own parts, withheld from the code a course check is grading.

From exercise 02 on, a student writes a part of the engine -- the scheduler, the KV cache
manager, the attention backend, the step loop, the scheduling policy, the cost model, the
verifier -- and the check grades that part on its own. A part that hands the work to minivllm's
own implementation (subclasses it, builds one inside, calls its functions) would pass every case
without having been written. So while a check runs (:func:`withheld`, entered by
``minivllm.course.grading.run_case``), each of minivllm's implementations of the exercise's part
refuses to run *when the student's file is on the call stack* (:func:`check_available`, at the
part's entry points): the check's own reference runs, which reach the same code from minivllm's
and the course's frames, are unaffected, and so is every run outside a check (one context
variable read, nothing more).

Part names: ``"scheduler"`` (``SchedulerBase``, ``Scheduler``), ``"kv_cache"`` (``BlockPool``,
``KVCacheManager``), ``"attention"`` (the PyTorch and Triton backends and their functions),
``"decode_kernel"`` (the Triton decode kernel alone),
``"engine_core"`` (``EngineCore``), ``"scheduling_policy"`` (``FCFSPolicy``, ``PriorityPolicy``),
``"cost_model"`` (``CostModel``), ``"verifier"`` (``rejection.verify``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field


class WithheldPartError(RuntimeError):
    """The code being graded called minivllm's own implementation of the part it writes."""


@dataclass(frozen=True)
class _Withholding:
    parts: frozenset[str]
    files: frozenset[str]  # the graded code's source files
    calls: list[str] = field(default_factory=list)  # what it tried to call, for the report


_ACTIVE: ContextVar[_Withholding | None] = ContextVar("minivllm_withheld", default=None)


@contextmanager
def withheld(parts: Iterable[str], files: Iterable[str]) -> Iterator[list[str]]:
    """Withhold ``parts`` from code defined in ``files`` until the block ends; yields the list of
    refused calls (``"scheduler: Scheduler.__init__"``), which a grader reports."""
    state = _Withholding(frozenset(parts), frozenset(files))
    token = _ACTIVE.set(state)
    try:
        yield state.calls
    finally:
        _ACTIVE.reset(token)


def check_available(part: str, what: str, also: str | None = None, owner: object = None) -> None:
    """Called at the entry of minivllm's implementation ``what`` of ``part`` (and of ``also``, a
    narrower part it implements too): raises :class:`WithheldPartError` if one of them is
    withheld and the graded code is calling it -- its file is on the call stack, or ``owner``
    (the object a method runs on) is an instance of a class it defines, a subclass that hands
    the work on to minivllm's."""
    state = _ACTIVE.get()
    if state is None:
        return
    if part not in state.parts:
        if also is None or also not in state.parts:
            return
        part = also
    if owner is not None and _defined_in(type(owner), state.files) or _on_stack(state.files):
        state.calls.append(f"{part}: {what}")
        raise WithheldPartError(
            f"{what} is minivllm's own {part.replace('_', ' ')}, which this exercise writes: while its "
            "check runs, the code you hand in may not call it (write the part yourself)"
        )


def _on_stack(files: frozenset[str]) -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename in files:
            return True
        frame = frame.f_back
    return False


def _defined_in(cls: type, files: frozenset[str]) -> bool:
    return any(getattr(sys.modules.get(klass.__module__), "__file__", None) in files for klass in cls.__mro__)
