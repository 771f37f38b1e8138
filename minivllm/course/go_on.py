"""Run All in a partial copy of the course: a cell that needs what the copy lacks says so, and
the notebook goes on.

The full course has a reference solution for every exercise (``solutions/``) and the
benchmark scripts some notebooks reuse (``benchmarks/``). A student's copy may hold
``notebooks/`` and ``exercises/`` alone. There, ``course.working(ex)`` cannot put a reference in
place of an exercise that does not pass yet, and ``course.load_benchmark`` finds no script. In
such a copy (and only there), every notebook cell runs inside a guard that catches three things
and turns them into one line of output instead of an error:

* ``NotImplementedError`` raised by a stub of ``exercises/`` (a part not written yet);
* :class:`CourseFileMissing` (a file of the full course this copy does not have);
* ``NameError`` once a cell has been cut short: a name the skipped cell would have defined.

Anything else is an error as usual. The guard is an IPython AST transformer: the cell's code is
wrapped in ``try``, and its last expression is still displayed.
"""

from __future__ import annotations

import ast
import traceback
from pathlib import Path

from minivllm.course.loader import CourseFileMissing, benchmarks_dir, course_root, has_solutions

__all__ = ["CourseFileMissing", "cut_short", "install", "partial_copy"]

_RESULT = "__minivllm_cell_result__"
_ERROR = "__minivllm_cell_error__"


class _Guard(ast.NodeTransformer):
    """``try: <cell>; result = <last expression>`` / ``except BaseException as e: result = None;
    cut_short(e)`` / ``result``: the cell as written, its failures judged by :func:`cut_short`."""

    def visit_Module(self, node: ast.Module) -> ast.Module:
        body = list(node.body)
        if not body:
            return node
        last = body[-1]
        shown = isinstance(last, ast.Expr)
        if shown:
            body[-1] = ast.Assign(targets=[ast.Name(_RESULT, ast.Store())], value=last.value)
        handler = ast.ExceptHandler(
            type=ast.Name("BaseException", ast.Load()), name=_ERROR,
            body=[ast.Assign(targets=[ast.Name(_RESULT, ast.Store())], value=ast.Constant(None)),
                  ast.Expr(ast.Call(func=ast.Attribute(
                      value=ast.Call(func=ast.Name("__import__", ast.Load()),
                                     args=[ast.Constant("minivllm.course.go_on")],
                                     keywords=[ast.keyword("fromlist", ast.Constant(("cut_short",)))]),
                      attr="cut_short", ctx=ast.Load()), args=[ast.Name(_ERROR, ast.Load())], keywords=[]))])
        guarded: list[ast.stmt] = [ast.Try(body=body, handlers=[handler], orelse=[], finalbody=[])]
        if shown:
            guarded.append(ast.Expr(ast.Name(_RESULT, ast.Load())))
        node.body = guarded
        return ast.fix_missing_locations(node)


_cells_cut_short = 0


def cut_short(error: BaseException) -> None:
    """Re-raise ``error`` unless it is one a partial copy of the course expects; then print why
    the rest of the cell did not run."""
    global _cells_cut_short
    reason = _reason(error)
    if reason is None:
        raise error
    _cells_cut_short += 1
    print(f"(the rest of this cell did not run: {reason})")


def _reason(error: BaseException) -> str | None:
    if isinstance(error, CourseFileMissing):
        return str(error)
    if isinstance(error, NotImplementedError) and _raised_by_a_stub(error):
        return (f"{_stub_name(error)} is not written yet, and this copy of the course has no "
                "reference solution to stand in for it")
    if isinstance(error, NameError) and _cells_cut_short:
        return f"{error.name or error} comes from a cell above that did not run to its end"
    return None


def _innermost_file(error: BaseException) -> Path | None:
    frames = traceback.extract_tb(error.__traceback__)
    return Path(frames[-1].filename) if frames else None


def _raised_by_a_stub(error: BaseException) -> bool:
    where = _innermost_file(error)
    return where is not None and where.parent.resolve() == (course_root() / "exercises").resolve()


def _stub_name(error: BaseException) -> str:
    tb = error.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    return f"{Path(code.co_filename).stem}'s `{code.co_qualname}`"


def partial_copy() -> bool:
    """Whether this copy of the course lacks the reference solutions or the benchmarks."""
    try:
        root = course_root()
    except FileNotFoundError:
        return False
    return not has_solutions(root) or benchmarks_dir(root) is None


def install() -> bool:
    """Guard every later cell of the running IPython kernel, once, in a partial copy of the
    course; do nothing elsewhere (outside IPython, or in the full course). Whether it is on."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None or not partial_copy():
        return False
    if not any(isinstance(t, _Guard) for t in shell.ast_transformers):
        shell.ast_transformers.append(_Guard())
        print("note: this copy of the course has no reference solutions or benchmarks/; a cell that "
              "needs one says so and the notebook goes on.")
    return True
