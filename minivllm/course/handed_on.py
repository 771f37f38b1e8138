"""Refuse, before grading, a student's file that reaches minivllm's own version of the part it writes.

From exercise 02 on a student writes a part of the engine -- the scheduler, the KV cache manager,
the attention backend, the step loop, the scheduling policy, the cost model, the verifier -- and
the check grades that part. A file that hands the work on to minivllm's own implementation
(subclasses it, builds one inside, calls its functions, binds the exercise's name to it) would
pass every case without having been written. The engine itself knows nothing of grading: the
check reads the student's *source* before it runs anything, and refuses a file that names one of
the objects in :data:`OWN_IMPLEMENTATIONS` for its exercise -- by an import, through a module it
imported (``minivllm.core.scheduler.Scheduler``, ``getattr(module, "Scheduler")``), by a dynamic
import, or in a string handed to ``exec`` -- with a message that names the line.

This checks the work, not the student's honesty: code determined to reach minivllm's part can
always find a way the reading does not follow (the whole engine is on the student's disk, and so
are ``solutions/``). What it stops is the easy mistake, and the shortcut taken without thinking.

Reading a *constant* of one of those classes (``CostModel.flops_efficiency``, a default the
exercise shares with the engine) is not handing the work on, and is allowed.
"""

from __future__ import annotations

import ast
import importlib
import re
from dataclasses import dataclass
from functools import cache
from types import ModuleType

# exercise -> minivllm's own implementation of the part it writes, as "module:name"
OWN_IMPLEMENTATIONS: dict[str, tuple[str, ...]] = {
    "ex02_continuous": ("minivllm.core.scheduler:Scheduler",),
    "ex03_chunked_prefill": ("minivllm.core.scheduler:Scheduler",),
    "ex04_block_allocator": (
        "minivllm.core.kv_cache_manager:KVCacheManager",
        "minivllm.core.block_pool:BlockPool",
        "minivllm.core.block_pool:FreeBlockQueue",
    ),
    "ex05_paged_attention_ref": (
        "minivllm.attention:get_attention_backend",
        "minivllm.attention.torch_ragged:TorchAttentionBackend",
        "minivllm.attention.torch_ragged:paged_attention_ragged",
        "minivllm.attention.torch_ragged:decode_attention",
        "minivllm.attention.torch_ragged:prefill_attention",
        "minivllm.attention.torch_padded:PaddedTorchAttentionBackend",
        "minivllm.attention.torch_padded:paged_attention_padded",
        "minivllm.attention.cpp_backend:CppAttentionBackend",
        "minivllm.attention.cpp_backend:paged_attention_cpu",
        "minivllm.attention.triton_backend:TritonAttentionBackend",
        "minivllm.attention.triton_decode:paged_decode_attention",
        "minivllm.attention.triton_prefill:paged_prefill_attention",
        "minivllm.attention.cache_ops:gather_blocks",
        "minivllm.attention.cache_ops:gather_slots",
    ),
    "ex06_triton_kernel": (  # its backend may hand prompts to minivllm's own: decode is the exercise
        "minivllm.attention.triton_decode:paged_decode_attention",
        "minivllm.attention.triton_decode:_paged_decode_kernel",
        "minivllm.attention.triton_decode:_merge_splits_kernel",
        "minivllm.attention.triton_decode:load_kv_block",
        "minivllm.attention.triton_decode:online_softmax_step",
        "minivllm.attention.triton_backend:TritonAttentionBackend",
    ),
    "ex07_prefix_cache": (
        "minivllm.core.kv_cache_manager:KVCacheManager",
        "minivllm.core.block_pool:BlockPool",
        "minivllm.core.block_pool:hash_block",
    ),
    "ex08_engine_step": ("minivllm.core.engine_core:EngineCore",),
    "ex09_reasoning": (
        "minivllm.core.policies:FCFSPolicy",
        "minivllm.core.policies:PriorityPolicy",
        "minivllm.core.policies:make_policy",
    ),
    "ex10_costs": ("minivllm.sim.cost_model:CostModel", "minivllm.sim.simulator:Simulator"),
    "ex11_spec_verify": (
        "minivllm.spec_decode.rejection:verify",
        "minivllm.spec_decode.rejection:verify_greedy",
    ),
}

_IMPORTERS = {"import_module", "__import__"}


@dataclass(frozen=True)
class HandOff:
    """One place where the file reaches minivllm's own implementation of its part."""

    line: int
    code: str  # the source line, stripped
    target: str  # "minivllm.core.scheduler.Scheduler"
    import_code: str = ""  # the import that bound the name used here, when on another line

    def message(self, part: str) -> str:
        via = f" (imported by `{self.import_code}`)" if self.import_code else ""
        return (f"line {self.line}: `{self.code}` reaches {self.target}{via}, minivllm's own {part}: the part "
                "this exercise writes is yours to write, not to hand on (the check reads your file and "
                "refuses it before grading; remove the import and write the part)")


@cache
def _targets(exercise: str) -> dict[int, str]:
    """id(object) -> its dotted name, for the objects the exercise may not reach."""
    found = {}
    for spec in OWN_IMPLEMENTATIONS.get(exercise, ()):
        module_name, _, name = spec.partition(":")
        obj = getattr(importlib.import_module(module_name), name)
        found[id(obj)] = f"{module_name}.{name}"
        fn = getattr(obj, "fn", None)  # a @triton.jit kernel keeps its Python function in .fn
        if fn is not None:
            found[id(fn)] = f"{module_name}.{name}"
    return found


def _module_paths(exercise: str) -> set[str]:
    return {spec.partition(":")[0] for spec in OWN_IMPLEMENTATIONS.get(exercise, ())}


def part_name(exercise: str) -> str:
    """What the exercise writes, in words, for messages ("scheduler", "KV cache manager", ...)."""
    return {
        "ex02": "scheduler", "ex03": "scheduler", "ex04": "KV cache manager", "ex05": "attention backend",
        "ex06": "decode kernel", "ex07": "prefix-caching KV cache manager", "ex08": "step loop",
        "ex09": "scheduling policy", "ex10": "cost model", "ex11": "verifier",
    }.get(exercise[:4], "part")


def find_hand_offs(source: str, exercise: str) -> list[HandOff]:
    """Every place in ``source`` (a Python file of ``exercise``) that reaches one of
    :data:`OWN_IMPLEMENTATIONS`; empty for an exercise that writes no part of the engine."""
    targets = _targets(exercise)
    if not targets:
        return []
    tree = ast.parse(source)
    lines = source.splitlines()
    reader = _Reader(targets, _module_paths(exercise))
    reader.visit(tree)
    def code(n: int | None) -> str:
        return lines[n - 1].strip() if n and n <= len(lines) else ""

    return sorted((HandOff(n, code(n), t, code(i)) for n, t, i in reader.found), key=lambda h: (h.line, h.target))


def hand_offs_of(module: ModuleType) -> list[HandOff]:
    """:func:`find_hand_offs` for a loaded exercise module (its ``__file__`` and ``__exercise__``)."""
    exercise = getattr(module, "__exercise__", "")
    path = getattr(module, "__file__", None)
    if exercise not in OWN_IMPLEMENTATIONS or not path:
        return []
    with open(path, encoding="utf-8") as f:
        return find_hand_offs(f.read(), exercise)


class _Reader(ast.NodeVisitor):
    """Follows what each name of the file is bound to by imports (a module of minivllm, or an
    object of one) and reports every use that lands on a target."""

    def __init__(self, targets: dict[int, str], module_paths: set[str]):
        self.targets, self.module_paths = targets, module_paths
        self.bound: dict[str, object] = {}  # name -> the module or object an import bound it to
        self.imported_at: dict[str, int] = {}  # name -> the line of the import that bound it
        self.found: set[tuple[int, str, int | None]] = set()  # (line, target, line of its import)

    # --- binding names ---------------------------------------------------------------------
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if not alias.name.startswith("minivllm"):
                continue
            if alias.asname:
                self._bind(alias.asname, _import(alias.name), node)
            else:
                self.bound[alias.name.split(".")[0]] = _import(alias.name.split(".")[0])
                _import(alias.name)  # so that attribute chains through it resolve

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or not (node.module or "").startswith("minivllm"):
            return
        module = _import(node.module)
        for alias in node.names:
            if alias.name == "*":
                self._star(module, node)
                continue
            obj = getattr(module, alias.name, None)
            if obj is None:
                obj = _import(f"{node.module}.{alias.name}")
            self._bind(alias.asname or alias.name, obj, node, at_import=True)

    def _bind(self, name: str, obj: object, node: ast.AST, at_import: bool = False) -> None:
        if obj is None:
            return
        self.bound[name] = obj
        self.imported_at[name] = getattr(node, "lineno", 0)
        # a function imported is reached by its import; a class may be imported for its constants
        if at_import and id(obj) in self.targets and not isinstance(obj, type):
            self._report(node, obj)

    def _star(self, module: ModuleType | None, node: ast.AST) -> None:
        for value in vars(module or object()).values():
            if id(value) in self.targets:
                self._report(node, value)

    def visit_Assign(self, node: ast.Assign) -> None:
        module = self._dynamic_import(node.value)
        if module is not None:
            for target in node.targets:
                if isinstance(target, ast.Name):
                    self.bound[target.id] = module
        self.generic_visit(node)

    # --- uses ------------------------------------------------------------------------------
    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            self._check(node, self.bound.get(node.id), self.imported_at.get(node.id))

    def visit_Attribute(self, node: ast.Attribute) -> None:
        value = self._value_of(node)
        if value is not None:  # a chain through modules: resolved whole
            self._check(node, value)
            return
        base = self._value_of(node.value)
        if isinstance(base, type) and id(base) in self.targets and not callable(getattr(base, node.attr, None)):
            return  # a constant of the class (a shared default), not its work
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name == "getattr" and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
            base = self._value_of(node.args[0])
            if isinstance(base, ModuleType) and isinstance(node.args[1].value, str):
                self._check(node, getattr(base, node.args[1].value, None))
        module = self._dynamic_import(node)
        if module is not None and getattr(module, "__name__", "") in self.module_paths:
            self.found.add((node.lineno, f"{module.__name__} (imported by name)", None))
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        """Source handed to ``exec`` or ``compile``: a string that imports a target."""
        if isinstance(node.value, str) and "import" in node.value:
            for name in self.targets.values():
                module, _, obj = name.rpartition(".")
                if module in node.value and re.search(rf"\b{re.escape(obj)}\b", node.value):
                    self.found.add((node.lineno, name, None))

    # --- helpers ---------------------------------------------------------------------------
    def _value_of(self, node: ast.AST) -> object | None:
        """The module or object an expression made of bound names and attributes stands for."""
        if isinstance(node, ast.Name):
            return self.bound.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self._value_of(node.value)
            if isinstance(base, ModuleType):
                return getattr(base, node.attr, None)
        return None

    def _dynamic_import(self, node: ast.AST) -> ModuleType | None:
        if not isinstance(node, ast.Call) or not node.args or not isinstance(node.args[0], ast.Constant):
            return None
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        value = node.args[0].value
        if name in _IMPORTERS and isinstance(value, str) and value.startswith("minivllm"):
            return _import(value)
        return None

    def _check(self, node: ast.AST, obj: object | None, imported_at: int | None = None) -> None:
        if obj is not None and id(obj) in self.targets:
            self._report(node, obj, imported_at)

    def _report(self, node: ast.AST, obj: object, imported_at: int | None = None) -> None:
        line = getattr(node, "lineno", 0)
        self.found.add((line, self.targets[id(obj)], imported_at if imported_at != line else None))


def _import(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None
