"""Which of minivllm's own functions each exercise writes again, and the rule that keeps them
out of sight until the exercise is done: build first, then compare.

A notebook builds the idea of a part (the protocol, a step walked by hand, the engine used as a
black box) and lets the student write it; only after the exercise's check cell may it show
minivllm's implementation beside the student's. :data:`ENGINE_PARTS` lists, per exercise, the
engine's functions and classes that implement what the exercise asks for, as
``"module:qualname"``. :func:`shown_too_early` finds a notebook's cells that show one of them
too early: before the check of its exercise in the exercise's own notebook, or anywhere in an
earlier notebook. A cell shows a part when

- its code asks for the part's source (``inspect.getsource(...)``, ``X??``, ``%psource X``,
  ``course.show_engine_code(...)``, or a helper of the notebook that calls ``getsource``), or
- its text (a markdown cell, or the stored output of a code cell) holds two consecutive
  significant lines of the part's source, compared without whitespace.

``tests/course/test_build_first.py`` runs it over every notebook. An exercise that comes to write
another part of the engine adds the part here.
"""

from __future__ import annotations

import ast
import html
import importlib
import inspect
import re
import textwrap
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache

ENGINE_PARTS: dict[str, tuple[str, ...]] = {
    "ex00_kv_memory": (
        "minivllm.sim.model_spec:ModelSpec.kv_bytes_per_token",
        "minivllm.sim.cost_model:CostModel.crossover_batch",
    ),
    "ex01_static_waste": ("minivllm.core.static_scheduler:StaticBatchScheduler.schedule",),
    "ex02_continuous": (
        "minivllm.core.scheduler:Scheduler.schedule",
        "minivllm.core.scheduler:Scheduler._schedule_waiting",
        "minivllm.core.scheduler:Scheduler.update_from_output",
        "minivllm.core.scheduler:Scheduler.finish_requests",
    ),
    "ex03_chunked_prefill": (
        "minivllm.core.scheduler:Scheduler._schedule_running",
        "minivllm.core.scheduler:Scheduler._make_room",
        "minivllm.core.scheduler:Scheduler._preempt",
    ),
    "ex04_block_allocator": (
        "minivllm.core.block_pool:BlockPool.get_new_blocks",
        "minivllm.core.block_pool:BlockPool.free_blocks",
        "minivllm.core.kv_cache_manager:KVCacheManager.allocate_slots",
        "minivllm.core.kv_cache_manager:KVCacheManager.free",
    ),
    "ex05_paged_attention_ref": (
        "minivllm.attention.cache_ops:write_kv_to_cache",
        "minivllm.attention.cache_ops:store_kv",
        "minivllm.attention.cache_ops:gather_blocks",
        "minivllm.attention.cache_ops:owned_slots",
        "minivllm.attention.cache_ops:gather_slots",
        "minivllm.attention.torch_padded:paged_attention_padded",
        "minivllm.attention.torch_ragged:plan_step",
        "minivllm.attention.torch_ragged:length_buckets",
        "minivllm.attention.torch_ragged:decode_attention",
        "minivllm.attention.torch_ragged:prefill_attention",
        "minivllm.attention.torch_ragged:paged_attention_ragged",
        "minivllm.attention.torch_ragged:TorchAttentionBackend.forward",
        "minivllm.attention.cpp_backend:CppAttentionBackend.forward",
    ),
    "ex06_triton_kernel": (
        "minivllm.attention.triton_decode:_paged_decode_kernel",
        "minivllm.attention.triton_decode:load_kv_block",
        "minivllm.attention.triton_decode:online_softmax_step",
        "minivllm.attention.triton_decode:_merge_splits_kernel",
    ),
    "ex07_prefix_cache": (
        "minivllm.core.block_pool:hash_block",
        "minivllm.core.kv_cache_manager:KVCacheManager.block_hashes",
        "minivllm.core.kv_cache_manager:KVCacheManager.get_computed_blocks",
        "minivllm.core.kv_cache_manager:KVCacheManager.allocate_slots",
        "minivllm.core.kv_cache_manager:KVCacheManager.fork",
        "minivllm.core.kv_cache_manager:KVCacheManager._shared_blocks_to_write",
        "minivllm.core.kv_cache_manager:KVCacheManager._copy_on_write",
        "minivllm.core.kv_cache_manager:KVCacheManager.commit_written_blocks",
    ),
    "ex08_engine_step": (
        "minivllm.core.engine_core:EngineCore.run_step",
        "minivllm.core.engine_core:EngineCore._fail_step",
        "minivllm.core.engine_core:EngineCore._fork_siblings",
        "minivllm.core.engine_core:_PlanCounts.__init__",
    ),
    "ex09_reasoning": (
        "minivllm.core.policies:FCFSPolicy",
        "minivllm.core.policies:PriorityPolicy",
    ),
    "ex10_costs": ("minivllm.sim.cost_model:CostModel.step_cost",),
    "ex11_spec_verify": ("minivllm.spec_decode.rejection:verify",),
}

MIN_LINE = 12  # characters (whitespace removed) for a source line to count as significant
_SOURCE_CALLS = {"getsource", "getsourcelines", "psource", "pfile", "show_engine_code"}


def resolve(part: str):
    """The object ``"module:qualname"`` names (a ``@triton.jit`` kernel as its Python function)."""
    module_name, _, qualname = part.partition(":")
    obj = importlib.import_module(module_name)
    for name in qualname.split("."):
        obj = getattr(obj, name)
    return getattr(obj, "fn", obj)  # triton.JITFunction keeps the Python function in .fn


@cache
def source_pairs(part: str) -> frozenset[tuple[str, str]]:
    """Every two consecutive significant lines of the part's body (its code, not its signature
    or docstring, which the protocol states anyway), whitespace removed."""
    lines = [_squeeze(line) for line in body_lines(part)]
    significant = [line for line in lines if _significant(line)]
    return frozenset(zip(significant, significant[1:]))


def body_lines(part: str) -> list[str]:
    """The lines of the part's source from its first statement after the docstring."""
    source = textwrap.dedent(inspect.getsource(resolve(part)))
    node = ast.parse(source).body[0]
    body = node.body
    if len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        body = body[1:]
    return source.splitlines()[body[0].lineno - 1 :]


def _squeeze(line: str) -> str:
    return re.sub(r"\s+", "", line)


def _significant(squeezed: str) -> bool:
    return len(squeezed) >= MIN_LINE and not squeezed.startswith("#") and re.search(r"\w", squeezed) is not None


# --- notebooks --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Violation:
    notebook: str
    cell: int
    exercise: str
    part: str
    how: str  # "asks for its source" or "holds its source"

    def __str__(self) -> str:
        return (f"{self.notebook} cell {self.cell} {self.how} {self.part} before {self.exercise}'s "
                "check: move it after the check, as a comparison")


def check_cell(cells: list[Mapping]) -> int | None:
    """Index of a notebook's check cell (the first code cell that calls ``course.check``)."""
    for i, cell in enumerate(cells):
        if cell["cell_type"] == "code" and "course.check(" in _text(cell["source"]):
            return i
    return None


def shown_too_early(notebooks: Mapping[str, list[Mapping]], exercise_notebook: Mapping[str, str]) -> list[Violation]:
    """Every cell that shows an exercise's engine part before that exercise's check.

    ``notebooks``: ``{file name: cells}`` (nbformat cells, or dicts with ``cell_type``,
    ``source`` and ``outputs``), in course order. ``exercise_notebook``: ``{exercise: file
    name of its notebook}``."""
    order = list(notebooks)
    found = []
    for exercise, home in exercise_notebook.items():
        if home not in notebooks:
            continue
        parts = ENGINE_PARTS.get(exercise, ())
        for name in order[: order.index(home) + 1]:
            cells = notebooks[name]
            end = len(cells)
            if name == home:
                end = check_cell(cells)
                if end is None:
                    continue
            found += _violations(name, cells[:end], exercise, parts)
    return found


def _violations(name: str, cells: list[Mapping], exercise: str, parts: Iterable[str]) -> list[Violation]:
    helpers = _source_helpers(cells)
    out = []
    for i, cell in enumerate(cells):
        asked = _source_requests(_text(cell["source"]), helpers) if cell["cell_type"] == "code" else []
        texts = [_text(cell["source"])] if cell["cell_type"] == "markdown" else _output_texts(cell)
        for part in parts:
            if any(_names(request, part) for request in asked):
                out.append(Violation(name, i, exercise, part, "asks for the source of"))
            elif any(_holds(text, part) for text in texts):
                out.append(Violation(name, i, exercise, part, "holds the source of"))
    return out


def _holds(text: str, part: str) -> bool:
    lines = [squeezed for squeezed in map(_squeeze, text.splitlines()) if squeezed]
    pairs = source_pairs(part)
    return any(pair in pairs for pair in zip(lines, lines[1:]))


def _names(request: str, part: str) -> bool:
    """Whether the expression ``request`` (``Scheduler.schedule``, ``type(runner).execute``,
    ``cache_ops.store_kv``) may name ``part``: the same last name, and the same class unless
    the class cannot be read from the text."""
    qualname = part.partition(":")[2].split(".")
    pieces = request.replace(" ", "").split(".")
    if pieces[-1] != qualname[-1]:
        return False
    if len(qualname) == 1 or len(pieces) == 1:
        return True
    owner = pieces[-2]
    return owner == qualname[-2] or not owner.isidentifier()


def _source_helpers(cells: list[Mapping]) -> set[str]:
    """Names of the functions the notebook defines that call ``getsource``."""
    names = set()
    for cell in cells:
        if cell["cell_type"] != "code":
            continue
        tree = _parse(_text(cell["source"]))
        for node in ast.walk(tree) if tree else ():
            if isinstance(node, ast.FunctionDef) and any(
                isinstance(n, ast.Call) and _call_name(n) in _SOURCE_CALLS for n in ast.walk(node)
            ):
                names.add(node.name)
    return names


def _source_requests(code: str, helpers: set[str]) -> list[str]:
    """The expressions whose source the cell asks for."""
    requests = [m.group(1) for m in re.finditer(r"^\s*([\w.()]+)\s*\?\?\s*$", code, re.M)]
    requests += [m.group(1) for m in re.finditer(r"^\s*%(?:psource|pfile)\s+([\w.]+)", code, re.M)]
    tree = _parse(code)
    for node in ast.walk(tree) if tree else ():
        if isinstance(node, ast.Call) and node.args and (_call_name(node) in _SOURCE_CALLS | helpers):
            for arg in node.args if _call_name(node) == "show_engine_code" else node.args[:1]:
                if isinstance(arg, ast.Call) and _call_name(arg) == "getattr" and arg.args:
                    arg = arg.args[0]  # getattr(kernel, "fn", kernel)
                requests.append(ast.unparse(arg))
    return requests


def _call_name(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _parse(code: str) -> ast.Module | None:
    """The cell's code without its IPython lines (magics, shell escapes, ``X??``)."""
    python = "\n".join("" if re.match(r"^\s*[%!]|.*\?\?\s*$", line) else line for line in code.splitlines())
    try:
        return ast.parse(python)
    except SyntaxError:
        return None


def _output_texts(cell: Mapping) -> list[str]:
    texts = []
    for output in cell.get("outputs", ()):
        if "text" in output:
            texts.append(_text(output["text"]))
        for mime, value in output.get("data", {}).items():
            if mime.startswith("text/"):
                texts.append(html.unescape(re.sub(r"<[^>]+>", "", _text(value))))  # HTML: tags out
    return texts


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def shown_open(name: str, cells: list[Mapping], exercise: str) -> list[str]:
    """Where the notebook ``name`` shows one of ``exercise``'s parts unfolded: a cell that asks
    for its source other than through ``course.show_engine_code`` (which shows it folded) and
    does not store only folded outputs, or a stored output, not folded, that holds it. After the check a notebook compares minivllm's part
    with the student's, but a reader on GitHub sees the stored outputs first, so the part stays
    behind a click (``tests/course/test_folded_answers.py``)."""
    from minivllm.course.display import is_folded

    plain = []
    for cell in cells:
        if cell["cell_type"] != "code":
            plain.append({"cell_type": "raw", "source": ""})  # markdown: see shown_too_early
            continue
        outputs = [o for o in cell.get("outputs", ()) if not is_folded(o.get("data", {}))]
        if cell.get("outputs") and not outputs:  # all it shows is folded
            plain.append({"cell_type": "raw", "source": ""})
            continue
        source = original = _text(cell["source"])
        tree = _parse(original)
        for node in ast.walk(tree) if tree else ():
            if isinstance(node, ast.Call) and _call_name(node) == "show_engine_code":
                source = source.replace(ast.get_source_segment(original, node) or "", "None")
        plain.append({"cell_type": "code", "source": source, "outputs": outputs})
    return [f"{v.notebook} cell {v.cell} {v.how} {v.part} unfolded: show it with course.show_engine_code"
            for v in _violations(name, plain, exercise, ENGINE_PARTS.get(exercise, ()))]
