"""Count, on any machine, the places where a step would make the host wait for a GPU.

On a GPU the host runs ahead of the device: it queues kernels and goes on preparing the next
step. Anything that needs a value *on the host* (``.tolist()``, ``.item()``, ``int(t)``,
``.cpu()``), an op whose output shape depends on the data (``nonzero``, boolean-mask indexing,
``unique``), or a blocking copy from the host (``torch.tensor(data, device=...)``,
``t.to(device)`` without ``non_blocking=True``, indexing with a Python list) stops it until the
device has caught up. A step that does that many times leaves the GPU idle between kernels.

:class:`HostSyncCounter` is a ``TorchFunctionMode``: while it is active, every such call that
goes through torch is counted by name, whatever module makes it. It runs on the CPU as well,
where nothing actually waits: what it counts is what *would* wait on a device, so a test can
hold the engine to a budget without a GPU. ``scripts/gpu_check.sh`` checks the same steps on a
real GPU with ``torch.cuda.set_sync_debug_mode``.
"""

from __future__ import annotations

import sys
import weakref
from collections import Counter

import torch
from torch.overrides import TorchFunctionMode

from minivllm.transfer import HOST

# what a plain decode step may make the host wait for: the sampled tokens' one read back, and one
# spare (tests/engine/test_host_syncs.py on the CPU, test_gpu_device.py on a GPU)
DECODE_SYNC_BUDGET = 2

# reading a value back to the host
_READS = {"tolist", "item", "cpu", "numpy", "__int__", "__float__", "__bool__", "__index__"}
# output shape depends on the data
_DATA_SHAPED = {"nonzero", "argwhere", "masked_select", "unique", "unique_consecutive", "where"}
# data from the host, copied while the host waits
_FACTORIES = {"tensor", "as_tensor", "asarray"}
_COPIES = {"to", "cuda"}
_THIS_FILE = __file__.replace("\\", "/")


class HostSyncCounter(TorchFunctionMode):
    """``with HostSyncCounter() as syncs: ...``; then ``syncs.total``, ``syncs.calls`` (a
    ``Counter`` of what was counted, e.g. ``{"tolist": 1, "tensor(device)": 6}``) and
    ``syncs.sites`` (the same by ``file:line`` of the code that made the call).

    It plays the part of a machine with a device: a tensor made with ``device=HOST``
    (:data:`minivllm.transfer.HOST`) or without a device lives on the *host*, and so does
    whatever is computed from host tensors alone; reading those back costs nothing and is not
    counted. Every other tensor (the model's weights, anything made with another ``device=``,
    anything computed from one of those, anything moved with ``.to(device)``) is on the device.
    """

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()
        self.sites: Counter[str] = Counter()
        self._host: dict[int, weakref.ref] = {}

    @property
    def total(self) -> int:
        return sum(self.calls.values())

    def on_host(self, tensor: torch.Tensor) -> bool:
        ref = self._host.get(id(tensor))
        return ref is not None and ref() is tensor

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        inputs = _tensors(args) + _tensors(kwargs.values())
        from_host = bool(inputs) and all(self.on_host(t) for t in inputs)
        moves = name in _COPIES and _names_device(name, args, kwargs)
        kind = None if from_host and not moves else _kind(name, args, kwargs)
        if kind is not None:
            self.calls[kind] += 1
            self.sites[f"{kind} at {_call_site()}"] += 1
        result = func(*args, **kwargs)
        born_on_host = not inputs and kwargs.get("device", HOST) is HOST
        if (from_host and not moves) or born_on_host:
            for t in _tensors((result,)):
                self._host[id(t)] = weakref.ref(t)
        elif moves:
            for t in _tensors((result,)):
                self._host.pop(id(t), None)
        return result


def _kind(name: str, args: tuple, kwargs: dict) -> str | None:
    if name in _READS:
        return name
    if name in _DATA_SHAPED:
        if name == "where" and len(args) + len(kwargs) > 1:
            return None  # where(cond, a, b) keeps its shape; where(cond) is nonzero
        return name
    if name in ("__getitem__", "__setitem__", "index_put_") and len(args) > 1:
        if _has(args[1], lambda i: isinstance(i, torch.Tensor) and i.dtype == torch.bool):
            return "mask index"
        if _has(args[1], lambda i: isinstance(i, list)):
            return "list index"  # the list is copied to the device first
    if name == "repeat_interleave" and "output_size" not in kwargs and len(args) > 1 and isinstance(args[1], torch.Tensor):
        return "repeat_interleave(tensor)"
    if (name in _FACTORIES and kwargs.get("device", HOST) is not HOST
            and not isinstance(args[0] if args else None, torch.Tensor)):
        return f"{name}(device)"
    if name in _COPIES and not kwargs.get("non_blocking", False) and _names_device(name, args, kwargs):
        return f"{name}(device)"
    return None


def _has(index, test) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(test(i) for i in items)


def _names_device(name: str, args: tuple, kwargs: dict) -> bool:
    """Whether a ``.to`` / ``.cuda`` call moves data between memories (``t.to(dtype)`` does not)."""
    if name == "cuda" or "device" in kwargs:
        return True
    rest = args[1:]
    return bool(rest) and isinstance(rest[0], (str, torch.device, torch.Tensor))


def _tensors(values) -> list[torch.Tensor]:
    out = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out.extend(x for x in v if isinstance(x, torch.Tensor))
    return out


def _call_site() -> str:
    """The innermost frame of minivllm's own code (not this module's) as ``minivllm/...:line``,
    else the innermost frame outside torch (a test, a script) as ``file:line``."""
    frame, outside = sys._getframe(2), None
    while frame is not None:
        path = frame.f_code.co_filename.replace("\\", "/")
        if path == _THIS_FILE:
            pass
        elif "/minivllm/" in path:
            return f"{path[path.rindex('/minivllm/') + 1:]}:{frame.f_lineno}"
        elif outside is None and "/torch/" not in path:
            outside = f"{path.rsplit('/', 1)[-1]}:{frame.f_lineno}"
        frame = frame.f_back
    return outside or "?"


def step_kind(plan) -> str:
    """What a step computed, from its plan: ``"decode"`` (one new token per request),
    ``"prefill"`` (prompt tokens only), ``"mixed"`` (both), ``"speculative"`` (some request
    verifies drafts), ``"empty"``."""
    if plan.is_empty:
        return "empty"
    if plan.spec_token_ids:
        return "speculative"
    decodes = sum(1 for n in plan.num_new if n == 1)
    if decodes == len(plan.num_new):
        return "decode"
    return "prefill" if decodes == 0 else "mixed"


def count_step_syncs(llm, prompts: list, params, sites: dict[str, Counter] | None = None) -> dict[str, list[int]]:
    """Run ``prompts`` through an ``LLM`` whose core is in this process, one step at a time, and
    count each step's host syncs (the whole step: scheduling, the forward pass, sampling,
    committing, detokenizing). Returns step kind -> the count of each step of that kind; with
    ``sites``, also fills it with step kind -> where the syncs of its costliest step came from."""
    from minivllm.engine.core_client import local_core

    core = local_core(llm)
    kinds: list[str] = []
    remove = core.add_step_listener(lambda outputs: kinds.append(step_kind(outputs.plan)))
    engine = llm.engine
    counts: dict[str, list[int]] = {}
    try:
        for i, prompt in enumerate(prompts):
            engine.add_request(f"syncs-{i}", prompt, params)
        while engine.has_unfinished_requests():
            with HostSyncCounter() as syncs:
                engine.step()
            kind = kinds[-1]
            if sites is not None and syncs.total >= max(counts.get(kind, [-1])):
                sites[kind] = Counter(syncs.sites)
            counts.setdefault(kind, []).append(syncs.total)
    finally:
        remove()
    return counts
